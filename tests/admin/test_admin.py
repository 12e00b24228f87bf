"""The operator admin: every page, every action, permissions, and pinned query counts."""

import re
from datetime import timedelta
from urllib.parse import urlencode

import pytest
from django.contrib.admin.utils import quote
from django.contrib.auth.models import Permission
from django.contrib.messages import get_messages
from django.urls import reverse
from django.utils import timezone

from agenttasks import lifecycle, store
from agenttasks.admin.base import ago, when
from agenttasks.flow import budgets
from agenttasks.models import Conversation, Event, File, PendingAction, Run, Task, Wakeup
from agenttasks.runtime.base import normalize_questions
from agenttasks.types import ActionRequest, NewTask, RunOutcome

from ..factories import (
    CommentFactory,
    ConversationFactory,
    FileFactory,
    RunFactory,
    TaskFactory,
    TaskResultFactory,
    UserFactory,
)

pytestmark = pytest.mark.django_db

# Pinned query counts for a superuser (session and user included), whatever the number of rows:
# task list: 8 (count, full count, rows with owner/run/parent joined, owner/agent/kind filters);
# task page: 14 for a task with a parent task and a delegate below it (the task with its joins,
# runs, actions, result, comments, files, wake-ups, events, the deciders of answered actions,
# one per ancestor level above the parent and one per level below);
# conversation list: 7 (event counts are a subquery); conversation page: 10.
CHANGELIST_QUERIES = 8
TASK_DETAIL_QUERIES = 14
CONVERSATION_LIST_QUERIES = 7
CONVERSATION_DETAIL_QUERIES = 10

VIEW = ("view_task", "view_conversation", "view_run", "view_pendingaction")


def staff(username, *codenames):
    """A staff user with exactly these agenttasks permissions."""
    user = UserFactory(username=username, is_staff=True)
    user.user_permissions.add(
        *Permission.objects.filter(content_type__app_label="agenttasks", codename__in=codenames)
    )
    return user


@pytest.fixture
def operator(client):
    client.force_login(
        staff("operator", *VIEW, "cancel_task", "retry_task", "change_pendingaction")
    )
    return client


@pytest.fixture
def viewer(client):
    client.force_login(staff("viewer", *VIEW))
    return client


def url(name, *args):
    return reverse(f"admin:agenttasks_{name}", args=[quote(a) for a in args])


def said(response) -> list[str]:
    """The messages a response added; they are dropped so the next request starts clean."""
    response.client.cookies.pop("messages", None)
    return [str(m) for m in get_messages(response.wsgi_request)]


def started(user, agent="worker", text="do it", **kw) -> Task:
    """A task created through the lifecycle and claimed by a (pretend) worker."""
    task = lifecycle.create(owner=user, agent_id=agent, input=text, **kw)
    store.claim(task.run_id, worker="host:1")
    return Task.objects.get(pk=task.pk)


def paused(user, *requests: ActionRequest) -> Task:
    """A running task whose run asked for approvals or questions."""
    task = started(user)
    lifecycle.on_run_finished(
        task.conversation_id, RunOutcome(task.run_id, "input_required", actions=requests)
    )
    return Task.objects.get(pk=task.pk)


def approval(call="call-1") -> ActionRequest:
    return ActionRequest(
        kind="approval", tool_name="deploy", tool_call_id=call, args={"env": "prod"}
    )


def question() -> ActionRequest:
    questions = normalize_questions([{"question": "Which format?", "options": ["PDF", "HTML"]}])
    return ActionRequest(
        kind="question", tool_name="ask_user", tool_call_id="call-q", questions=questions
    )


def family(user):
    """chat → A (spawned) → B (spawned) → C (delegate); returns (chat, A, B, C)."""
    chat = ConversationFactory(owner=user, agent="default")
    a = TaskFactory(owner=user, parent_conversation=chat, status="running", label="alpha")
    b = TaskFactory(owner=user, parent_conversation=a.conversation, status="running", label="beta")
    c = TaskFactory(
        owner=user,
        parent_conversation=b.conversation,
        status="pending",
        kind="delegate",
        delegation_key="k1",
        label="gamma",
    )
    return chat, a, b, c


# --- the task changelist -----------------------------------------------------------------------


def test_changelist_shows_columns_badges_progress_and_parent(admin_client, admin_user, settings):
    settings.AGENTTASKS = {"DESCRIBE_STATE": {"job": "project.agents.describe_state"}}
    chat, a, b, _ = family(admin_user)
    Task.objects.filter(pk=b.pk).update(kind="job")
    Run.objects.filter(pk=b.run_id).update(progress={"step": 2, "of": 3, "name": "verify"})
    response = admin_client.get(url("task_changelist"))
    html = response.content.decode()
    assert response.status_code == 200
    assert '<span class="at-badge at-status-running">running</span>' in html
    assert "step 2/3 (verify)" in html
    # A's parent is a plain conversation; B's parent is task A.
    assert f'href="{url("conversation_change", chat.pk)}"' in html
    assert f'href="{url("task_change", a.pk)}"' in html
    for column in ("task", "status_badge", "progress", "updated", "duration"):
        assert f"column-{column}" in html
    assert url("task_overview") in html


