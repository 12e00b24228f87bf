"""docs/rest.md, scenarios 1–10: identity, the envelope and conventions."""

import logging
import re

import pytest
from django.core.files.storage import FileSystemStorage

from agenttasks import lifecycle
from agenttasks.models import Conversation, Event, File, Task

from .conftest import agenttasks, b64, error

pytestmark = pytest.mark.django_db(transaction=True)

IDENTITY = {"error": {"code": "identity_required", "message": "Authentication required"}}


def nothing_created():
    return (Task.objects.count(), Conversation.objects.count(), Event.objects.count()) == (0, 0, 0)


def test_rest_12_01_no_identity(anonymous):
    calls = [
        anonymous.get("/tasks"),
        anonymous.post("/tasks", {"agentId": "echo", "input": "hello"}),
        anonymous.get("/agents"),
        anonymous.get("/conversations"),
    ]
    for response in calls:
        assert response.status_code == 401
        assert response.json() == IDENTITY
    anonymous.headers["HTTP_AUTHORIZATION"] = "Token not-a-token"
    bad = anonymous.get("/tasks")
    found = error(bad, 401, "identity_required", "Invalid token.")
    assert found["message"] == "Invalid token."
    assert bad["WWW-Authenticate"] == "Token"
    assert nothing_created()


def test_rest_12_01_no_identity_session_first(anonymous, settings):
    """Always 401, even when the first authenticator (sessions) sends no challenge."""
    with agenttasks(AUTHENTICATION_CLASSES=["rest_framework.authentication.SessionAuthentication"]):
        assert anonymous.get("/tasks").json() == IDENTITY
        assert anonymous.get("/tasks").status_code == 401


def test_rest_12_02_anonymous_list_only(anonymous, as_alice):
    ownerless = lifecycle.create(owner=None, agent_id="echo", input="site code")
    as_alice.create()
    with agenttasks(ALLOW_ANONYMOUS_LIST=True):
        listed = anonymous.get("/tasks")
        assert listed.status_code == 200
        body = listed.json()
        assert body["total"] == 1 and [t["id"] for t in body["tasks"]] == [ownerless.id]
        assert "userId" not in body["tasks"][0]
        assert anonymous.get(f"/tasks/{ownerless.id}").json() == IDENTITY
        assert anonymous.post("/tasks", {"agentId": "echo", "input": "x"}).status_code == 401


def test_rest_12_03_anonymous_principal(anonymous, as_alice):
    mine = as_alice.create()
    with agenttasks(ALLOW_ANONYMOUS=True):
        created = anonymous.post("/tasks", {"agentId": "echo", "input": "hello"})
        assert created.status_code == 201
        task = created.json()["task"]
        assert "userId" not in task
        assert anonymous.get(f"/tasks/{task['id']}").status_code == 200
        error(
            as_alice.get(f"/tasks/{task['id']}"),
            403,
            "FORBIDDEN",
            "You do not have access to this task",
        )
        assert task["id"] not in [t["id"] for t in as_alice.get("/tasks").json()["tasks"]]
        error(anonymous.get(f"/tasks/{mine['id']}"), 403, "FORBIDDEN")
        error(
            anonymous.get(f"/conversations/{mine['conversationId']}"),
            403,
            "FORBIDDEN",
            "You do not have access to this conversation",
        )


def test_rest_12_04_isolation(as_alice, as_bob, workers):
    task = as_alice.create()
    as_alice.wait_status(task["id"], "completed")
    before = as_alice.task(task["id"])
    events_before = Event.objects.count()
    tid = task["id"]
    calls = [
        as_bob.get(f"/tasks/{tid}"),
        as_bob.get(f"/tasks/{tid}/status"),
        as_bob.get(f"/tasks/{tid}/wait"),
        as_bob.get(f"/tasks/{tid}/result"),
        as_bob.get(f"/tasks/{tid}/runs"),
        as_bob.get(f"/tasks/{tid}/comments"),
        as_bob.post(f"/tasks/{tid}/comments", {"content": "mine now"}),
        as_bob.post(f"/tasks/{tid}/cancel"),
        as_bob.post(f"/tasks/{tid}/retry"),
    ]
    for response in calls:
        error(response, 403, "FORBIDDEN", "You do not have access to this task")
    error(
        as_bob.get(f"/conversations/{task['conversationId']}"),
        403,
        "FORBIDDEN",
        "You do not have access to this conversation",
    )
    assert as_alice.task(tid) == before
    assert Event.objects.count() == events_before
    assert as_bob.get("/tasks").json()["total"] == 0


