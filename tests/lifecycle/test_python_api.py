"""The Python API speaks the stored vocabulary (docs/lifecycle.md#status-and-waiting).

`lifecycle.status()` and `TaskInfo` use the stored statuses, as REST does; `status(id, wait=…)`
returns at once for a task waiting for input; `TaskInfo.agent` is filled; `resolve_action` takes
the REST answer body and refuses anything else with a ValueError. The model tools keep their own
words (`working`, `input_required`).
"""

import os
import time
from pathlib import Path

import pytest

from agenttasks import lifecycle, registry, store
from agenttasks.exceptions import ActionNotFound, AlreadyFinal
from agenttasks.lifecycle.answers import AnswerError
from agenttasks.models import Comment, Event, File, PendingAction, Task
from agenttasks.runtime.task_tools import task_tools
from agenttasks.store import files
from agenttasks.types import ActionRequest, TaskInfo

from ..harness import finish, row

pytestmark = pytest.mark.django_db(transaction=True)

APPROVAL = ActionRequest(
    kind="approval", tool_name="deploy", tool_call_id="call-approve", args={"env": "prod"}
)
QUESTION = ActionRequest(
    kind="question",
    tool_name="ask_user",
    tool_call_id="call-ask",
    questions=[
        {
            "id": "q1",
            "question": "Which format?",
            "options": [{"label": "PDF", "value": "PDF"}, {"label": "HTML", "value": "HTML"}],
            "multiSelect": False,
            "required": True,
            "allowFreeText": False,
        }
    ],
)


@pytest.fixture
def named_worker():
    """`worker` with a display name, so the name and the id differ."""
    registry.register(
        "worker", runtime="callable", handler=lambda ctx: None, name="Worker Bee", replace=True
    )


def spawn(parent, parent_run) -> TaskInfo:
    return lifecycle.spawn(parent, "worker", "do it", label="job", parent_run=parent_run)


def paused(parent, parent_run, request=APPROVAL) -> tuple[TaskInfo, PendingAction]:
    t = spawn(parent, parent_run)
    finish(t, "input_required", actions=(request,))
    return t, PendingAction.objects.get(run_id=row(t).run_id)


def test_status_speaks_the_stored_statuses(parent, parent_run):
    t = spawn(parent, parent_run)
    assert lifecycle.status(t.task_id).status == "pending"
    assert t.status == "pending"
    finish(t, "input_required", actions=(APPROVAL,))
    assert lifecycle.status(t.task_id).status == "waiting_for_input"
    assert [i.status for i in lifecycle.list_tasks(parent)] == ["waiting_for_input"]
    # The model still reads its own words.
    card = task_tools(parent, parent_run)[1].call({"task_id": t.task_id, "wait_seconds": 0}, {})
    assert "status: input_required" in card.text
    assert card.details["task_status"] == "input_required"


def test_a_wait_returns_at_once_for_a_task_waiting_for_input(parent, parent_run):
    t, _ = paused(parent, parent_run)
    started = time.monotonic()
    info = lifecycle.status(t.task_id, wait=10)
    assert info.status == "waiting_for_input" and time.monotonic() - started < 2
    # `settled` still lets a caller wait for an ending only.
    started = time.monotonic()
    info = lifecycle.status(t.task_id, wait=0.5, settled={"completed", "failed", "cancelled"})
    assert info.status == "waiting_for_input" and time.monotonic() - started >= 0.45


def test_task_info_names_the_agent(parent, parent_run, named_worker):
    t = spawn(parent, parent_run)
    assert t.agent == "Worker Bee"
    assert lifecycle.status(t.task_id).agent == "Worker Bee"
    assert lifecycle.list_tasks(parent)[0].agent == "Worker Bee"
    registry.unregister("worker")
    assert lifecycle.status(t.task_id).agent == "worker"  # no longer registered: its id


def test_cancel_stops_a_live_task_and_returns_it(parent, parent_run):
    t = spawn(parent, parent_run)
    task = lifecycle.cancel(t.task_id)
    assert task.status == "cancelled" and row(t).status == "cancelled"
    # Cancelling a cancelled task changes nothing.
    assert lifecycle.cancel(t.task_id).status == "cancelled"