@pytest.mark.parametrize(
    "query, expected",
    [
        ("status__exact=running", {"alpha", "beta"}),
        ("agent=worker", {"alpha", "beta", "gamma"}),
        ("kind=delegate", {"gamma"}),
        ("origin=top-level", {"solo"}),
        ("origin=spawned", {"alpha", "beta"}),
        ("origin=delegate", {"gamma"}),
        ("q=solo", {"solo"}),
        ("q=unique+words", {"solo"}),
    ],
)
def test_changelist_filters_and_search(admin_client, admin_user, query, expected):
    family(admin_user)
    solo = TaskFactory(owner=admin_user, agent="echo", label="solo", input="some unique words")
    response = admin_client.get(url("task_changelist") + "?" + query)
    assert response.status_code == 200
    shown = {t.label for t in response.context["cl"].result_list}
    assert shown == expected
    by_id = admin_client.get(url("task_changelist") + "?q=" + solo.pk)
    assert [t.pk for t in by_id.context["cl"].result_list] == [solo.pk]


def test_changelist_filters_by_owner_and_created(admin_client, admin_user):
    other = UserFactory(username="other")
    mine = TaskFactory(owner=admin_user, label="mine")
    TaskFactory(owner=other, label="theirs", created_at=timezone.now() - timedelta(days=40))
    response = admin_client.get(url("task_changelist") + f"?owner__id__exact={admin_user.pk}")
    assert [t.pk for t in response.context["cl"].result_list] == [mine.pk]
    since = urlencode({"created_at__gte": str(timezone.now() - timedelta(days=7))})
    response = admin_client.get(url("task_changelist") + "?" + since)
    assert [t.label for t in response.context["cl"].result_list] == ["mine"]


def test_changelist_query_count_is_pinned(admin_client, admin_user, django_assert_num_queries):
    family(admin_user)
    with django_assert_num_queries(CHANGELIST_QUERIES):
        admin_client.get(url("task_changelist"))
    for _ in range(3):
        family(admin_user)  # more rows, more parents: still the same queries
    with django_assert_num_queries(CHANGELIST_QUERIES):
        response = admin_client.get(url("task_changelist"))
    assert len(response.context["cl"].result_list) == 12


def test_a_task_updated_seconds_ago_was_updated_just_now(admin_client, admin_user):
    """Django's timesince says '0 minutes' under a minute: the list says 'just now'."""
    TaskFactory(owner=admin_user, label="fresh")
    old = TaskFactory(owner=admin_user, label="old")
    Task.objects.filter(pk=old.pk).update(updated_at=timezone.now() - timedelta(hours=3, seconds=5))
    html = admin_client.get(url("task_changelist")).content.decode()
    updated = re.findall(r'<td class="field-updated"><span title="[^"]+">([^<]*)</span>', html)
    # timesince puts a no-break space between the number and its unit.
    assert sorted(updated) == ["3\xa0hours ago", "just now"] and "0\xa0minutes" not in html


def test_ago_and_when_read_briefly(settings):
    settings.TIME_ZONE = "UTC"
    now = timezone.now().replace(month=12, day=4, hour=14, minute=3, second=21, microsecond=0)
    assert str(ago(now - timedelta(seconds=59), now)).endswith(">just now</span>")
    assert str(ago(now + timedelta(seconds=5), now)).endswith(">just now</span>")  # clock skew
    assert str(ago(now - timedelta(seconds=61), now)).endswith(">1\xa0minute ago</span>")
    assert str(ago(now - timedelta(days=2, hours=5), now)).endswith(">2\xa0days ago</span>")
    this_year = str(when(now, now))
    assert this_year.startswith('<time class="at-date" datetime="')
    assert f'title="{now.year}-12-04 14:03:21 UTC">Dec 4, 14:03:21</time>' in this_year
    last_year = str(when(now.replace(year=now.year - 1), now))
    assert f">Dec 4 {now.year - 1}, 14:03</time>" in last_year
    assert when(None) == ago(None) == "—"


def test_the_kind_filter_is_shown_only_with_two_kinds_or_more(admin_client, admin_user):
    """With one kind of task the filter would offer "All" alone (issue: a 'By kind' with only
    'All'); with two it lists the kinds there are, plain (no kind) included."""

    def kind_filter():
        response = admin_client.get(url("task_changelist"))
        shown = [f for f in response.context["cl"].filter_specs if f.title == "kind"]
        return response.content.decode(), [f for f in shown if f.has_output()]

    TaskFactory(owner=admin_user, label="plain one")
    html, shown = kind_filter()
    assert shown == [] and "By kind" not in html
    TaskFactory(owner=admin_user, label="a job", kind="job")
    html, (spec,) = kind_filter()
    assert "By kind" in html and spec.lookup_choices == [("", "plain"), ("job", "job")]
    assert "?kind=job" in html and "?kind=" in html
    plain = admin_client.get(url("task_changelist") + "?kind=")
    assert [t.label for t in plain.context["cl"].result_list] == ["plain one"]
    jobs = admin_client.get(url("task_changelist") + "?kind=job")
    assert [t.label for t in jobs.context["cl"].result_list] == ["a job"]


def test_viewing_needs_view_task(client):
    client.force_login(staff("nobody"))
    task = TaskFactory()
    assert client.get(url("task_changelist")).status_code == 403
    assert client.get(url("task_change", task.pk)).status_code == 403
    assert client.get(url("task_overview")).status_code == 403


def test_nothing_can_be_added_or_edited(admin_client, admin_user):
    task = started(admin_user)
    for model in ("task", "run", "event", "pendingaction", "wakeup", "taskresult", "comment"):
        assert admin_client.get(url(f"{model}_add")).status_code == 403, model
    assert admin_client.get(url("conversation_add")).status_code == 403
    run = admin_client.post(url("run_change", task.run_id), {"status": "failed"})
    assert run.status_code == 403
    assert Run.objects.get(pk=task.run_id).status == "running"
    assert admin_client.get(url("task_delete", task.pk)).status_code == 403
    assert admin_client.get(url("run_delete", task.run_id)).status_code == 403


