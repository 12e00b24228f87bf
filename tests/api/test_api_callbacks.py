"""docs/rest.md, scenarios 49–53: callbacks, seen from the API (in-process workers).

Callback jobs run at once in the thread that commits the ending (the recording queue); a stub
resolver answers name lookups, so no request ever leaves loopback.
"""

import hashlib
import hmac
import json
import logging

import pytest

from agenttasks.delivery import callbacks
from agenttasks.models import Task

from .conftest import ALLOW_LOOPBACK, agenttasks, error, gate_task, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def resolver(monkeypatch):
    """A stub DNS: host -> addresses."""
    answers: dict = {}
    monkeypatch.setattr(callbacks, "resolve", lambda host, port: list(answers.get(host, [])))
    return answers


def callback_events(api, task, kind):
    return [e for e in api.events(task["conversationId"]) if e["type"] == kind]


def test_rest_12_49_delivered(as_alice, workers, receiver):
    with agenttasks(**ALLOW_LOOPBACK):
        task = as_alice.create(callbackUrl=receiver.url)
        as_alice.wait_status(task["id"], "completed")
        delivered = wait_for(lambda: callback_events(as_alice, task, "callback.delivered"))
    (request,) = receiver.requests
    assert list(request["json"]) == ["taskId", "status", "timestamp"]
    assert (request["json"]["taskId"], request["json"]["status"]) == (task["id"], "completed")
    assert "X-Agenttasks-Signature" not in request["headers"]
    assert delivered[0]["data"]["httpStatus"] == 200


def test_rest_12_50_failed_signed(as_alice, workers, receiver):
    with agenttasks(**ALLOW_LOOPBACK, CALLBACK_SIGNING_SECRET="s3cret"):
        task = as_alice.create("boom", "go", callbackUrl=receiver.url)
        as_alice.wait_status(task["id"], "failed")
        wait_for(lambda: receiver.requests, message="the failed callback")
    (request,) = receiver.requests
    body = request["json"]
    assert list(body) == ["taskId", "status", "error", "timestamp"]
    assert (body["status"], body["error"]) == ("failed", "kaboom")
    header = request["headers"]["X-Agenttasks-Signature"]
    t, v1 = (part.split("=", 1)[1] for part in header.split(","))
    expected = hmac.new(b"s3cret", f"{t}.".encode() + request["raw"], hashlib.sha256).hexdigest()
    assert v1 == expected


@pytest.mark.parametrize("mode", ["500", "302", "timeout"])
def test_rest_12_51_no_retries_no_redirects_timeout(as_alice, workers, receiver, caplog, mode):
    from ..receiver import Receiver

    target = Receiver()
    try:
        settings = dict(ALLOW_LOOPBACK)
        if mode == "500":
            receiver.status = 500
        elif mode == "302":
            receiver.status, receiver.location = 302, target.url
        else:
            receiver.delay = 5
            settings["CALLBACK_TIMEOUT"] = 1
        with agenttasks(**settings), caplog.at_level(logging.WARNING, "agenttasks"):
            task = as_alice.create(callbackUrl=receiver.url)
            failed = wait_for(
                lambda: callback_events(as_alice, task, "callback.failed"), timeout=10
            )[0]
        assert len(receiver.requests) == 1 and target.requests == []
        if mode == "timeout":
            assert "timed out" in failed["data"]["error"]
            assert any("Error sending callback" in r.getMessage() for r in caplog.records)
        else:
            assert failed["data"]["httpStatus"] == int(mode)
            assert any("Callback failed" in r.getMessage() for r in caplog.records)
        assert as_alice.status(task["id"])["status"] == "completed"
    finally:
        target.close()


def test_rest_12_52_url_guard_at_create(as_alice, receiver, resolver):
    resolver["localhost"] = ["127.0.0.1"]
    resolver["mixed.example"] = ["93.184.216.34", "10.1.2.3"]
    refused = [
        ("ftp://x.example/cb", "callbackUrl must be an http or https URL"),
        ("http://user:pw@127.0.0.1/cb", "callbackUrl must not contain credentials"),
        ("http://10.0.0.5/cb", "callbackUrl resolves to a non-public address: 10.0.0.5"),
        ("http://100.64.0.1/cb", "callbackUrl resolves to a non-public address: 100.64.0.1"),
        (
            "http://169.254.169.254/",
            "callbackUrl resolves to a non-public address: 169.254.169.254",
        ),
        ("http://[::1]/cb", "callbackUrl resolves to a non-public address: ::1"),
        ("http://[::ffff:127.0.0.1]/cb", "callbackUrl resolves to a non-public address: "),
        ("http://localhost/cb", "callbackUrl resolves to a non-public address: 127.0.0.1"),
        ("http://mixed.example/cb", "callbackUrl resolves to a non-public address: 10.1.2.3"),
        ("http://unknown.example/cb", "callbackUrl host could not be resolved: unknown.example"),
        (
            "http://[2002:c0a8:101::1]/cb",
            "callbackUrl resolves to a non-public address: 2002:c0a8:101::1",
        ),
        ("https://93.184.216.34:8443/cb", "callbackUrl port 8443 is not allowed"),
    ]
    with agenttasks(**ALLOW_LOOPBACK):
        for url, message in refused:
            found = error(
                as_alice.post("/tasks", {"agentId": "echo", "input": "x", "callbackUrl": url}),
                400,
                "VALIDATION_ERROR",
            )
            assert found["message"].startswith(message), (url, found)
            assert found["details"]["fields"]["callbackUrl"] == [found["message"]]
        assert Task.objects.count() == 0
        as_alice.create(callbackUrl=receiver.url)


def test_rest_12_53_guard_at_send(as_alice, workers, gates, resolver, monkeypatch):
    posts = []
    monkeypatch.setattr(callbacks, "_post", lambda *a, **k: posts.append(a))
    resolver["hooks.example"] = ["93.184.216.34"]
    task, gate = gate_task(as_alice, gates, callbackUrl="http://hooks.example/cb")
    resolver["hooks.example"] = ["10.9.8.7"]
    gates.release(gate)
    as_alice.wait_status(task["id"], "completed")
    failed = wait_for(lambda: callback_events(as_alice, task, "callback.failed"))[0]
    assert "callbackUrl resolves to a non-public address" in failed["data"]["error"]
    assert posts == []
    assert json.dumps(failed)  # the event is plain JSON
