"""docs/rest.md, scenarios 11–22: creating, reading, listing and waiting for tasks.

Agents run on the in-process worker pool (`workers`: worker.execute_run in threads); scenario 20
(a model spawning a task) also runs on a real django-q2 cluster in test_api_events_cluster.py.
"""

import time

import pytest

from agenttasks.models import Conversation, Event, Task

from .conftest import agenttasks, at_gate, error, gate_task

pytestmark = pytest.mark.django_db(transaction=True)


def test_rest_12_11_create(as_alice, alice):
    response = as_alice.post("/tasks", {"agentId": "echo", "input": "hello"})
    assert response.status_code == 201
    task = response.json()["task"]
    assert response["Location"] == f"/api/agents/tasks/{task['id']}"
    assert (task["status"], task["attempt"], task["label"]) == ("pending", 1, "hello")
    assert task["userId"] == str(alice.pk) and task["metadata"] == {}
    assert task["conversationId"].startswith("conv_") and task["runId"].startswith("run_")
    for absent in ("startedAt", "completedAt", "error", "callbackUrl", "files"):
        assert absent not in task


def test_rest_12_12_create_validation(as_alice):
    found = error(
        as_alice.post("/tasks", {"agentId": "echo"}),
        400,
        "VALIDATION_ERROR",
        "agentId and input are required",
    )
    assert "input" in found["details"]["fields"]
    error(as_alice.post("/tasks", {"agentId": "echo", "input": "   "}), 400, "VALIDATION_ERROR")
    error(
        as_alice.post("/tasks", {"agentId": "echo", "input": 42}),
        400,
        "VALIDATION_ERROR",
        "input must be a string",
    )
    with agenttasks(MAX_INPUT_CHARS=10):
        error(
            as_alice.post("/tasks", {"agentId": "echo", "input": "x" * 11}),
            400,
            "VALIDATION_ERROR",
            "input must be at most 10 characters",
        )
        assert as_alice.post("/tasks", {"agentId": "echo", "input": "x" * 10}).status_code == 201
    error(
        as_alice.post("/tasks", {"agentId": "echo", "input": "x", "metadata": "x"}),
        400,
        "VALIDATION_ERROR",
        "metadata must be a JSON object",
    )
    error(
        as_alice.post("/tasks", {"agentId": "echo", "input": "x", "label": ""}),
        400,
        "VALIDATION_ERROR",
        "label must be a string of 1 to 200 characters",
    )
    with agenttasks(MAX_METADATA_BYTES=10):
        error(
            as_alice.post("/tasks", {"agentId": "echo", "input": "x", "metadata": {"k": "v" * 20}}),
            400,
            "VALIDATION_ERROR",
            "metadata must be at most 10 bytes",
        )
    assert Task.objects.count() == 1  # only the one at exactly MAX_INPUT_CHARS
    assert Conversation.objects.count() == 1 and Event.objects.count() == 2


def test_rest_12_13_unknown_agent(as_alice):
    error(
        as_alice.post("/tasks", {"agentId": "nope", "input": "x"}),
        404,
        "NOT_FOUND",
        "Agent not found: nope",
    )
    error(
        as_alice.post("/tasks", {"agentId": "internal", "input": "x"}),
        404,
        "NOT_FOUND",
        "Agent not found: internal",
    )
    assert Task.objects.count() == 0


def test_rest_12_14_completion(as_alice, workers):
    task = as_alice.create()
    as_alice.wait_status(task["id"], "completed")
    body = as_alice.task(task["id"])
    done = body["task"]
    assert done["status"] == "completed" and "startedAt" in done and "completedAt" in done
    assert done["summary"] == "Echo: hello" and "pendingActions" not in body
    result = body["result"]
    assert (result["content"], result["partial"]) == ("Echo: hello", False)
    assert result["usage"] == {"inputTokens": 1, "outputTokens": 2, "totalTokens": 3}
    assert as_alice.get(f"/tasks/{task['id']}/result").json() == {"result": result}