# --- the task detail page ----------------------------------------------------------------------


def rich(user, *, events=3):
    """Task B of a family with runs, a result, comments, actions, files and a full timeline."""
    chat, a, b, c = family(user)
    conversation = b.conversation
    RunFactory(conversation=conversation, task=b, status="failed", error="first try failed")
    TaskResultFactory(task=b, usage={"inputTokens": 1, "outputTokens": 2, "totalTokens": 3})
    CommentFactory(task=b, content="please hurry", author=user)
    action = PendingAction.objects.create(
        conversation=conversation,
        run_id=b.run_id,
        task=b,
        kind="approval",
        tool_name="deploy",
        tool_call_id="call-9",
        args={"env": "prod"},
        status="approved",
        decided_by=user,
    )
    FileFactory(conversation=conversation, name="notes.txt")
    store.append_events(
        conversation.pk,
        [
            ("message.user", {"content": "hi", "origin": "input"}, b.run_id, b.pk),
            ("tool.call", {"toolCallId": "c1", "toolName": "search", "args": {"q": "x"}}, "", ""),
            (
                "tool.result",
                {"toolCallId": "c1", "toolName": "search", "content": "found", "isError": False},
                "",
                "",
            ),
            ("action.requested", {"action": action.as_payload()}, b.run_id, b.pk),
            (
                "action.resolved",
                {
                    "actionId": action.pk,
                    "kind": "approval",
                    "status": "approved",
                    "decidedBy": str(user.pk),
                },
                b.run_id,
                b.pk,
            ),
            ("task.progress", {"taskId": b.pk, "progress": "step 1/2", "state": {}}, "", b.pk),
            ("task.notification", {"content": "[task-notification] x", "taskIds": [c.pk]}, "", ""),
            (
                "callback.failed",
                {"taskId": b.pk, "status": "completed", "error": "refused", "durationMs": 5},
                "",
                b.pk,
            ),
            (
                "callback.delivered",
                {"taskId": b.pk, "status": "completed", "httpStatus": 204, "durationMs": 12},
                "",
                b.pk,
            ),
            ("run.started", {"trigger": "create", "attempt": 1}, b.run_id, b.pk),
            (
                "task.status",
                {
                    "taskId": c.pk,
                    "from": "pending",
                    "to": "running",
                    "runId": c.run_id,
                    "attempt": 1,
                },
                c.run_id,
                c.pk,
            ),
            (
                "message.assistant",
                {
                    "content": "all done",
                    "usage": {"inputTokens": 4, "outputTokens": 5, "totalTokens": 9},
                },
                b.run_id,
                b.pk,
            ),
            ("run.finished", {"status": "completed"}, b.run_id, b.pk),
            *[
                ("message.user", {"content": f"m{i}", "origin": "comment"}, "", "")
                for i in range(events)
            ],
        ],
    )
    return chat, a, b, c


def test_detail_shows_fields_runs_timeline_comments_result_and_tree(admin_client, admin_user):
    chat, a, b, c = rich(admin_user)
    response = admin_client.get(url("task_change", b.pk))
    html = response.content.decode()
    assert response.status_code == 200
    assert [t.name for t in response.templates][0] == "agenttasks/admin/task_detail.html"
    # fields
    assert b.pk in html and "beta" in html and "spawned" in html
    # runs: both, with the failed one's error, worker and usage columns
    assert "first try failed" in html and html.count(url("run_change", b.run_id)) >= 1
    # the timeline renders every type readably, JSON in <pre>
    for text in (
        "User message",
        "Tool call: search",
        "Tool result: search",
        "Approval requested: deploy",
        "Approval approved",
        f"by {admin_user}",
        "Progress",
        "Notification",
        "Callback failed (completed)",
        "Callback delivered (completed)",
        "HTTP 204",
        "Run started (create)",
        "Status pending → running",
        "all done",
        "in 4 · out 5 · total 9 tokens",
        "Run finished",
    ):
        assert text in html, text
    assert "&quot;q&quot;: &quot;x&quot;" in html  # tool args pretty-printed (escaped) in <pre>
    # comments and the result with usage
    assert "please hurry" in html and "in 1 · out 2 · total 3 tokens" in html
    # the tree: the parent chain and the delegate below, each a link with a badge
    tree = html[html.index('id="tree"') : html.index('id="tree"') + 4000]
    assert url("conversation_change", chat.pk) in tree
    assert url("task_change", a.pk) in tree and url("task_change", c.pk) in tree
    assert "delegated to" in tree
    assert "notes.txt" in html


