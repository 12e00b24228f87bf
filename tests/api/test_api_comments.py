"""docs/rest.md, scenarios 23–28: comments re-open tasks.

Agents run on the in-process worker pool. Scenario 27 uses the callable `approver` (an approval
for `deploy {"env": "prod"}`) in place of the chat agent `deployer`.
"""

import pytest

from agenttasks import registry
from agenttasks.models import Comment
from agenttasks.runtime.base import Reply

from ..agents import clarify
from .conftest import ALLOW_LOOPBACK, agenttasks, at_gate, error, gate_task, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def test_rest_12_23_comment_reopens(as_alice, workers):
    task = as_alice.create()
    as_alice.wait_status(task["id"], "completed")
    first_run = task["runId"]
    workers.paused = True  # hold the re-opened run so /result can be read before it runs
    response = as_alice.post(f"/tasks/{task['id']}/comments", {"content": "again"})
    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["comment"]["role"], body["comment"]["content"]) == ("user", "again")
    reopened = body["task"]
    assert reopened["status"] == "pending" and reopened["runId"] != first_run
    assert reopened["attempt"] == 1 and "completedAt" not in reopened
    assert "startedAt" not in reopened  # a re-opening comment clears Task.started_at
    assert body["comment"]["runId"] == reopened["runId"]
    error(as_alice.get(f"/tasks/{task['id']}/result"), 404, "NOT_FOUND")
    workers.paused = False
    as_alice.wait_status(task["id"], "completed")
    result = as_alice.get(f"/tasks/{task['id']}/result").json()["result"]
    assert result["content"] == "Echo: again"
    assert as_alice.get(f"/tasks/{task['id']}/comments").json()["total"] == 1
    messages = as_alice.get(f"/conversations/{task['conversationId']}/messages").json()["messages"]
    assert [(m["content"], m.get("origin")) for m in messages[-2:]] == [
        ("again", "comment"),
        ("Echo: again", None),
    ]
    assert messages[-2]["commentId"] == body["comment"]["id"]


def test_rest_12_24_comment_needs_content(as_alice, workers):
    task = as_alice.create()
    as_alice.wait_status(task["id"], "completed")
    for body in ({}, {"content": ""}, {"content": "  "}, {"content": 5}):
        response = as_alice.post(f"/tasks/{task['id']}/comments", body)
        assert response.status_code == 400
        assert response.json() == {
            "error": {"code": "INVALID_REQUEST", "message": "content is required"}
        }
    assert Comment.objects.count() == 0


def test_rest_12_25_busy(as_alice, workers, gates):
    workers.paused = True
    task, _ = gate_task(as_alice, gates)
    pending = as_alice.post(f"/tasks/{task['id']}/comments", {"content": "now?"})
    found = error(
        pending,
        409,
        "task_busy",
        f"Task {task['id']} is pending; wait for it to finish or cancel it",
    )
    assert found["details"] == {"status": "pending"}
    workers.paused = False
    at_gate(as_alice, task["id"])
    running = as_alice.post(f"/tasks/{task['id']}/comments", {"content": "now?"})
    assert error(running, 409, "task_busy")["details"] == {"status": "running"}
    assert Comment.objects.count() == 0


def clarify_recording(ctx):
    """`clarify`, also recording every comment it was handed (agent and user)."""
    reply = clarify(ctx)
    if not reply.metadata.get("waitingForInput"):
        seen = [(c["role"], c["content"]) for c in ctx.metadata["comments"]]
        return Reply(content=reply.content, metadata={**reply.metadata, "seen": seen})
    return reply


@pytest.fixture
def clarify_agent():
    registry.register(
        "clarify-recording", runtime="callable", handler=clarify_recording, replace=True
    )
    yield "clarify-recording"
    registry.unregister("clarify-recording")


def test_rest_12_26_legacy_clarification(as_alice, workers, receiver, clarify_agent):
    with agenttasks(**ALLOW_LOOPBACK):
        task = as_alice.create(clarify_agent, "convert it", callbackUrl=receiver.url)
        as_alice.wait_status(task["id"], "waiting_for_input")
        assert "pendingActions" not in as_alice.task(task["id"])
        wait_for(lambda: receiver.bodies(), message="the callback")
        assert [b["status"] for b in receiver.bodies()] == ["waiting_for_input"]
        comments = as_alice.get(f"/tasks/{task['id']}/comments").json()
        (agent_comment,) = comments["comments"]
        assert (agent_comment["role"], agent_comment["content"]) == ("agent", "Which format?")
        assert agent_comment["metadata"]["waitingForInput"] is True
        partial = as_alice.get(f"/tasks/{task['id']}/result").json()["result"]
        assert (partial["partial"], partial["content"]) == (True, "Which format?")
        answered = as_alice.post(f"/tasks/{task['id']}/comments", {"content": "PDF"})
        assert answered.status_code == 201
        as_alice.wait_status(task["id"], "completed")
    result = as_alice.get(f"/tasks/{task['id']}/result").json()["result"]
    assert result["content"] == "Done in PDF"
    assert result["metadata"]["seen"] == [["agent", "Which format?"], ["user", "PDF"]]


