"""docs/rest.md, scenarios 62–65: the event log and the live stream.

The stream is read with httpx over real servers: Django's threaded WSGI live server (what
`manage.py runserver` runs) and uvicorn (ASGI, the async streaming path). Agents run on the
in-process worker pool, so a new event reaches the stream through the in-process hub (and, on
PostgreSQL, NOTIFY) or the polling fallback.
"""

import json
import time

import httpx
import pytest

from .conftest import agenttasks, at_gate, error, gate_task, wait_for

# Behaves otherwise on PostgreSQL: new events and deltas reach the stream through NOTIFY.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.both]

TERMINAL = ("completed", "failed", "cancelled")


# --- servers and an SSE reader ----------------------------------------------------------------


@pytest.fixture(params=["wsgi", "asgi"])
def server(request):
    return request.getfixturevalue(f"{request.param}_server")


class Stream:
    """Read an SSE response message by message: {"id"?, "event"?, "data"?, "comment"?}."""

    def __init__(self, response):
        self.response = response
        self.lines = response.iter_lines()
        self.closed = False

    def next(self) -> dict | None:
        message: dict = {}
        for line in self.lines:
            if line == "":
                if message:
                    return message
                continue
            if line.startswith(":"):
                message.setdefault("comment", line[1:].strip())
                continue
            field, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if field == "data":
                message["data"] = json.loads(value)
            else:
                message[field] = value
        self.closed = True
        return message or None

    def events(self):
        while (message := self.next()) is not None:
            yield message


def open_stream(client: httpx.Client, base, path, token, headers=None):
    request = client.build_request(
        "GET",
        base + "/api/agents" + path,
        headers={"Authorization": f"Token {token}", **(headers or {})},
    )
    return client.send(request, stream=True)


@pytest.fixture
def token(as_alice):
    return as_alice.headers["HTTP_AUTHORIZATION"].split()[1]


# --- scenarios -------------------------------------------------------------------------------


def test_rest_12_62_event_log(as_alice, workers):
    task = as_alice.create()
    as_alice.wait_status(task["id"], "completed")
    events = as_alice.events(task["conversationId"])
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    kinds = [(e["type"], e["data"].get("from"), e["data"].get("to")) for e in events[:7]]
    assert kinds == [
        ("message.user", None, None),
        ("task.status", None, "pending"),
        ("run.started", None, None),
        ("task.status", "pending", "running"),
        ("message.assistant", None, None),
        ("run.finished", None, None),
        ("task.status", "running", "completed"),
    ]
    assert events[0]["data"]["origin"] == "input" and "from" not in events[1]["data"]
    last = events[6]
    assert (last["runId"], last["data"]["runId"], last["data"]["attempt"]) == (
        task["runId"],
        task["runId"],
        1,
    )
    page = as_alice.get(f"/conversations/{task['conversationId']}/events?after=2&limit=2").json()
    assert [e["seq"] for e in page["events"]] == [3, 4]
    assert page["hasMore"] is True and page["lastSeq"] == events[-1]["seq"]
    assert (page["after"], page["limit"]) == (2, 2)
    error(
        as_alice.get(f"/conversations/{task['conversationId']}/events?after=-1"),
        400,
        "VALIDATION_ERROR",
        "after must be a non-negative integer",
    )


def test_rest_12_63_stream(as_alice, workers, gates, server, token):
    task, gate = gate_task(as_alice, gates)
    at_gate(as_alice, task["id"])
    path = f"/conversations/{task['conversationId']}/events/stream?after=0&until=terminal"
    with httpx.Client(timeout=20) as client:
        response = open_stream(client, server, path, token)
        try:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            assert response.headers["cache-control"] == "no-cache"
            assert response.headers["x-accel-buffering"] == "no"
            assert "content-length" not in response.headers
            stream = Stream(response)
            snapshot = stream.next()
            assert snapshot["event"] == "snapshot" and "id" not in snapshot
            assert snapshot["data"]["task"]["status"] == "running"
            assert snapshot["data"]["conversationId"] == task["conversationId"]
            seen = []
            for message in stream.events():
                assert "comment" not in message or "data" not in message
                if "data" not in message:
                    continue
                assert int(message["id"]) == message["data"]["seq"]
                assert message["event"] == message["data"]["type"]
                seen.append(message["data"])
                if message["event"] == "task.progress":
                    assert message["data"]["data"]["progress"] == "step 1/2 (fetch)"
                    gates.release(gate)
            assert stream.closed
        finally:
            response.close()
    assert [e["seq"] for e in seen] == list(range(1, len(seen) + 1))
    assert (seen[-1]["type"], seen[-1]["data"]["to"]) == ("task.status", "completed")


