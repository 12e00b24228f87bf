"""docs/rest.md, scenarios 57–61: conversations and messages (in-process workers).

Scenario 59 needs a conversation whose run blocks until the test releases it: the `gate` test
agent reads its gate from a task's metadata, so a local `conversation-gate` agent reads it from
the conversation's metadata instead. The paused conversation of scenario 59 uses the callable
`approver` in place of the chat agent `deployer`; the `lead` of scenario 61 is the callable `lead`.
"""

import os
import time

import pytest

from agenttasks import registry
from agenttasks.models import Comment, Conversation, Run
from agenttasks.runtime.base import Reply

from .conftest import ALLOW_LOOPBACK, agenttasks, at_gate, error, gate_task, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def conversation_gate(ctx):
    path = (ctx.conversation.metadata or {}).get("gate", "")
    while not (path and os.path.exists(path)):
        ctx.check_cancelled()
        time.sleep(0.02)
    return Reply(content="released")


@pytest.fixture
def gate_agent():
    registry.register(
        "conversation-gate", runtime="callable", handler=conversation_gate, replace=True
    )
    yield "conversation-gate"
    registry.unregister("conversation-gate")


def test_rest_12_57_create_read_update(as_alice, as_bob):
    response = as_alice.post(
        "/conversations", {"agentId": "echo", "title": "Chat", "metadata": {"k": 1}}
    )
    assert response.status_code == 201
    conversation = response.json()["conversation"]
    assert response["Location"] == f"/api/agents/conversations/{conversation['id']}"
    assert (conversation["hidden"], conversation["lastSeq"], conversation["title"]) == (
        False,
        0,
        "Chat",
    )
    path = f"/conversations/{conversation['id']}"
    assert as_alice.get(path).json() == {"conversation": conversation}
    patched = as_alice.patch(path, {"title": None, "metadata": {"k": 2}})
    assert patched.status_code == 200
    body = patched.json()["conversation"]
    assert "title" not in body and body["metadata"] == {"k": 2}
    assert body["updatedAt"] >= conversation["updatedAt"]
    assert (
        as_alice.patch(path, {}).json()["conversation"] == as_alice.get(path).json()["conversation"]
    )
    for call in (as_bob.get(path), as_bob.patch(path, {"title": "mine"}), as_bob.delete(path)):
        error(call, 403, "FORBIDDEN", "You do not have access to this conversation")
    for metadata, field in (
        ({"source": "x"}, "metadata.source"),
        ({"taskId": "y"}, "metadata.taskId"),
    ):
        found = error(
            as_alice.post("/conversations", {"agentId": "echo", "metadata": metadata}),
            400,
            "VALIDATION_ERROR",
            "metadata.source and metadata.taskId are reserved",
        )
        assert list(found["details"]["fields"]) == [field]
    error(
        as_alice.post("/conversations", {"title": "x"}),
        400,
        "VALIDATION_ERROR",
        "agentId is required",
    )
    error(
        as_alice.post("/conversations", {"agentId": "echo", "title": ""}),
        400,
        "VALIDATION_ERROR",
        "title must be a string of 1 to 200 characters",
    )
    error(
        as_alice.post("/conversations", {"agentId": "internal"}),
        404,
        "NOT_FOUND",
        "Agent not found: internal",
    )
    assert Conversation.objects.count() == 1


def test_rest_12_58_task_metadata_is_the_servers(as_alice, workers):
    task = as_alice.create()
    as_alice.wait_status(task["id"], "completed")  # nothing else moves the conversation
    path = f"/conversations/{task['conversationId']}"
    patched = as_alice.patch(path, {"metadata": {"tag": "a"}})
    assert patched.json()["conversation"]["metadata"] == {
        "tag": "a",
        "source": "task",
        "taskId": task["id"],
    }
    before = as_alice.get(path).json()
    error(
        as_alice.patch(path, {"metadata": {"taskId": "task_other"}}),
        400,
        "VALIDATION_ERROR",
        "metadata.source and metadata.taskId are reserved",
    )
    assert as_alice.get(path).json() == before