def test_the_task_page_tables_scroll_and_show_dates_on_one_line(admin_client, admin_user, settings):
    """Issue: at 1280 pixels the Runs and Approvals tables overflowed their column and dates
    wrapped to four lines. Six columns each, in a sideways-scrolling box, dates 'Mar 7, 09:05:02'
    (the full timestamp in the title), the error of a run on a row of its own."""
    settings.TIME_ZONE = "UTC"
    _, _, b, _ = rich(admin_user)
    at = timezone.now().replace(month=3, day=7, hour=9, minute=5, second=2, microsecond=0)
    Run.objects.filter(task=b).update(
        started_at=at, heartbeat_at=at, ended_at=at + timedelta(seconds=90)
    )
    PendingAction.objects.filter(task=b).update(created_at=at, decided_at=at)
    html = admin_client.get(url("task_change", b.pk)).content.decode()
    runs = html[html.index('id="runs"') : html.index('id="actions"')]
    actions = html[html.index('id="actions"') : html.index('id="comments"')]
    for table in (runs, actions):
        assert '<div class="at-scroll">' in table and table.count("<th>") == 6
        assert f'title="{at.year}-03-07 09:05:02 UTC">Mar 7, 09:05:02</time>' in table
        assert "a.m." not in table and "p.m." not in table
    assert ">Mar 7, 09:06:32</time>" in runs and "1 min 30 s" in runs  # ended, and the duration
    assert '<td colspan="6"><div class="at-text"><strong>Error:</strong> first try failed' in runs
    assert "attempt 1 · initial" in runs and f"by {admin_user}" in actions
    assert url("run_change", b.run_id) in actions


def test_detail_query_count_is_pinned(admin_client, admin_user, django_assert_num_queries):
    _, _, small, _ = rich(admin_user, events=1)
    with django_assert_num_queries(TASK_DETAIL_QUERIES):
        admin_client.get(url("task_change", small.pk))
    _, _, big, _ = rich(admin_user, events=40)
    for _ in range(5):
        RunFactory(conversation=big.conversation, task=big, status="failed")
        CommentFactory(task=big)
    with django_assert_num_queries(TASK_DETAIL_QUERIES):
        response = admin_client.get(url("task_change", big.pk))
    assert response.status_code == 200


def test_detail_of_a_missing_task_redirects_like_the_admin(admin_client):
    response = admin_client.get(url("task_change", "task_missing"))
    assert response.status_code == 302
    assert "doesn’t exist" in said(response)[0]


def test_viewer_sees_no_buttons_and_cannot_act(viewer, admin_user):
    task = paused(admin_user, approval())
    html = viewer.get(url("task_change", task.pk)).content.decode()
    operations = html.split('id="operations">', 1)[1].split("</div>", 1)[0]
    assert "<button" not in operations and "Approve</button>" not in html
    assert "permission to answer" in html
    response = viewer.post(url("task_operate", task.pk), {"operation": "cancel_now"})
    assert response.status_code == 403
    action = PendingAction.objects.get(task=task)
    response = viewer.post(url("task_resolve", task.pk, action.pk), {"decision": "approve"})
    assert response.status_code == 403
    assert Task.objects.get(pk=task.pk).status == "waiting_for_input"


def test_buttons_follow_status_and_permissions(operator, admin_user):
    running = started(admin_user)
    html = operator.get(url("task_change", running.pk)).content.decode()
    assert "Cancel now" in html and "Cancel after this turn" in html and "Stop tree" in html
    assert ">Retry<" not in html
    failed = TaskFactory(owner=admin_user, status="failed")
    html = operator.get(url("task_change", failed.pk)).content.decode()
    assert ">Retry<" in html and "Cancel now" not in html


# --- actions from the detail page --------------------------------------------------------------


def test_cancel_now_button(operator, admin_user):
    task = started(admin_user)
    response = operator.post(url("task_operate", task.pk), {"operation": "cancel_now"})
    assert response.status_code == 302 and response.url == url("task_change", task.pk)
    assert said(response) == ["Cancel now: 1 cancelled."]
    done = Task.objects.get(pk=task.pk)
    assert (done.status, done.summary) == ("cancelled", "stopped")
    page = operator.get(url("task_change", task.pk)).content.decode()
    assert "Status running → cancelled" in page and "stopped" in page


def waiting(owner):
    later = timezone.now() + timedelta(hours=1)
    return store.create_task(NewTask(owner=owner, agent="echo", input="later", not_before=later))


def test_an_operator_sets_the_priority_of_a_waiting_task(operator, admin_user):
    task = waiting(admin_user)
    page = operator.get(url("task_change", task.pk)).content.decode()
    assert "Set priority</button>" in page and "Starts at" in page
    response = operator.post(url("task_priority", task.pk), {"priority": "9"})
    assert response.status_code == 302 and said(response) == ["Priority set to 9."]
    assert Task.objects.get(pk=task.pk).priority == 9
    response = operator.post(url("task_priority", task.pk), {"priority": "500"})
    assert said(response) == ["Not changed: priority must be an integer from -100 to 100."]
    assert Task.objects.get(pk=task.pk).priority == 9


def test_a_viewer_cannot_set_a_priority(viewer, admin_user):
    task = waiting(admin_user)
    assert "Set priority" not in viewer.get(url("task_change", task.pk)).content.decode()
    assert viewer.post(url("task_priority", task.pk), {"priority": "1"}).status_code == 403
    assert Task.objects.get(pk=task.pk).priority == 0


def test_cancel_now_on_a_finished_task_says_so(operator, admin_user):
    task = TaskFactory(owner=admin_user, status="completed")
    response = operator.post(url("task_operate", task.pk), {"operation": "cancel_now"})
    assert said(response) == ["Cancel now: 1 already completed."]


def test_cancel_after_this_turn_button(operator, admin_user):
    task = started(admin_user)
    response = operator.post(url("task_operate", task.pk), {"operation": "cancel_after_turn"})
    assert said(response) == ["Cancel after this turn: 1 will stop after this turn."]
    assert Task.objects.get(pk=task.pk).status == "running"
    assert Run.objects.get(pk=task.run_id).stop_request == "after_turn"