def test_rest_12_15_status_body_and_missing_result(as_alice, workers, gates):
    task, gate = gate_task(as_alice, gates)
    body = at_gate(as_alice, task["id"])
    assert set(body) == {
        "taskId",
        "status",
        "conversationId",
        "attempt",
        "progress",
        "createdAt",
        "updatedAt",
        "startedAt",
    }
    assert (body["status"], body["progress"]) == ("running", "step 1/2 (fetch)")
    error(
        as_alice.get(f"/tasks/{task['id']}/result"),
        404,
        "NOT_FOUND",
        f"Task result not found: {task['id']}",
    )
    gates.release(gate)
    done = as_alice.wait_status(task["id"], "completed")
    assert "completedAt" in done and "error" not in done


def test_rest_12_16_failure(as_alice, workers):
    task = as_alice.create("boom", "go")
    body = as_alice.wait_status(task["id"], "failed")
    assert (body["error"], "completedAt" in body) == ("kaboom", True)
    error(as_alice.get(f"/tasks/{task['id']}/result"), 404, "NOT_FOUND")
    runs = as_alice.get(f"/tasks/{task['id']}/runs").json()
    assert runs["total"] == 1
    (run,) = runs["runs"]
    assert (run["trigger"], run["status"], run["error"]) == ("create", "failed", "kaboom")


def test_rest_12_17_task_conversation(as_alice, workers):
    task = as_alice.create()
    as_alice.wait_status(task["id"], "completed")
    (listed,) = as_alice.get("/conversations").json()["conversations"]
    assert listed["id"] == task["conversationId"]
    assert listed["metadata"] == {"source": "task", "taskId": task["id"]}
    assert "title" not in listed and listed["hidden"] is False
    path = f"/conversations/{task['conversationId']}/messages"
    messages = as_alice.get(path).json()["messages"]
    assert [(m["role"], m["content"]) for m in messages] == [
        ("user", "hello"),
        ("assistant", "Echo: hello"),
    ]
    assert messages[0]["origin"] == "input"
    last = as_alice.get(path + "?order=desc&limit=1").json()
    assert [m["content"] for m in last["messages"]] == ["Echo: hello"] and last["hasMore"] is True
    error(as_alice.get(path + "?order=up"), 400, "VALIDATION_ERROR", "order must be asc or desc")


def test_rest_12_18_pages(as_alice, workers):
    created = [as_alice.create(input=f"m{i}")["id"] for i in range(25)]
    first = as_alice.get("/tasks").json()
    assert (len(first["tasks"]), first["total"], first["limit"], first["offset"]) == (20, 25, 20, 0)
    assert first["hasMore"] is True
    assert [t["id"] for t in first["tasks"]] == created[::-1][:20]  # newest first
    rest = as_alice.get("/tasks?offset=20").json()
    assert len(rest["tasks"]) == 5 and rest["hasMore"] is False
    assert as_alice.get("/tasks?limit=500").json()["limit"] == 100
    for query in ("limit=0", "limit=abc", "offset=-1"):
        error(as_alice.get(f"/tasks?{query}"), 400, "VALIDATION_ERROR")
    error(
        as_alice.get("/tasks?limit=0"), 400, "VALIDATION_ERROR", "limit must be a positive integer"
    )
    error(
        as_alice.get("/tasks?offset=-1"),
        400,
        "VALIDATION_ERROR",
        "offset must be a non-negative integer",
    )