def test_cancel_of_a_running_task_may_wind_down_after_its_turn(parent, parent_run):
    t = spawn(parent, parent_run)
    claimed = row(t)
    assert store.claim(claimed.run_id, "worker-1")
    task = lifecycle.cancel(t.task_id, graceful=True)
    assert (task.status, task.run.stop_request) == ("running", "after_turn")


@pytest.mark.parametrize("status", ["completed", "failed"])
def test_cancel_refuses_a_task_that_ended(parent, parent_run, status):
    t = spawn(parent, parent_run)
    finish(t, status, text="done", error="boom")
    with pytest.raises(AlreadyFinal) as refused:
        lifecycle.cancel(t.task_id)
    assert (refused.value.status, refused.value.task_id) == (status, t.task_id)
    assert row(t).status == status


def test_resolve_action_takes_the_rest_approval_body(parent, parent_run, user):
    t, action = paused(parent, parent_run)
    won = lifecycle.resolve_action(
        action, {"approved": False, "comment": "not today"}, decided_by=user
    )
    assert won and won.status == "pending"
    action.refresh_from_db()
    assert (action.status, action.decided_by_id) == ("denied", user.pk)
    assert action.resolution.get("comment") == "not today"


def test_resolve_action_takes_the_rest_question_body(parent, parent_run):
    t, action = paused(parent, parent_run, QUESTION)
    assert lifecycle.resolve_action(action.id, {"answers": {"q1": "PDF"}})
    action.refresh_from_db()
    assert action.status == "answered"
    assert action.resolution["answers"] == {"q1": {"values": ["PDF"]}}


@pytest.mark.parametrize(
    "answer, message",
    [
        (
            {"status": "approved"},
            'Unexpected answer keys for a approval: status; expected {"approved": bool, '
            '"comment"?: str} for an approval, {"answers": {...}} for a question',
        ),
        ({"approved": "yes"}, "approved must be a boolean"),
        ({}, "approved must be a boolean"),
        ({"approved": True, "comment": 3}, "comment must be a string"),
        (
            "approved",
            'An answer must be a dict: {"approved": bool, "comment"?: str} for an approval, '
            '{"answers": {...}} for a question',
        ),
    ],
)
def test_resolve_action_refuses_anything_else_on_an_approval(parent, parent_run, answer, message):
    t, action = paused(parent, parent_run)
    with pytest.raises(ValueError) as refused:
        lifecycle.resolve_action(action.id, answer)
    assert isinstance(refused.value, AnswerError) and str(refused.value) == message
    action.refresh_from_db()
    assert action.status == "pending" and row(t).status == "waiting_for_input"


@pytest.mark.parametrize(
    "answer, message",
    [
        ({"approved": True}, "Unexpected answer keys for a question: approved"),
        ({"answers": {"q1": "Word"}}, 'answers.q1: "Word" is not an option'),
        ({"answers": {}}, "answers.q1 is required"),
        ({"answers": "PDF"}, "answers is required"),
    ],
)
def test_resolve_action_refuses_anything_else_on_a_question(parent, parent_run, answer, message):
    t, action = paused(parent, parent_run, QUESTION)
    with pytest.raises(ValueError) as refused:
        lifecycle.resolve_action(action.id, answer)
    assert str(refused.value).startswith(message)
    action.refresh_from_db()
    assert action.status == "pending"


def test_resolve_action_on_an_unknown_action(db):
    with pytest.raises(ActionNotFound):
        lifecycle.resolve_action("act_nope", {"approved": True})


# --- files from site code -------------------------------------------------------------------

TEXT_ONLY = {"enabled": True, "allowedTypes": ["text/*"], "maxSize": 64, "maxCount": 2}


@pytest.fixture
def filed_agent():
    """An agent whose file policy takes at most two small text files per conversation."""
    registry.register(
        "filed", runtime="callable", handler=lambda ctx: None, files=TEXT_ONLY, replace=True
    )
    yield "filed"
    registry.unregister("filed")