def test_retry_button(operator, admin_user, recording_queue, django_capture_on_commit_callbacks):
    task = TaskFactory(owner=admin_user, status="failed", error="boom")
    with django_capture_on_commit_callbacks(execute=True):
        response = operator.post(url("task_operate", task.pk), {"operation": "retry"})
    assert said(response) == ["Retry: 1 retried (attempt 2)."]
    again = Task.objects.get(pk=task.pk)
    assert (again.status, again.attempt) == ("pending", 2)
    assert recording_queue.run_ids == [again.run_id]


def test_stop_tree_button(operator, admin_user):
    _, a, b, c = family(admin_user)
    response = operator.post(url("task_operate", a.pk), {"operation": "stop_tree"})
    assert said(response) == ["Stop tree: 1 cancelled; 2 descendant tasks stopped."]
    assert set(Task.objects.filter(pk__in=[a.pk, b.pk, c.pk]).values_list("status", flat=True)) == {
        "cancelled"
    }


def test_operate_refuses_get_unknown_operations_and_missing_permissions(client, admin_user):
    task = started(admin_user)
    client.force_login(staff("retrier", *VIEW, "retry_task"))
    assert client.get(url("task_operate", task.pk)).status_code == 405
    assert client.post(url("task_operate", task.pk), {"operation": "explode"}).status_code == 400
    assert client.post(url("task_operate", task.pk), {"operation": "cancel_now"}).status_code == 403
    assert Task.objects.get(pk=task.pk).status == "running"


def test_operate_needs_csrf(admin_user):
    from django.test import Client

    csrf_client = Client(enforce_csrf_checks=True)
    csrf_client.force_login(admin_user)
    task = started(admin_user)
    response = csrf_client.post(url("task_operate", task.pk), {"operation": "cancel_now"})
    assert response.status_code == 403
    assert Task.objects.get(pk=task.pk).status == "running"


# --- approvals and questions -------------------------------------------------------------------


def test_approve_button_resumes_the_task(
    operator, admin_user, recording_queue, django_capture_on_commit_callbacks
):
    task = paused(admin_user, approval())
    action = PendingAction.objects.get(task=task)
    page = operator.get(url("task_change", task.pk)).content.decode()
    assert "Approve</button>" in page and "Deny</button>" in page
    with django_capture_on_commit_callbacks(execute=True):
        response = operator.post(
            url("task_resolve", task.pk, action.pk), {"decision": "approve", "comment": "go"}
        )
    assert said(response) == [f"Approved deploy ({action.pk}); the task resumes."]
    action.refresh_from_db()
    assert (action.status, action.decided_by.username) == ("approved", "operator")
    assert action.resolution == {"comment": "go"}
    assert Task.objects.get(pk=task.pk).status == "pending"
    assert recording_queue.run_ids[-1] == task.run_id


def test_deny_button(operator, admin_user):
    task = paused(admin_user, approval("call-1"), approval("call-2"))
    first, _ = PendingAction.objects.filter(task=task).order_by("tool_call_id")
    response = operator.post(url("task_resolve", task.pk, first.pk), {"decision": "deny"})
    assert said(response) == [
        f"Denied deploy ({first.pk}); the task still waits on another action."
    ]
    assert PendingAction.objects.get(pk=first.pk).status == "denied"


def test_answer_button(operator, admin_user):
    task = paused(admin_user, question())
    action = PendingAction.objects.get(task=task)
    page = operator.get(url("task_change", task.pk)).content.decode()
    assert 'name="answer-q1" value="HTML"' in page
    response = operator.post(
        url("task_resolve", task.pk, action.pk), {"decision": "answer", "answer-q1": "HTML"}
    )
    assert said(response) == [f"Answered ask_user ({action.pk}); the task resumes."]
    action.refresh_from_db()
    assert action.resolution == {"answers": {"q1": {"values": ["HTML"]}}}


@pytest.mark.parametrize(
    "data, error",
    [
        ({}, "Not answered: q1 is required."),
        ({"answer-q1": "DOCX"}, 'Not answered: "DOCX" is not an option of q1.'),
        ({"answer-q1": ["PDF", "HTML"]}, "Not answered: q1 takes one value."),
    ],
)
def test_answer_is_checked(operator, admin_user, data, error):
    task = paused(admin_user, question())
    action = PendingAction.objects.get(task=task)
    response = operator.post(
        url("task_resolve", task.pk, action.pk), {"decision": "answer", **data}
    )
    assert said(response) == [error]
    assert PendingAction.objects.get(pk=action.pk).status == "pending"


def test_a_late_or_stale_answer_is_reported(operator, admin_user):
    task = paused(admin_user, approval())
    action = PendingAction.objects.get(task=task)
    said(operator.post(url("task_resolve", task.pk, action.pk), {"decision": "approve"}))
    response = operator.post(url("task_resolve", task.pk, action.pk), {"decision": "deny"})
    assert said(response) == [f"Action {action.pk} is already approved."]


def test_an_expired_action_is_expired_not_answered(operator, admin_user):
    task = paused(admin_user, approval())
    action = PendingAction.objects.get(task=task)
    PendingAction.objects.filter(pk=action.pk).update(
        deadline=timezone.now() - timedelta(minutes=1)
    )
    response = operator.post(url("task_resolve", task.pk, action.pk), {"decision": "approve"})
    assert said(response)[0].startswith(f"Action {action.pk} expired at ")
    assert PendingAction.objects.get(pk=action.pk).status == "expired"


