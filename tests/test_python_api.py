"""The Python API speaks the stored vocabulary (docs/lifecycle.md#status-and-waiting).

`lifecycle.status()` and `TaskInfo` use the stored statuses, as REST does; `status(id, wait=…)`
returns at once for a task waiting for input; `TaskInfo.agent` is filled; `resolve_action` takes
the REST answer body and refuses anything else with a ValueError. The model tools keep their own
words (`working`, `input_required`).
"""

import time

import pytest

from agenttasks import lifecycle, registry, store
from agenttasks.answers import AnswerError
from agenttasks.exceptions import ActionNotFound, AlreadyFinal
from agenttasks.models import PendingAction
from agenttasks.runtime.task_tools import task_tools
from agenttasks.types import ActionRequest, TaskInfo

from .harness import finish, row

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
