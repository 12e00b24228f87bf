"""A conversation with no agent behind it (an MCP client's): the lifecycle's rule for its tasks'
wake-ups (docs/lifecycle.md#wake-up-debt-and-notifications), and `host_conversation`."""

import json

import pytest
from django.contrib.admin.utils import quote

from agenttasks import lifecycle, store
from agenttasks.delivery import wakeups
from agenttasks.exceptions import ConversationNotFound
from agenttasks.models import Conversation, Event, Run, Task, Wakeup

from ..factories import UserFactory
from ..harness import finish

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def host(user):
    return lifecycle.host_conversation("conv_hostAAAAAAAAAAAAAAAAA", owner=user, title="MCP client")


def test_a_host_conversation_is_hidden_has_no_agent_and_is_the_owners(host, user):
    assert (host.agent, host.hidden, host.owner_id, host.title) == ("", True, user.pk, "MCP client")
    again = lifecycle.host_conversation(host.id, owner=user)
    assert again.pk == host.pk and Conversation.objects.count() == 1
    with pytest.raises(ConversationNotFound):
        lifecycle.host_conversation(host.id, owner=UserFactory(username="other"))
    with pytest.raises(ConversationNotFound):
        lifecycle.host_conversation(host.id, owner=None)


def test_an_ending_owes_the_host_a_wake_up_that_starts_no_run(host):
    info = lifecycle.spawn(host, "worker", "do it", label="job", metadata={"k": 1})
    finish(info, "completed", text="all good")
    (owed,) = Wakeup.objects.filter(conversation_id=host.id)
    assert owed.state == "pending"
    assert wakeups.deliver_pending(host.id) is None  # nobody to wake: nothing written
    assert not Run.objects.filter(conversation_id=host.id).exists()
    assert not Event.objects.filter(conversation_id=host.id, type="task.notification").exists()
    assert host.id not in store.conversations_owed()  # the reaper leaves it to its owner
    owed.refresh_from_db()
    assert owed.state == "pending"
    assert Task.objects.get(pk=info.task_id).metadata == {"k": 1}  # spawn takes metadata


def test_take_owed_hands_over_the_notification_and_settles_it_as_pulled(host, signal_log):
    first = lifecycle.spawn(host, "worker", "one", label="first")
    second = lifecycle.spawn(host, "worker", "two", label="second")
    finish(first, "completed", text="done one")
    finish(second, "failed", error="broke")
    text = lifecycle.take_owed(host)
    assert text == wakeups.format_notification(
        Wakeup.objects.filter(conversation_id=host.id).order_by("created_at", "id")
    )
    assert text.startswith(f'[task-notification] Task "first" ({first.task_id}) completed.')
    assert {w.state for w in Wakeup.objects.filter(conversation_id=host.id)} == {"consumed"}
    assert {s.id for s in signal_log.delivered} == {first.task_id, second.task_id}
    assert lifecycle.take_owed(host) == ""


def test_take_owed_settles_only_the_run_that_owed(host):
    info = lifecycle.spawn(host, "worker", "one", label="first")
    finish(info, "failed", error="broke")
    lifecycle.retry(info.task_id)  # the retry drops the undelivered debt
    assert lifecycle.take_owed(host) == ""
    assert Wakeup.objects.get(task_id=info.task_id).state == "dropped"


def test_a_message_to_a_host_conversation_starts_no_run(host, user):
    from rest_framework.test import APIClient

    client = APIClient()
    client.force_authenticate(user)
    path = f"/api/agents/conversations/{host.id}/messages"
    response = client.post(path, {"message": "hello"}, format="json")
    assert response.status_code == 404
    assert response.json()["error"]["message"] == "Agent not found: "
    assert not Run.objects.filter(conversation_id=host.id).exists()


def test_the_admin_shows_a_host_conversation(host, user):
    from django.test import Client

    info = lifecycle.spawn(host, "worker", "do it", label="job")
    user.is_staff = user.is_superuser = True
    user.save()
    admin = Client()
    admin.force_login(user)
    for path in (
        "/admin/agenttasks/conversation/",
        f"/admin/agenttasks/conversation/{quote(host.id)}/change/",
        f"/admin/agenttasks/task/{quote(info.task_id)}/change/",
    ):
        assert admin.get(path).status_code == 200, path


def test_a_result_file_is_a_resource_link():
    from agenttasks.mcp import protocol
    from agenttasks.mcp.calls import outcome

    from ..factories import TaskResultFactory

    ref = {"id": "file_abc", "name": "report.pdf", "mimeType": "application/pdf", "size": 12}
    result = TaskResultFactory(content="see the report", files=[ref])
    over_http = outcome(result.task, "http://host/api/agents")
    assert over_http["content"] == [
        {"type": "text", "text": "see the report"},
        {
            "type": "resource_link",
            "uri": "http://host/api/agents/files/file_abc/content",
            "name": "report.pdf",
            "mimeType": "application/pdf",
            "size": 12,
        },
    ]
    assert over_http["structuredContent"]["files"][0]["id"] == "file_abc"
    over_stdio = outcome(result.task, "")
    assert over_stdio["content"][1]["uri"] == "agenttasks://files/file_abc"
    for version in ("2025-11-25", "2026-07-28"):  # valid on the wire of both versions
        shaped = protocol.shape("tools/call", version, over_http)
        assert shaped["content"][1]["type"] == "resource_link"


def test_a_call_that_read_its_task_before_the_answer_committed_follows_on(
    host, user, recording_queue
):
    """Issue: on SQLite an answered question ended the call early as a 'clarification': the call
    read the task waiting, then its actions after the answer had settled them (two statements)."""
    from agenttasks.mcp import protocol
    from agenttasks.mcp.calls import CallFollower, Exchange
    from agenttasks.mcp.sessions import Caller, Session

    from ..fake_model import run_to_idle

    info = lifecycle.spawn(host, "asker", "report", label="")
    run_to_idle(recording_queue)
    stale = Task.objects.select_related("run").get(pk=info.task_id)
    assert (stale.status, stale.run.status) == ("waiting_for_input", "paused")
    (action_id,) = lifecycle.waiting_on(stale)
    lifecycle.resolve_action(action_id, {"answers": {"q1": "PDF"}})
    session = Session(Caller(user), "2025-11-25", host.id, True, "token")
    message = protocol.Message(kind=protocol.REQUEST, id=1, method="tools/call")
    exchange = Exchange(session, message, frame=json.dumps, streaming=True)
    follower = CallFollower(exchange, "asker", stale, after=0)
    assert follower._input_needed(stale) == [] and not follower.done  # it follows on
    run_to_idle(recording_queue)
    assert "format: PDF" in follower.poll() and follower.done