def text_file(index: int, content: bytes = b"hello", mime_type: str = "text/plain"):
    return files.Upload(
        index=index, name=f"notes-{index}.txt", mime_type=mime_type, content=content
    )


def stored_names() -> set[str]:
    root = files.storage().path("")
    return {os.path.join(d, f) for d, _, names in os.walk(root) for f in names}


def test_create_stores_uploads_as_the_tasks_files(user, filed_agent):
    task = lifecycle.create(owner=user, agent_id=filed_agent, input="read", uploads=[text_file(0)])
    (stored,) = File.objects.filter(task_id=task.id)
    assert (stored.name, stored.conversation_id, stored.owner_id, stored.size) == (
        "notes-0.txt",
        task.conversation_id,
        user.id,
        5,
    )
    with files.open_bytes(stored) as handle:
        assert handle.read() == b"hello"
    first = Event.objects.get(conversation_id=task.conversation_id, type="message.user")
    assert first.data["files"] == [stored.ref()]


@pytest.mark.parametrize(
    "upload, code",
    [
        (text_file(0, mime_type="image/png"), "unsupported_media_type"),
        (text_file(0, content=b"x" * 65), "file_too_large"),
    ],
)
def test_create_refuses_what_the_file_policy_refuses_and_writes_nothing(
    user, filed_agent, upload, code
):
    before = stored_names()
    with pytest.raises(files.FileRefused) as refused:
        lifecycle.create(owner=user, agent_id=filed_agent, input="read", uploads=[upload])
    assert refused.value.code == code
    assert not Task.objects.exists() and not File.objects.exists()
    assert stored_names() == before


def test_a_create_that_fails_removes_the_bytes_it_stored(user, filed_agent):
    before = stored_names()

    def refuse(task):
        raise RuntimeError("the site's own check failed")

    with pytest.raises(RuntimeError):
        lifecycle.create(
            owner=user,
            agent_id=filed_agent,
            input="read",
            uploads=[text_file(0)],
            before_commit=refuse,
        )
    assert not Task.objects.exists() and not File.objects.exists()
    assert stored_names() == before


def test_a_message_to_a_tasks_conversation_reopens_it_with_its_files(user, filed_agent):
    task = lifecycle.create(owner=user, agent_id=filed_agent, input="read")
    finish(task, "completed", text="done")
    run, event = lifecycle.post_message(
        task.conversation_id, "and this", author=user, uploads=[text_file(0)]
    )
    reopened = row(task)
    assert (reopened.status, reopened.run_id, run.trigger) == ("pending", run.id, "message")
    (stored,) = File.objects.filter(conversation_id=task.conversation_id)
    assert (event.data["origin"], event.data["files"]) == ("message", [stored.ref()])
    assert Comment.objects.get(task_id=task.id).content == "and this"


def test_a_message_counts_the_files_its_conversation_already_has(user, filed_agent):
    conversation = lifecycle.create_conversation(owner=user, agent_id=filed_agent)
    lifecycle.post_message(conversation.id, "two files", uploads=[text_file(0), text_file(1)])
    with pytest.raises(files.FileRefused) as refused:
        lifecycle.post_message(conversation.id, "a third", uploads=[text_file(2)])
    assert refused.value.code == "too_many_files"
    assert File.objects.filter(conversation_id=conversation.id).count() == 2


def test_the_readme_python_api_snippet_runs_as_printed(start_cluster):
    """README, Python API: run top to bottom against a cluster, each assert in it holds."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme.split("\n## Python API\n", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    start_cluster(workers=1)
    scope: dict = {}  # the snippet defines all it uses (`user` included)
    exec(compile(code, "README.md", "exec"), scope)
    assert scope["user"].username == "admin"
    assert Task.objects.get(pk=scope["failing"].id).attempt == 2
    assert not Task.objects.filter(pk=scope["task"].id).exists()  # its conversation was deleted