def test_resolve_checks_the_action_belongs_to_the_task(operator, admin_user):
    task = paused(admin_user, approval())
    other = TaskFactory(owner=admin_user)
    action = PendingAction.objects.get(task=task)
    assert (
        operator.post(url("task_resolve", other.pk, action.pk), {"decision": "approve"}).status_code
        == 404
    )
    assert (
        operator.post(url("task_resolve", task.pk, action.pk), {"decision": "answer"}).status_code
        == 400
    )


# --- bulk actions ------------------------------------------------------------------------------


def bulk(client, action, tasks, confirm=True):
    data = {"action": action, "_selected_action": [t.pk for t in tasks]}
    first = client.post(url("task_changelist"), {**data, "index": 0})
    if not confirm:
        return first
    return first, client.post(url("task_changelist"), {**data, "post": "yes"})


def test_bulk_cancel_confirms_then_reports_per_task(operator, admin_user):
    running = [started(admin_user) for _ in range(3)]
    done = TaskFactory(owner=admin_user, status="completed")
    confirm = bulk(operator, "cancel_now", [*running, done], confirm=False)
    assert confirm.status_code == 200
    assert confirm.templates[0].name == "agenttasks/admin/confirm_operation.html"
    page = confirm.content.decode()
    assert "Yes, I’m sure" in page and all(t.pk in page for t in running)
    assert Task.objects.filter(status="running").count() == 3  # nothing happened yet
    _, response = bulk(operator, "cancel_now", [*running, done])
    assert response.status_code == 302
    assert said(response) == ["Cancel now: 3 cancelled, 1 already completed."]
    assert Task.objects.filter(status="cancelled").count() == 3


def test_bulk_retry_reports_why_not(operator, admin_user):
    failed = TaskFactory(owner=admin_user, status="failed")
    running = started(admin_user)
    spent = TaskFactory(owner=admin_user, status="failed", attempt=3)
    delegate = TaskFactory(
        owner=admin_user,
        status="failed",
        kind="delegate",
        delegation_key="d",
        parent_conversation=ConversationFactory(owner=admin_user),
    )
    _, response = bulk(operator, "retry", [failed, running, spent, delegate])
    message = said(response)[0]
    assert message.startswith("Retry: ")
    for part in (
        "1 retried (attempt 2)",
        "1 not retryable: it is running",
        "1 not retried: all 3 attempts used",
        "1 not retryable: a delegate task is driven by its caller",
    ):
        assert part in message


def test_bulk_cancel_after_turn_and_stop_tree(operator, admin_user):
    task = started(admin_user)
    queued = lifecycle.create(owner=admin_user, agent_id="worker", input="queued")
    _, response = bulk(operator, "cancel_after_turn", [task, queued])
    assert said(response) == [
        "Cancel after this turn: 1 will stop after this turn, 1 cancelled."
    ] or said(response) == ["Cancel after this turn: 1 cancelled, 1 will stop after this turn."]
    _, a, b, c = family(admin_user)
    _, response = bulk(operator, "stop_tree", [a, c])
    assert said(response) == ["Stop tree: 2 cancelled; 1 descendant task stopped."]


def test_bulk_actions_need_their_permission(viewer, admin_user):
    task = started(admin_user)
    page = viewer.get(url("task_changelist")).content.decode()
    assert "cancel_now" not in page
    response = bulk(viewer, "cancel_now", [task], confirm=False)
    assert response.status_code == 200  # the changelist again: the action is not offered
    assert Task.objects.get(pk=task.pk).status == "running"


# --- conversations -----------------------------------------------------------------------------


def test_conversation_changelist_counts_events(admin_client, admin_user):
    task = lifecycle.create(owner=admin_user, agent_id="worker", input="hello")
    chat = ConversationFactory(owner=admin_user, agent="default", title="a chat")
    response = admin_client.get(url("conversation_changelist"))
    rows = {c.pk: c for c in response.context["cl"].result_list}
    assert rows[task.conversation_id].event_count == 2  # the input and the task.status
    assert rows[chat.pk].event_count == 0
    html = response.content.decode()
    assert "visible" in html and url("task_change", task.pk) in html
    hidden = admin_client.get(url("conversation_changelist") + "?visibility=hidden")
    assert list(hidden.context["cl"].result_list) == []
    tasks = admin_client.get(url("conversation_changelist") + "?source=task")
    assert [c.pk for c in tasks.context["cl"].result_list] == [task.conversation_id]
    others = admin_client.get(url("conversation_changelist") + "?source=other")
    assert [c.pk for c in others.context["cl"].result_list] == [chat.pk]


def test_conversation_changelist_query_count_is_pinned(
    admin_client, admin_user, django_assert_num_queries
):
    family(admin_user)
    with django_assert_num_queries(CONVERSATION_LIST_QUERIES):
        admin_client.get(url("conversation_changelist"))
    for _ in range(3):
        family(admin_user)
    with django_assert_num_queries(CONVERSATION_LIST_QUERIES):
        admin_client.get(url("conversation_changelist"))


def test_conversation_detail(admin_client, admin_user, django_assert_num_queries):
    chat, a, b, c = rich(admin_user)
    response = admin_client.get(url("conversation_change", b.conversation_id))
    html = response.content.decode()
    assert response.status_code == 200
    assert "Tool call: search" in html and url("task_change", c.pk) in html
    assert url("task_change", b.pk) in html and "notes.txt" in html
    with django_assert_num_queries(CONVERSATION_DETAIL_QUERIES):
        admin_client.get(url("conversation_change", b.conversation_id))
    store.append_events(b.conversation_id, [("message.user", {"content": "more"}, "", "")] * 30)
    RunFactory.create_batch(5, conversation=b.conversation, task=b)
    with django_assert_num_queries(CONVERSATION_DETAIL_QUERIES):
        admin_client.get(url("conversation_change", b.conversation_id))
    # Without an answered action there are no deciders to look up: one query fewer.
    with django_assert_num_queries(CONVERSATION_DETAIL_QUERIES - 1):
        admin_client.get(url("conversation_change", chat.pk))