def test_rest_12_64_resume(as_alice, workers, gates, server, token):
    task, gate = gate_task(as_alice, gates)
    at_gate(as_alice, task["id"])
    base_path = f"/conversations/{task['conversationId']}/events/stream"
    with httpx.Client(timeout=20) as client:
        first = open_stream(client, server, base_path + "?after=0&until=terminal", token)
        stream = Stream(first)
        assert stream.next()["event"] == "snapshot"
        got = []
        while len(got) < 4:
            message = stream.next()
            if "data" in message:
                got.append(int(message["id"]))
        first.close()  # dropped after seq 4
        assert got == [1, 2, 3, 4]
        gates.release(gate)
        as_alice.wait_status(task["id"], "completed")
        again = open_stream(
            client, server, base_path + "?after=1&until=terminal", token, {"Last-Event-ID": "4"}
        )
        try:
            stream = Stream(again)
            assert stream.next()["event"] == "snapshot"
            rest = [int(m["id"]) for m in stream.events() if "data" in m]
        finally:
            again.close()
    log = as_alice.events(task["conversationId"])
    terminal = next(
        e["seq"] for e in log if e["type"] == "task.status" and e["data"]["to"] in TERMINAL
    )
    assert rest == list(range(5, terminal + 1))


def test_rest_12_65_keepalive_limits_early_errors(as_alice, as_bob, workers, gates, server, token):
    task, _ = gate_task(as_alice, gates)
    at_gate(as_alice, task["id"])
    path = f"/conversations/{task['conversationId']}/events/stream"
    with (
        agenttasks(STREAM_KEEPALIVE_SECONDS=1, STREAM_MAX_SECONDS=3),
        httpx.Client(timeout=20) as client,
    ):
        started = time.monotonic()
        response = open_stream(client, server, path, token)
        try:
            stream = Stream(response)
            assert stream.next()["event"] == "snapshot"
            beats = []
            for message in stream.events():
                assert "data" not in message  # nothing happens at the gate
                if message.get("comment") == "keep-alive":
                    beats.append(time.monotonic() - started)
            elapsed = time.monotonic() - started
        finally:
            response.close()
        assert 2.5 <= elapsed < 5, elapsed
        assert 2 <= len(beats) <= 3, beats
        assert all(b - a > 0.7 for a, b in zip(beats, beats[1:], strict=False)), beats
        bad = client.get(
            server + "/api/agents" + path + "?until=soon",
            headers={"Authorization": f"Token {token}"},
        )
        assert bad.status_code == 400 and bad.headers["content-type"] == "application/json"
        assert bad.json()["error"]["message"] == "until must be terminal"
        bob = as_bob.headers["HTTP_AUTHORIZATION"]
        foreign = client.get(server + "/api/agents" + path, headers={"Authorization": bob})
        assert foreign.status_code == 403 and foreign.json()["error"]["code"] == "FORBIDDEN"