def test_rest_12_05_unknown_route_method_slash(as_alice, anonymous):
    task = as_alice.create()
    assert as_alice.get("/nope").json() == {
        "error": {"code": "NOT_FOUND", "message": "Route not found: GET /api/agents/nope"}
    }
    assert anonymous.get("/nope").status_code == 404  # answered whoever asks
    gone = as_alice.delete(f"/tasks/{task['id']}")
    error(
        gone,
        405,
        "METHOD_NOT_ALLOWED",
        f"Method DELETE is not allowed on /api/agents/tasks/{task['id']}",
    )
    assert "GET" in gone["Allow"]
    error(anonymous.delete(f"/tasks/{task['id']}"), 401, "identity_required")  # identity first
    slash = as_alice.get(f"/tasks/{task['id']}/")
    assert slash.status_code == 200 and slash.json() == as_alice.task(task["id"])
    listed = as_alice.post("/tasks/", {"agentId": "echo", "input": "slash"})
    assert listed.status_code == 201  # a POST with a trailing slash is never redirected
    error(as_alice.get("/tasks/not-an-id"), 404, "NOT_FOUND", "Task not found: not-an-id")
    error(as_alice.get("/tasks/%00"), 404, "NOT_FOUND")


def test_rest_12_06_body_syntax(as_alice):
    error(as_alice.post("/tasks", raw="{bad json"), 400, "VALIDATION_ERROR", "Malformed JSON body")
    error(
        as_alice.post("/tasks", raw="[1,2]"),
        400,
        "VALIDATION_ERROR",
        "The request body must be a JSON object",
    )
    error(
        as_alice.post("/tasks", raw='{"agentId": "echo", "input": "x"}', content_type="text/plain"),
        415,
        "unsupported_media_type",
        'Unsupported media type "text/plain" in request.',
    )
    error(as_alice.post("/tasks", raw='{"input": NaN}'), 400, "VALIDATION_ERROR")
    error(as_alice.post("/tasks", raw="[" * 100000), 400, "VALIDATION_ERROR")
    with agenttasks(MAX_REQUEST_BYTES=50):
        error(
            as_alice.post("/tasks", {"agentId": "echo", "input": "x" * 100}),
            400,
            "VALIDATION_ERROR",
            "The request body is larger than 50 bytes",
        )
    assert nothing_created()


ID = re.compile(r"^(task|conv|run|taskres|file|evt|act|comment)_[A-Za-z0-9_-]{21}$")
DATE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
CAMEL = re.compile(r"^[a-z][A-Za-z0-9]*$")
ID_FIELDS = {
    "taskId": "task",
    "conversationId": "conv",
    "parentConversationId": "conv",
    "runId": "run",
    "activeRunId": "run",
    "actionId": "act",
    "commentId": "comment",
}
OPAQUE = {"metadata", "args", "data", "state", "answers"}


def check_formats(value, key=None, parent=None):
    """Every id, date and key of an answer follows docs/rest.md#responses; no value is null."""
    assert value is not None, f"null at {key}"
    if isinstance(value, dict):
        for k, v in value.items():
            assert CAMEL.match(k), f"key {k!r} is not camelCase"
            if k in OPAQUE and k != "data":
                assert v is not None
                continue
            if k == "nextCursor":  # the one null: a page that is the last (docs/rest.md#pagination)
                assert v is None or (isinstance(v, str) and v), v
                continue
            check_formats(v, k, value)
    elif isinstance(value, list):
        for item in value:
            check_formats(item, key, parent)
    elif isinstance(value, str):
        if key in ("createdAt", "updatedAt", "startedAt", "completedAt", "expiresAt", "decidedAt"):
            assert DATE.match(value), f"{key}={value!r}"
        if key in ID_FIELDS:
            assert ID.match(value) and value.startswith(ID_FIELDS[key] + "_"), (key, value)
        if key == "id" and "question" not in parent:  # question ids are the agent's ("q1")
            assert ID.match(value), value
        if key == "actionIds":
            assert value.startswith("act_")


def test_rest_12_07_formats(as_alice, workers):
    task = as_alice.create(
        "approver",
        "prod",
        files=[{"name": "a.txt", "content": b64(b"hello"), "mimeType": "text/plain"}],
    )
    as_alice.wait_status(task["id"], "waiting_for_input")
    detail = as_alice.task(task["id"])
    (action,) = detail["pendingActions"]
    conversation = task["conversationId"]
    answered = as_alice.post(
        f"/conversations/{conversation}/actions/{action['id']}", {"approved": True}
    )
    as_alice.wait_status(task["id"], "completed")
    comment = as_alice.post(f"/tasks/{task['id']}/comments", {"content": "more"})
    as_alice.wait_status(task["id"], "completed", "waiting_for_input")
    file_id = task["files"][0]["id"]
    answers = [
        detail,
        answered.json(),
        comment.json(),
        as_alice.task(task["id"]),
        as_alice.status(task["id"]),
        as_alice.get(f"/tasks/{task['id']}/runs").json(),
        as_alice.get(f"/tasks/{task['id']}/comments").json(),
        as_alice.get("/tasks").json(),
        as_alice.get("/conversations").json(),
        as_alice.get(f"/conversations/{conversation}").json(),
        as_alice.get(f"/conversations/{conversation}/messages").json(),
        as_alice.get(f"/conversations/{conversation}/actions?status=all").json(),
        {"events": as_alice.events(conversation)},
        as_alice.get(f"/files/{file_id}").json(),
    ]
    for body in answers:
        check_formats(body)
    events = {e["type"] for e in as_alice.events(conversation)}
    assert {"action.requested", "action.resolved", "message.user"} <= events