def test_conversation_delete_shows_the_tree_and_deletes_through_the_lifecycle(
    admin_client, admin_user
):
    chat, a, b, c = family(admin_user)
    FileFactory(conversation=b.conversation, name="report.pdf", storage_name="agenttasks/gone.pdf")
    Wakeup.objects.create(
        conversation=chat, task=a, run_id=a.run_id, status="completed", label="alpha"
    )
    page = admin_client.get(url("conversation_delete", chat.pk))
    html = page.content.decode()
    assert page.status_code == 200
    for task in (a, b, c):
        assert url("task_change", task.pk) in html
        assert url("conversation_change", task.conversation_id) in html
    assert "report.pdf" in html and "Deleting a conversation deletes its whole tree" in html
    assert "Conversations: 4" in html and "Tasks: 3" in html
    assert "Tasks still live (stopped first): 3" in html
    response = admin_client.post(url("conversation_delete", chat.pk), {"post": "yes"})
    assert response.status_code == 302
    ids = [chat.pk, a.conversation_id, b.conversation_id, c.conversation_id]
    assert not Conversation.objects.filter(pk__in=ids).exists()
    assert not Task.objects.filter(pk__in=[a.pk, b.pk, c.pk]).exists()
    assert not File.objects.exists() and not Event.objects.filter(conversation_id__in=ids).exists()


def test_bulk_conversation_delete(admin_client, admin_user):
    chat, a, b, c = family(admin_user)
    solo = lifecycle.create(owner=admin_user, agent_id="worker", input="alone")
    selected = [chat.pk, b.conversation_id, solo.conversation_id]  # b's is inside chat's tree
    data = {"action": "delete_selected", "_selected_action": selected}
    confirm = admin_client.post(url("conversation_changelist"), {**data, "index": 0})
    assert confirm.status_code == 200 and "Conversations: 5" in confirm.content.decode()
    response = admin_client.post(url("conversation_changelist"), {**data, "post": "yes"})
    assert response.status_code == 302
    assert not Conversation.objects.exists() and not Task.objects.exists()


def test_conversation_delete_needs_delete_permission(viewer, admin_user):
    chat = ConversationFactory(owner=admin_user)
    assert viewer.get(url("conversation_delete", chat.pk)).status_code == 403
    assert viewer.post(url("conversation_delete", chat.pk), {"post": "yes"}).status_code == 403
    assert Conversation.objects.filter(pk=chat.pk).exists()


# --- runs and pending actions ------------------------------------------------------------------


def test_runs_filter_stuck_work(admin_client, admin_user, settings):
    settings.AGENTTASKS = {"LEASE_TIMEOUT": 30, "REQUEUE_AFTER": 60}
    old = timezone.now() - timedelta(minutes=5)
    stale = TaskFactory(owner=admin_user, status="running", heartbeat_at=old)
    alive = TaskFactory(owner=admin_user, status="running")
    queued = TaskFactory(owner=admin_user, status="pending")
    Run.objects.filter(pk=queued.run_id).update(queued_at=old)
    TaskFactory(owner=admin_user, status="pending")  # queued just now

    def shown(query):
        response = admin_client.get(url("run_changelist") + "?" + query)
        assert response.status_code == 200
        return {r.pk for r in response.context["cl"].result_list}

    assert shown("stuck=stale") == {stale.run_id}
    assert shown("stuck=alive") == {alive.run_id}
    assert shown("stuck=queued") == {queued.run_id}
    assert shown("status__exact=running") == {stale.run_id, alive.run_id}
    html = admin_client.get(url("run_changelist")).content.decode()
    assert "lease stale" not in html and ">stale</span>" in html


def test_pending_actions_filter_overdue(admin_client, admin_user):
    task = paused(admin_user, approval("call-1"), approval("call-2"))
    late, fresh = PendingAction.objects.filter(task=task).order_by("tool_call_id")
    PendingAction.objects.filter(pk=late.pk).update(deadline=timezone.now() - timedelta(hours=1))
    PendingAction.objects.filter(pk=fresh.pk).update(deadline=timezone.now() + timedelta(hours=1))
    response = admin_client.get(url("pendingaction_changelist") + "?deadline=overdue")
    assert [a.pk for a in response.context["cl"].result_list] == [late.pk]
    response = admin_client.get(url("pendingaction_changelist") + "?deadline=open")
    assert [a.pk for a in response.context["cl"].result_list] == [fresh.pk]
    assert url("task_change", task.pk) in response.content.decode()


@pytest.mark.parametrize(
    "model",
    ["run", "pendingaction", "event", "wakeup", "taskresult", "comment", "file", "providerbudget"],
)
def test_read_only_lists_and_pages_render(admin_client, admin_user, model, settings):
    chat, a, b, c = rich(admin_user)
    Wakeup.objects.create(conversation=chat, task=a, run_id=a.run_id, status="completed")
    settings.AGENTTASKS = {"MODEL_LIMITS": {"default": {"requests_per_minute": 600}}}
    budgets.reserve("default", 10, 30)
    response = admin_client.get(url(f"{model}_changelist"))
    assert response.status_code == 200
    if model == "providerbudget":
        assert b"requests_per_minute 600" in response.content
    first = response.context["cl"].result_list[0]
    page = admin_client.get(url(f"{model}_change", first.pk))
    assert page.status_code == 200
    assert b'name="_save"' not in page.content and b"deletelink" not in page.content