def test_rest_12_19_filters(as_alice, workers, gates):
    done = [as_alice.create(input=f"e{i}") for i in range(2)]
    for task in done:
        as_alice.wait_status(task["id"], "completed")
    held, _ = gate_task(as_alice, gates)
    at_gate(as_alice, held["id"])

    def ids(query):
        response = as_alice.get(f"/tasks?{query}")
        assert response.status_code == 200, response.content
        return {t["id"] for t in response.json()["tasks"]}

    assert ids("agentId=gate") == {held["id"]}
    assert ids("status=completed") == {t["id"] for t in done}
    assert ids("status=pending,running") == {held["id"]}
    assert ids(f"conversationId={done[0]['conversationId']}") == {done[0]["id"]}
    assert ids("conversationId=conv_nope") == set()
    error(as_alice.get("/tasks?status=bogus"), 400, "VALIDATION_ERROR", "Unknown status: bogus")


def test_rest_12_20_spawned_tasks(as_alice, workers):
    conversation = as_alice.post("/conversations", {"agentId": "lead"}).json()["conversation"]
    cid = conversation["id"]
    posted = as_alice.post(f"/conversations/{cid}/messages", {"message": "go"})
    assert posted.status_code == 202, posted.content

    def spawned():
        tasks = as_alice.get(f"/tasks?parentConversationId={cid}").json()["tasks"]
        return tasks[0] if tasks else None

    from .conftest import wait_for

    child = wait_for(spawned, message="the spawned task")
    assert (child["agentId"], child["parentConversationId"]) == ("echo", cid)
    assert child["conversationId"] not in [
        c["id"] for c in as_alice.get("/conversations").json()["conversations"]
    ]
    hidden = as_alice.get(f"/conversations/{child['conversationId']}").json()["conversation"]
    assert hidden["hidden"] is True and hidden["parentConversationId"] == cid
    as_alice.wait_status(child["id"], "completed")

    def notified():
        events = as_alice.events(cid)
        notes = [e for e in events if e["type"] == "task.notification"]
        wakeups = [
            e for e in events if e["type"] == "run.started" and e["data"]["trigger"] == "wakeup"
        ]
        return (events, notes, wakeups) if notes and wakeups else None

    events, notes, wakeups = wait_for(notified, message="the wake-up")
    assert any(e["type"] == "task.status" and e["taskId"] == child["id"] for e in events)
    note = notes[0]
    assert note["data"]["content"].startswith("[task-notification] ")
    assert child["id"] in note["data"]["content"] and note["data"]["taskIds"] == [child["id"]]
    assert wakeups[0]["seq"] > note["seq"]


def test_rest_12_21_wait(as_alice, workers, gates):
    task, gate = gate_task(as_alice, gates)
    at_gate(as_alice, task["id"])
    started = time.monotonic()
    waited = as_alice.get(f"/tasks/{task['id']}/wait?timeout=1")
    assert waited.status_code == 200 and waited.json()["status"] == "running"
    assert 0.9 <= time.monotonic() - started < 3
    import threading

    threading.Timer(0.5, gates.release, args=(gate,)).start()
    started = time.monotonic()
    done = as_alice.get(f"/tasks/{task['id']}/wait?timeout=30")
    assert done.json()["status"] == "completed" and time.monotonic() - started < 5
    # An approval wait (the callable `approver` stands in for the chat `deployer`).
    approval = as_alice.create("approver", "prod")
    started = time.monotonic()
    paused = as_alice.get(f"/tasks/{approval['id']}/wait?timeout=30")
    assert paused.json()["status"] == "waiting_for_input" and time.monotonic() - started < 5
    error(
        as_alice.get(f"/tasks/{task['id']}/wait?timeout=abc"),
        400,
        "VALIDATION_ERROR",
        "timeout must be a non-negative number of seconds",
    )


def test_rest_12_22_wait_bound(as_alice, workers, gates):
    task, _ = gate_task(as_alice, gates)
    at_gate(as_alice, task["id"])
    with agenttasks(MAX_STATUS_WAIT=2):
        started = time.monotonic()
        waited = as_alice.get(f"/tasks/{task['id']}/wait?timeout=1000")
        elapsed = time.monotonic() - started
    assert waited.json()["status"] == "running"
    assert 1.9 <= elapsed < 4
