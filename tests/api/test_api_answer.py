"""docs/rest.md#the-status-body, #waiting and #responses: the answer in one call.

The status body carries `summary` once the task has one; `/wait?include=result` carries the
TaskResult; every 201 has a `Location` (and the OpenAPI document says so).
"""

import pytest

from .conftest import error

pytestmark = pytest.mark.django_db(transaction=True)


def test_status_and_wait_carry_the_summary(as_alice, workers):
    task = as_alice.create()
    done = as_alice.get(f"/tasks/{task['id']}/wait?timeout=10").json()
    assert (done["status"], done["summary"]) == ("completed", "Echo: hello")
    assert "result" not in done  # only when asked for
    assert as_alice.status(task["id"])["summary"] == "Echo: hello"
    failed = as_alice.create("boom", "go")
    body = as_alice.get(f"/tasks/{failed['id']}/wait?timeout=10").json()
    assert (body["status"], body["summary"], body["error"]) == ("failed", "kaboom", "kaboom")


def test_create_then_wait_with_the_result_is_two_calls(as_alice, workers):
    created = as_alice.post("/tasks", {"agentId": "echo", "input": "hello"})
    task_id = created.json()["task"]["id"]
    waited = as_alice.get(f"/tasks/{task_id}/wait?timeout=10&include=result")
    assert waited.status_code == 200
    body = waited.json()
    assert body["status"] == "completed" and body["summary"] == "Echo: hello"
    assert body["result"] == as_alice.get(f"/tasks/{task_id}/result").json()["result"]
    assert (body["result"]["content"], body["result"]["partial"]) == ("Echo: hello", False)


def test_include_result_without_a_result_and_a_bad_include(as_alice, workers):
    failed = as_alice.create("boom", "go")
    body = as_alice.get(f"/tasks/{failed['id']}/wait?timeout=10&include=result").json()
    assert body["status"] == "failed" and "result" not in body
    error(
        as_alice.get(f"/tasks/{failed['id']}/wait?include=everything"),
        400,
        "VALIDATION_ERROR",
        "include must be result",
    )


def test_include_result_carries_a_partial_result(as_alice, workers):
    task = as_alice.create("clarify", "convert it")
    body = as_alice.get(f"/tasks/{task['id']}/wait?timeout=10&include=result").json()
    assert body["status"] == "waiting_for_input"
    assert body["result"]["partial"] is True and body["result"]["content"] == "Which format?"
    assert body["summary"] == "Which format?"  # the task has a result, so a summary
    assert as_alice.status(task["id"])["summary"] == "Which format?"


def test_every_201_has_a_location(as_alice):
    task = as_alice.post("/tasks", {"agentId": "echo", "input": "hello"})
    assert task.status_code == 201
    assert task["Location"] == f"/api/agents/tasks/{task.json()['task']['id']}"
    conversation = as_alice.post("/conversations", {"agentId": "echo"})
    assert conversation.status_code == 201
    conversation_id = conversation.json()["conversation"]["id"]
    assert conversation["Location"] == f"/api/agents/conversations/{conversation_id}"


def test_a_comment_201_has_a_location(as_alice, workers):
    task = as_alice.create()
    as_alice.wait_status(task["id"], "completed")
    comment = as_alice.post(f"/tasks/{task['id']}/comments", {"content": "again"})
    assert comment.status_code == 201
    assert comment["Location"] == f"/api/agents/tasks/{task['id']}/comments"


def test_the_document_declares_location_on_every_201_and_the_wait_result(anonymous):
    document = anonymous.get("/docs/openapi.json").json()
    created = [
        (path, method, operation["responses"]["201"])
        for path, operations in document["paths"].items()
        for method, operation in operations.items()
        if "201" in operation.get("responses", {})
    ]
    assert len(created) == 4, created
    for path, method, response in created:
        assert "Location" in response.get("headers", {}), (path, method)
    wait = document["paths"]["/tasks/{taskId}/wait"]["get"]
    assert "include" in {p["name"] for p in wait["parameters"]}
    schema = wait["responses"]["200"]["content"]["application/json"]["schema"]["$ref"]
    properties = document["components"]["schemas"][schema.rsplit("/", 1)[1]]["properties"]
    assert {"summary", "result"} <= set(properties)
    status = document["paths"]["/tasks/{taskId}/status"]["get"]["responses"]["200"]
    status_schema = status["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[1]
    assert "summary" in document["components"]["schemas"][status_schema]["properties"]