# --- overview ----------------------------------------------------------------------------------


def test_overview_shows_the_queue_by_owner_and_the_limits(admin_client, admin_user, settings):
    settings.AGENTTASKS = {"MODEL_LIMITS": {"default": {"requests_per_minute": 60}}}
    other = UserFactory(username="bob")
    for owner, n in ((admin_user, 3), (other, 1)):
        for i in range(n):
            store.create_task(NewTask(owner=owner, agent="echo", input=str(i)))
    waiting(other)
    for _ in range(20):  # twenty turns at one a second: the last is 19 s away
        budgets.reserve("default", 1, 30)
    response = admin_client.get(url("task_overview"))
    owners = {row["owner"]: row["queued"] for row in response.context["queue_by_owner"]}
    assert owners == {"admin": 3, "bob": 2} and response.context["delayed"] == 1
    (limit,) = response.context["limits"]
    assert limit["configured"] == "requests_per_minute 60" and limit["limited"]
    html = response.content.decode()
    assert (
        "Queue by owner (1 waiting for a delayed start)" in html
        and "requests_per_minute 60" in html
    )


def test_overview(admin_client, admin_user, settings):
    settings.AGENTTASKS = {"LEASE_TIMEOUT": 30}
    now = timezone.now()
    started(admin_user, text="busy")
    TaskFactory(owner=admin_user, status="running", heartbeat_at=now - timedelta(minutes=10))
    for i in range(3):
        TaskFactory(owner=admin_user, status="completed", finished_at=now - timedelta(hours=i))
    TaskFactory(
        owner=admin_user, status="failed", error="kaboom", finished_at=now - timedelta(hours=2)
    )
    TaskFactory(owner=admin_user, status="failed", finished_at=now - timedelta(days=2))
    response = admin_client.get(url("task_overview"))
    html = response.content.decode()
    assert response.status_code == 200
    counts = {s: n for s, _, n in response.context["status_counts"]}
    assert counts == {
        "pending": 0,
        "running": 2,
        "waiting_for_input": 0,
        "completed": 3,
        "failed": 2,
        "cancelled": 0,
    }
    assert response.context["failed_count"] == 1 and "kaboom" in html
    assert response.context["stale_runs"] == 1 and response.context["oldest_lease"] == "stale"
    assert len(response.context["running"]) == 2
    assert response.context["chart"]["finished"] == 4
    assert "<svg" in html and html.count('class="at-seg-completed"') >= 3
    assert 'class="at-seg-failed"' in html and "<script" not in html.split("</head>")[1]


def test_overview_is_linked_from_the_app_index(admin_client):
    html = admin_client.get(reverse("admin:app_list", args=["agenttasks"])).content.decode()
    assert url("task_overview") in html


def test_a_broken_task_does_not_hide_the_others(operator, admin_user, monkeypatch):
    first, second = started(admin_user), started(admin_user)
    real_stop = lifecycle.stop

    def stop(task_id, **kw):
        if task_id == first.pk:
            raise RuntimeError("database went away")
        return real_stop(task_id, **kw)

    monkeypatch.setattr(lifecycle, "stop", stop)
    _, response = bulk(operator, "cancel_now", [first, second])
    assert said(response) == [
        "Cancel now: 1 cancelled, 1 failed with an error (see the server log)."
    ]


def test_event_text_is_escaped(admin_client, admin_user):
    task = started(admin_user, text="<script>alert('input')</script>")
    store.append_events(
        task.conversation_id,
        [("message.assistant", {"content": "<img src=x onerror=alert(1)>"}, task.run_id, task.pk)],
    )
    html = admin_client.get(url("task_change", task.pk)).content.decode()
    assert "<img src=x" not in html and "&lt;img src=x onerror=alert(1)&gt;" in html
    assert "<script>alert(" not in html


def test_runs_waiting_interrupted_and_rolled_back_are_listed_by_status(admin_client, admin_user):
    chat = ConversationFactory(owner=admin_user, agent="echo")
    runs = {
        status: RunFactory(conversation=chat, status=status, trigger="message")
        for status in ("queued", "waiting", "interrupted", "rolled_back")
    }
    for status, run in runs.items():
        response = admin_client.get(url("run_changelist") + f"?status__exact={status}")
        assert [r.pk for r in response.context["cl"].result_list] == [run.pk]
    html = admin_client.get(url("run_changelist")).content.decode()
    for css, label in [
        ("waiting", "waiting its turn"),
        ("interrupted", "interrupted"),
        ("rolled_back", "rolled back"),
    ]:
        assert f'<span class="at-badge at-status-{css}">{label}</span>' in html


def test_detail_links_the_task_to_its_trace_when_trace_url_says_where(
    admin_client, admin_user, settings
):
    task = store.create_task(NewTask(owner=admin_user, agent="echo", input="x"))
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    Task.objects.filter(pk=task.pk).update(traceparent=f"00-{trace_id}-00f067aa0ba902b7-01")
    assert trace_id in admin_client.get(url("task_change", task.pk)).content.decode()
    settings.AGENTTASKS = {
        **settings.AGENTTASKS,
        "TRACE_URL": "https://traces.example/t/{trace_id}",
    }
    html = admin_client.get(url("task_change", task.pk)).content.decode()
    assert f'<a href="https://traces.example/t/{trace_id}">{trace_id}</a>' in html