def test_stream_resumes_from_a_middle_event_exactly_once(as_alice, workers, gates, server, token):
    """Events appended while no stream is open, and while one is: each arrives exactly once."""
    conversation = as_alice.post("/conversations", {"agentId": "echo"}).json()["conversation"]
    cid = conversation["id"]
    for i in range(3):
        as_alice.post(f"/conversations/{cid}/messages", {"message": f"m{i}"})
        wait_for(
            lambda i=i: (
                len(
                    [
                        m
                        for m in as_alice.get(f"/conversations/{cid}/messages").json()["messages"]
                        if m["role"] == "assistant"
                    ]
                )
                == i + 1
            )
        )
    log = as_alice.events(cid)
    middle = log[len(log) // 2]["seq"]
    received = []
    with httpx.Client(timeout=20) as client:
        response = open_stream(
            client,
            server,
            f"/conversations/{cid}/events/stream",
            token,
            {"Last-Event-ID": str(middle)},
        )
        try:
            stream = Stream(response)
            assert stream.next()["event"] == "snapshot"
            while len(received) < len(log) - middle:
                message = stream.next()
                if "data" in message:
                    received.append(int(message["id"]))
            as_alice.post(f"/conversations/{cid}/messages", {"message": "live"})
            started = time.monotonic()
            latency = None
            while True:
                message = stream.next()
                if "data" in message:
                    received.append(int(message["id"]))
                    if latency is None:
                        latency = time.monotonic() - started
                    if message["data"]["type"] == "run.finished":
                        break
            # Committed events reach the client within 1 s (the poll alone is 0.2 s).
            assert latency < 1.0, latency
        finally:
            response.close()
    total = as_alice.events(cid)
    assert received == list(range(middle + 1, received[-1] + 1))
    assert len(received) == len(set(received)) and received[-1] <= total[-1]["seq"]


def test_stream_ends_when_the_conversation_is_deleted(as_alice, workers, gates, server, token):
    task, _ = gate_task(as_alice, gates)
    at_gate(as_alice, task["id"])
    with httpx.Client(timeout=20) as client:
        response = open_stream(
            client, server, f"/conversations/{task['conversationId']}/events/stream", token
        )
        try:
            stream = Stream(response)
            assert stream.next()["event"] == "snapshot"
            assert as_alice.delete(f"/conversations/{task['conversationId']}").status_code == 204
            started = time.monotonic()
            list(stream.events())
            assert stream.closed and time.monotonic() - started < 5
        finally:
            response.close()


def test_until_terminal_needs_a_tasks_conversation(as_alice):
    conversation = as_alice.post("/conversations", {"agentId": "echo"}).json()["conversation"]
    error(
        as_alice.get(f"/conversations/{conversation['id']}/events/stream?until=terminal"),
        400,
        "VALIDATION_ERROR",
        "until=terminal needs a task's conversation",
    )


def test_a_fault_after_the_start_sends_an_error_frame(
    as_alice, workers, monkeypatch, token, wsgi_server
):
    from agenttasks.api import streams

    task = as_alice.create()
    as_alice.wait_status(task["id"], "completed")

    def broken(self):
        raise RuntimeError("database gone")

    monkeypatch.setattr(streams.EventStream, "poll", broken)
    with httpx.Client(timeout=20) as client:
        response = open_stream(
            client, wsgi_server, f"/conversations/{task['conversationId']}/events/stream", token
        )
        try:
            stream = Stream(response)
            assert stream.next()["event"] == "snapshot"
            failure = stream.next()
            assert failure == {
                "event": "error",
                "data": {
                    "error": {"code": "INTERNAL_ERROR", "message": "An unexpected error occurred"}
                },
            }
            assert stream.next() is None
        finally:
            response.close()


def test_plain_endpoints_under_both_servers(as_alice, server, token):
    """Bodies, errors and 405s are the same under runserver's WSGI and under ASGI."""
    headers = {"Authorization": f"Token {token}"}
    with httpx.Client(base_url=server + "/api/agents", headers=headers, timeout=20) as client:
        created = client.post("/tasks/", json={"agentId": "echo", "input": "over http"})
        assert created.status_code == 201, created.text
        task = created.json()["task"]
        assert created.headers["location"] == f"/api/agents/tasks/{task['id']}"
        assert client.get(f"/tasks/{task['id']}").json()["task"]["id"] == task["id"]
        bad = client.post("/tasks", content=b"{bad", headers={"Content-Type": "application/json"})
        assert bad.status_code == 400 and bad.json()["error"]["message"] == "Malformed JSON body"
        gone = client.delete(f"/tasks/{task['id']}")
        assert gone.status_code == 405 and "GET" in gone.headers["allow"]
        missing = client.get("/nope")
        assert missing.json()["error"]["message"] == "Route not found: GET /api/agents/nope"