def test_rest_12_59_messages_and_busy(as_alice, workers, gates, gate_agent):
    gate = gates.new()
    conversation = as_alice.post(
        "/conversations", {"agentId": gate_agent, "metadata": gate}
    ).json()["conversation"]
    path = f"/conversations/{conversation['id']}/messages"
    workers.paused = True
    response = as_alice.post(path, {"message": "hi"})
    assert response.status_code == 202, response.content
    body = response.json()
    message, run = body["message"], body["run"]
    assert (message["role"], message["content"], message["origin"]) == ("user", "hi", "message")
    assert (run["status"], run["trigger"]) == ("queued", "message")
    queued = error(
        as_alice.post(path, {"message": "again"}),
        409,
        "conversation_busy",
        f"Conversation {conversation['id']} has a run in progress",
    )
    assert queued["details"] == {"runId": run["id"]}
    workers.paused = False
    wait_for(lambda: Run.objects.get(pk=run["id"]).status == "running", message="the run started")
    error(as_alice.post(path, {"message": "again"}), 409, "conversation_busy")
    error(as_alice.post(path, {}), 400, "VALIDATION_ERROR", "message is required")
    error(as_alice.post(path, {"message": "x", "stream": True}), 400, "VALIDATION_ERROR")
    gates.release(gate)
    wait_for(
        lambda: as_alice.get(path).json()["messages"][-1]["content"] == "released",
        message="the reply",
    )
    wait_for(lambda: Run.objects.get(pk=run["id"]).status == "completed")
    assert as_alice.post(path, {"message": "more"}).status_code == 202
    # A conversation paused on an approval (`approver` stands in for `deployer`).
    paused = as_alice.post("/conversations", {"agentId": "approver"}).json()["conversation"]
    paused_path = f"/conversations/{paused['id']}/messages"
    assert as_alice.post(paused_path, {"message": "prod"}).status_code == 202
    actions = wait_for(
        lambda: as_alice.get(f"/conversations/{paused['id']}/actions").json()["actions"],
        message="the approval",
    )
    found = error(
        as_alice.post(paused_path, {"message": "and?"}),
        409,
        "conversation_busy",
        f"Conversation {paused['id']} is waiting on an approval or a question",
    )
    assert found["details"] == {"actionIds": [actions[0]["id"]]}


def test_rest_12_60_message_on_a_task_conversation(as_alice, workers):
    task = as_alice.create()
    as_alice.wait_status(task["id"], "completed")
    workers.paused = True
    response = as_alice.post(
        f"/conversations/{task['conversationId']}/messages", {"message": "more"}
    )
    assert response.status_code == 202, response.content
    assert response.json()["message"]["origin"] == "message"
    reopened = as_alice.status(task["id"])
    detail = as_alice.task(task["id"])["task"]
    assert reopened["status"] == "pending" and reopened["attempt"] == 1
    assert detail["runId"] != task["runId"] and detail["runId"] == response.json()["run"]["id"]
    comments = as_alice.get(f"/tasks/{task['id']}/comments").json()["comments"]
    assert [(c["role"], c["content"]) for c in comments] == [("user", "more")]
    workers.paused = False
    as_alice.wait_status(task["id"], "completed")
    assert as_alice.get(f"/tasks/{task['id']}/result").json()["result"]["content"] == "Echo: more"
    assert Comment.objects.count() == 1


