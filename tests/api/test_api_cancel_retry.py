"""docs/rest.md, scenarios 39–48: cancel and retry.

Agents run on the in-process worker pool (scenario 39 deliberately has none). Scenario 42 uses
the callable `approver` in place of the chat agent `deployer`.
"""

import pytest

from agenttasks.models import Event, Run, Task

from ..conftest import run_threads
from .conftest import ALLOW_LOOPBACK, agenttasks, at_gate, error, gate_task, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def test_rest_12_39_cancel_pending(as_alice, gates, receiver):
    with agenttasks(**ALLOW_LOOPBACK):
        task, _ = gate_task(as_alice, gates, callbackUrl=receiver.url)
        first = as_alice.post(f"/tasks/{task['id']}/cancel")
        assert first.status_code == 200
        cancelled = first.json()["task"]
        assert cancelled["status"] == "cancelled" and "completedAt" in cancelled
        (run,) = as_alice.get(f"/tasks/{task['id']}/runs").json()["runs"]
        assert run["status"] == "cancelled"
        wait_for(
            lambda: Event.objects.filter(type="callback.delivered").exists(),
            message="the cancelled callback",
        )
        events = Event.objects.count()
        second = as_alice.post(f"/tasks/{task['id']}/cancel")
        assert second.status_code == 200 and second.json() == first.json()
    assert [b["status"] for b in receiver.bodies()] == ["cancelled"]
    assert Event.objects.count() == events


def test_rest_12_40_cancel_running(as_alice, workers, gates):
    task, gate = gate_task(as_alice, gates)
    at_gate(as_alice, task["id"])
    response = as_alice.post(f"/tasks/{task['id']}/cancel", {})
    assert response.status_code == 200 and response.json()["task"]["status"] == "cancelled"
    run = wait_for(
        lambda: (r := Run.objects.get(pk=task["runId"])).ended_at and r,
        message="the handler observed the stop",
    )
    assert run.status == "cancelled"
    gates.release(gate)
    assert as_alice.status(task["id"])["status"] == "cancelled"
    error(as_alice.get(f"/tasks/{task['id']}/result"), 404, "NOT_FOUND")


def test_rest_12_41_graceful_cancel(as_alice, workers, gates, receiver):
    with agenttasks(**ALLOW_LOOPBACK):
        task, gate = gate_task(as_alice, gates, callbackUrl=receiver.url)
        at_gate(as_alice, task["id"])
        error(
            as_alice.post(f"/tasks/{task['id']}/cancel", {"graceful": "yes"}),
            400,
            "VALIDATION_ERROR",
            "graceful must be a boolean",
        )
        response = as_alice.post(f"/tasks/{task['id']}/cancel", {"graceful": True})
        assert response.status_code == 202
        body = response.json()["task"]
        assert (body["status"], body["stopRequested"]) == ("running", "after_turn")
        again = as_alice.post(f"/tasks/{task['id']}/cancel", {"graceful": True})
        assert again.status_code == 202
        gates.release(gate)
        as_alice.wait_status(task["id"], "cancelled")
        assert as_alice.get(f"/tasks/{task['id']}/result").json()["result"]["content"] == "released"
        wait_for(lambda: receiver.bodies(), message="the cancelled callback")
    assert [b["status"] for b in receiver.bodies()] == ["cancelled"]


def test_rest_12_42_cancel_waiting(as_alice, workers):
    task = as_alice.create("approver", "prod")
    as_alice.wait_status(task["id"], "waiting_for_input")
    (action,) = as_alice.task(task["id"])["pendingActions"]
    response = as_alice.post(f"/tasks/{task['id']}/cancel")
    assert response.status_code == 200 and response.json()["task"]["status"] == "cancelled"
    actions = as_alice.get(f"/conversations/{task['conversationId']}/actions?status=all").json()
    assert [a["status"] for a in actions["actions"]] == ["cancelled"]
    error(
        as_alice.post(
            f"/conversations/{task['conversationId']}/actions/{action['id']}", {"approved": True}
        ),
        409,
        "action_resolved",
        f"Action {action['id']} is already cancelled",
    )