def test_rest_12_08_never_a_500_for_bad_input(as_alice):
    """The property-based run over the whole document is tests/api/test_api_schemathesis.py."""
    weird = [
        as_alice.get("/tasks?limit=99999999999999999999999999&offset=99999999999999999999999"),
        as_alice.get("/tasks?agentId=%00&conversationId=%00"),
        as_alice.get("/tasks/%00/status"),
        as_alice.get("/conversations/%00/events?after=99999999999999999999999999999"),
        as_alice.post("/tasks", {"agentId": "echo", "input": "nul\x00"}),
        as_alice.post("/tasks", {"agentId": "echo", "input": "x", "metadata": {"k": "\x00"}}),
        as_alice.post("/tasks", raw='{"agentId": "echo", "input": "\\ud800"}'),
        as_alice.post("/tasks", raw='{"agentId": "echo", "input": "x", "metadata": {"n": 1e999}}'),
        as_alice.post("/conversations", {"agentId": "echo", "title": "t\x00"}),
        as_alice.get("/tasks/" + "x" * 5000),
    ]
    for response in weird:
        assert response.status_code < 500, response.content
        assert set(response.json()) == {
            "tasks",
            "total",
            "limit",
            "offset",
            "hasMore",
            "nextCursor",
        } or (set(response.json()) == {"error"})
    assert Task.objects.count() == 0


class BrokenStorage(FileSystemStorage):
    def _save(self, name, content):
        raise OSError("disk on fire")


def test_rest_12_09_real_faults(as_alice, settings, caplog):
    settings.STORAGES = {
        **settings.STORAGES,
        "broken": {"BACKEND": "tests.api.test_api_identity.BrokenStorage"},
    }
    with agenttasks(FILE_STORAGE="broken"), caplog.at_level(logging.ERROR, "agenttasks.api"):
        response = as_alice.post(
            "/tasks",
            {
                "agentId": "docs",
                "input": "read it",
                "files": [
                    {"name": "a.txt", "content": b64(b"0123456789"), "mimeType": "text/plain"}
                ],
            },
        )
    assert response.status_code == 500
    assert response.json() == {
        "error": {"code": "INTERNAL_ERROR", "message": "An unexpected error occurred"}
    }
    assert b"Traceback" not in response.content and b"disk on fire" not in response.content
    assert any(r.exc_info and "disk on fire" in str(r.exc_info[1]) for r in caplog.records)
    assert as_alice.get("/tasks").json()["total"] == 0
    assert nothing_created() and File.objects.count() == 0


def test_rest_12_10_throttling(as_alice, as_bob):
    with agenttasks(THROTTLE_RATES={"write": "2/min"}):
        as_alice.create()
        as_alice.create()
        third = as_alice.post("/tasks", {"agentId": "echo", "input": "hello"})
        found = error(third, 429, "rate_limited")
        wait = found["details"]["retryAfter"]
        assert wait > 0 and third["Retry-After"] == str(wait)
        assert found["message"] == f"Request was throttled; try again in {wait} seconds"
        assert as_alice.get("/tasks").status_code == 200  # reads have no rate
        as_bob.create()
    assert Task.objects.count() == 3


def test_csrf_failure_under_session_authentication(alice):
    from django.test import Client

    client = Client(enforce_csrf_checks=True)
    client.force_login(alice)
    assert client.get("/api/agents/tasks").status_code == 200  # the session is a user
    response = client.post(
        "/api/agents/tasks",
        data='{"agentId": "echo", "input": "x"}',
        content_type="application/json",
    )
    found = error(response, 403, "FORBIDDEN")
    assert found["message"].startswith("CSRF Failed: ")
    assert Task.objects.count() == 0


def test_no_content_negotiation(as_alice):
    response = as_alice.get("/agents", HTTP_ACCEPT="text/html")
    assert response.status_code == 200 and response["Content-Type"] == "application/json"


def test_empty_and_optional_bodies(as_alice, workers):
    task = as_alice.create()
    as_alice.wait_status(task["id"], "completed")
    assert as_alice.post(f"/tasks/{task['id']}/retry", raw="").status_code == 409
    error(
        as_alice.post("/tasks", raw=""), 400, "VALIDATION_ERROR", "agentId and input are required"
    )
    # A body that names no content type is read as JSON.
    response = as_alice.client.post(
        "/api/agents/tasks",
        data=b'{"agentId": "echo", "input": "typed"}',
        content_type="",
        **as_alice.headers,
    )
    assert response.status_code == 201, response.content


def test_a_body_beyond_data_upload_max_memory_size_is_read(as_alice, settings):
    """MAX_REQUEST_BYTES, not Django's DATA_UPLOAD_MAX_MEMORY_SIZE, bounds these JSON bodies."""
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1024
    data = b"x" * 3000
    task = as_alice.create(
        "echo",
        "big",
        files=[{"name": "big.bin", "content": b64(data), "mimeType": "application/octet-stream"}],
    )
    assert task["files"][0]["size"] == 3000