def test_rest_12_27_action_pending(as_alice, workers):
    task = as_alice.create("approver", "prod")
    as_alice.wait_status(task["id"], "waiting_for_input")
    (action,) = as_alice.task(task["id"])["pendingActions"]
    found = error(
        as_alice.post(f"/tasks/{task['id']}/comments", {"content": "hurry"}),
        409,
        "action_pending",
        f"Task {task['id']} is waiting on an approval or a question; answer it first",
    )
    assert found["details"] == {"actionIds": [action["id"]]}
    assert Comment.objects.count() == 0


def test_rest_12_28_comment_on_failed_and_cancelled(as_alice, workers, gates):
    failed = as_alice.create("boom", "go")
    as_alice.wait_status(failed["id"], "failed")
    workers.paused = True
    reopened = as_alice.post(f"/tasks/{failed['id']}/comments", {"content": "try again"})
    assert reopened.status_code == 201
    task = reopened.json()["task"]
    assert (task["status"], task["attempt"], "error" in task) == ("pending", 1, False)
    held, _ = gate_task(as_alice, gates)
    assert as_alice.post(f"/tasks/{held['id']}/cancel").json()["task"]["status"] == "cancelled"
    again = as_alice.post(f"/tasks/{held['id']}/comments", {"content": "resume"})
    assert again.status_code == 201
    assert (again.json()["task"]["status"], again.json()["task"]["attempt"]) == ("pending", 1)


def test_a_comment_to_a_busy_task_follows_its_multitask_strategy(as_alice, workers):
    workers.paused = True
    task = as_alice.create()
    path = f"/tasks/{task['id']}/comments"
    refused = error(
        as_alice.post(path, {"content": "x", "multitaskStrategy": "sideways"}),
        400,
        "VALIDATION_ERROR",
        "multitaskStrategy must be one of reject, enqueue, interrupt, rollback, steer",
    )
    assert list(refused["details"]["fields"]) == ["multitaskStrategy"]
    error(as_alice.post(path, {"content": "x", "multitaskStrategy": "reject"}), 409, "task_busy")
    waiting = as_alice.post(path, {"content": "later", "multitaskStrategy": "enqueue"})
    assert waiting.status_code == 202, waiting.content
    body = waiting.json()
    assert set(body) == {"task", "run"} and body["run"]["status"] == "waiting"
    assert body["task"]["runId"] == task["runId"]  # the task keeps its run until that ends
    # echo cannot be steered: its steer_fallback (enqueue) applies.
    steered = as_alice.post(path, {"content": "last", "multitaskStrategy": "steer"})
    assert steered.status_code == 202 and steered.json()["run"]["status"] == "waiting"
    workers.paused = False
    wait_for(
        lambda: (
            as_alice.get(f"/tasks/{task['id']}/result").json().get("result", {}).get("content")
            == "Echo: last"
        )
    )
    comments = as_alice.get(path).json()["comments"]
    assert [c["content"] for c in comments] == ["later", "last"]
    interrupted = as_alice.post(path, {"content": "again", "multitaskStrategy": "interrupt"})
    assert interrupted.status_code == 201  # a task that ended takes it as a comment at once
    assert interrupted.json()["comment"]["content"] == "again"


def test_a_comment_and_a_message_each_take_the_others_spelling(as_alice, workers):
    task = as_alice.create()
    as_alice.wait_status(task["id"], "completed")
    comment = as_alice.post(f"/tasks/{task['id']}/comments", {"message": "spelled as a message"})
    assert comment.status_code == 201, comment.content
    assert comment.json()["comment"]["content"] == "spelled as a message"
    as_alice.wait_status(task["id"], "completed")
    conversation = task["conversationId"]
    posted = as_alice.post(f"/conversations/{conversation}/messages", {"content": "as a comment"})
    assert posted.status_code == 202, posted.content
    assert posted.json()["message"]["content"] == "as a comment"
    # The own spelling wins when both are sent.
    as_alice.wait_status(task["id"], "completed")
    both = as_alice.post(f"/tasks/{task['id']}/comments", {"content": "own", "message": "other"})
    assert both.json()["comment"]["content"] == "own"