def test_rest_12_43_cancel_finished(as_alice, workers):
    done = as_alice.create()
    failed = as_alice.create("boom", "go")
    as_alice.wait_status(done["id"], "completed")
    as_alice.wait_status(failed["id"], "failed")
    for task, status in ((done, "completed"), (failed, "failed")):
        found = error(
            as_alice.post(f"/tasks/{task['id']}/cancel"),
            409,
            "task_finished",
            f"Task {task['id']} has already {status}",
        )
        assert found["details"] == {"status": status}


def test_rest_12_44_retry(as_alice, workers):
    task = as_alice.create("boom", "go")
    as_alice.wait_status(task["id"], "failed")
    response = as_alice.post(f"/tasks/{task['id']}/retry")
    assert response.status_code == 202, response.content
    retried = response.json()["task"]
    assert (retried["status"], retried["attempt"]) == ("pending", 2)
    assert retried["runId"] != task["runId"] and "error" not in retried
    assert "startedAt" not in retried and "completedAt" not in retried  # cleared by the retry
    messages = as_alice.get(f"/conversations/{task['conversationId']}/messages").json()["messages"]
    retry_prompts = [m for m in messages if m.get("origin") == "retry"]
    assert retry_prompts[0]["content"].startswith("A previous attempt at this task failed: ")
    wait_for(
        lambda: (b := as_alice.status(task["id"]))["status"] == "failed" and b["attempt"] == 2,
        message="the second failure",
    )
    runs = as_alice.get(f"/tasks/{task['id']}/runs").json()["runs"]
    assert [(r["trigger"], r["attempt"]) for r in runs] == [("create", 1), ("retry", 2)]


def test_rest_12_45_not_retryable(as_alice, workers, gates):
    done = as_alice.create()
    as_alice.wait_status(done["id"], "completed")
    cancelled, _ = gate_task(as_alice, gates)
    as_alice.post(f"/tasks/{cancelled['id']}/cancel")
    running, _ = gate_task(as_alice, gates)
    at_gate(as_alice, running["id"])
    for task, status in ((done, "completed"), (cancelled, "cancelled"), (running, "running")):
        found = error(
            as_alice.post(f"/tasks/{task['id']}/retry"),
            409,
            "task_not_retryable",
            f"Only a failed task can be retried; task {task['id']} is {status}",
        )
        assert found["details"] == {"status": status}


def test_rest_12_46_retry_ceiling(as_alice, workers):
    with agenttasks(MAX_ATTEMPTS=2):
        task = as_alice.create("boom", "go")
        as_alice.wait_status(task["id"], "failed")
        assert as_alice.post(f"/tasks/{task['id']}/retry").status_code == 202
        wait_for(lambda: as_alice.status(task["id"])["attempt"] == 2)
        as_alice.wait_status(task["id"], "failed")
        found = error(
            as_alice.post(f"/tasks/{task['id']}/retry"),
            409,
            "retry_limit",
            f"Task {task['id']} has already used its 2 attempts; create a new task instead",
        )
    assert found["details"] == {"limit": 2, "attempt": 2}


def test_rest_12_47_retry_race(as_alice, workers):
    task = as_alice.create("boom", "go")
    as_alice.wait_status(task["id"], "failed")
    workers.paused = True
    responses = run_threads(lambda i: as_alice.post(f"/tasks/{task['id']}/retry"), 2)
    codes = sorted(r.status_code for r in responses)
    assert codes == [202, 409], [r.content for r in responses]
    loser = next(r for r in responses if r.status_code == 409).json()["error"]["code"]
    assert loser in ("retry_conflict", "task_not_retryable")
    assert Task.objects.get(pk=task["id"]).attempt == 2


def test_rest_12_48_active_task_limit(as_alice, as_bob, workers, gates):
    with agenttasks(MAX_ACTIVE_TASKS_PER_USER=2):
        first, gate = gate_task(as_alice, gates)
        second, _ = gate_task(as_alice, gates)
        at_gate(as_alice, first["id"])
        at_gate(as_alice, second["id"])
        count = Task.objects.count()
        found = error(
            as_alice.post("/tasks", {"agentId": "echo", "input": "third"}),
            409,
            "task_limit",
            "You already have 2 active tasks; wait for one to finish",
        )
        assert found["details"] == {"limit": 2} and Task.objects.count() == count
        as_bob.create()
        gates.release(gate)
        as_alice.wait_status(first["id"], "completed")
        as_alice.create(input="now there is room")