def test_rest_12_61_delete(as_alice, workers, gates, receiver):
    with agenttasks(**ALLOW_LOOPBACK, HEARTBEAT_INTERVAL=0.2):
        task, _ = gate_task(as_alice, gates, callbackUrl=receiver.url)
        at_gate(as_alice, task["id"])
        response = as_alice.delete(f"/conversations/{task['conversationId']}")
        assert response.status_code == 204 and response.content == b""
        error(
            as_alice.get(f"/tasks/{task['id']}"), 404, "NOT_FOUND", f"Task not found: {task['id']}"
        )
        error(as_alice.get(f"/conversations/{task['conversationId']}"), 404, "NOT_FOUND")
        wait_for(lambda: workers.finished(task["runId"]), message="the handler observed its stop")
    assert receiver.requests == []
    # A lead conversation with its spawned task.
    lead = as_alice.post("/conversations", {"agentId": "lead"}).json()["conversation"]
    as_alice.post(f"/conversations/{lead['id']}/messages", {"message": "go"})
    child = wait_for(
        lambda: (
            (t := as_alice.get(f"/tasks?parentConversationId={lead['id']}").json()["tasks"])
            and t[0]
        ),
        message="the spawned task",
    )
    as_alice.wait_status(child["id"], "completed")
    assert as_alice.delete(f"/conversations/{lead['id']}").status_code == 204
    error(as_alice.get(f"/conversations/{lead['id']}"), 404, "NOT_FOUND")
    error(as_alice.get(f"/tasks/{child['id']}"), 404, "NOT_FOUND")
    error(as_alice.get(f"/conversations/{child['conversationId']}"), 404, "NOT_FOUND")
    assert child["id"] not in [t["id"] for t in as_alice.get("/tasks").json()["tasks"]]


def test_a_patch_changes_only_the_keys_it_is_given(as_alice):
    created = as_alice.post("/conversations", {"agentId": "echo", "title": "Chat"})
    path = f"/conversations/{created.json()['conversation']['id']}"
    patched = as_alice.patch(path, {"metadata": {"k": 1}}).json()["conversation"]
    assert (patched["title"], patched["metadata"]) == ("Chat", {"k": 1})


def test_a_busy_conversation_enqueues_a_message_when_asked(
    as_alice, as_bob, workers, gates, gate_agent
):
    gate = gates.new()
    conversation = as_alice.post(
        "/conversations", {"agentId": gate_agent, "metadata": gate}
    ).json()["conversation"]
    path = f"/conversations/{conversation['id']}/messages"
    first = as_alice.post(path, {"message": "hi"}).json()["run"]
    wait_for(lambda: Run.objects.get(pk=first["id"]).status == "running", message="the run started")
    later = []
    for text in ("two", "three"):
        response = as_alice.post(path, {"message": text, "multitaskStrategy": "enqueue"})
        assert response.status_code == 202, response.content
        body = response.json()
        assert set(body) == {"run"} and body["run"]["status"] == "waiting"  # no message yet
        later.append(body["run"]["id"])
    refused = error(
        as_alice.post(path, {"message": "x", "multitaskStrategy": "sideways"}),
        400,
        "VALIDATION_ERROR",
        "multitaskStrategy must be one of reject, enqueue, interrupt, rollback, steer",
    )
    assert refused["details"]["fields"] == {
        "multitaskStrategy": [
            "multitaskStrategy must be one of reject, enqueue, interrupt, rollback, steer"
        ]
    }
    cancel = f"/conversations/{conversation['id']}/runs/{later[0]}/cancel"
    error(as_bob.post(cancel), 403, "FORBIDDEN")
    cancelled = as_alice.post(cancel)
    assert cancelled.status_code == 200 and cancelled.json()["run"]["status"] == "cancelled"
    error(
        as_alice.post(cancel), 409, "run_started", f"Run {later[0]} is no longer waiting its turn"
    )
    error(
        as_alice.post(f"/conversations/{conversation['id']}/runs/run_nope/cancel"),
        404,
        "NOT_FOUND",
        "Run not found: run_nope",
    )
    gates.release(gate)
    wait_for(
        lambda: (
            [m["content"] for m in as_alice.get(path).json()["messages"]]
            == ["hi", "released", "three", "released"]
        ),
        message="the enqueued message answered after the first",
    )
