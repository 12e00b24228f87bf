"""Callbacks: the exact payload, the signature, outcomes as events, and the SSRF guard."""

import hashlib
import hmac
import json
import logging
import socket
import threading
import time

import pytest
from django.test.utils import override_settings

from agenttasks import lifecycle, store
from agenttasks.delivery import callbacks
from agenttasks.delivery.callbacks import CallbackURLError
from agenttasks.models import A2APushConfig, Event, Task
from agenttasks.types import NewTask

pytestmark = pytest.mark.django_db(transaction=True)

ALLOW_LOOPBACK = {"CALLBACK_ALLOWED_HOSTS": ["127.0.0.1"]}


@pytest.fixture
def resolver(monkeypatch):
    """A stub DNS: name -> list of addresses (a list of lists answers call by call)."""
    answers: dict = {}
    calls: list = []

    def resolve(host, port):
        calls.append(host)
        answer = answers.get(host, [])
        if answer and isinstance(answer[0], list):
            return answer.pop(0) if len(answer) > 1 else answer[0]
        return answer

    monkeypatch.setattr(callbacks, "resolve", resolve)
    resolve.answers, resolve.calls = answers, calls
    return resolve


def ended(user, status, url, error=""):
    """A task with a callback that ended with `status` (as the store wrote it)."""
    with override_settings(AGENTTASKS=ALLOW_LOOPBACK):
        task = lifecycle.create(owner=user, agent_id="echo", input="x", callback_url=url)
    store.claim(task.run_id, "w")
    store.finalize(task.id, task.run_id, status, result=error or "ok", error=error)
    return Task.objects.read(task.id)


def outcome_events(task):
    return list(
        Event.objects.filter(conversation_id=task.conversation_id, type__startswith="callback.")
    )


@override_settings(AGENTTASKS=ALLOW_LOOPBACK)
def test_a_task_whose_tree_is_being_deleted_sends_no_callback(user, receiver):
    # The ending a delete's stop causes comes after the tree is marked: its callback is not sent.
    task = ended(user, "cancelled", receiver.url)
    store.mark_deleting(task.conversation_id)
    assert callbacks.send(task.id, "cancelled", task.version) is None
    assert receiver.requests == [] and outcome_events(task) == []


@override_settings(AGENTTASKS=ALLOW_LOOPBACK)
def test_delivered_payload_and_event(user, receiver):
    task = ended(user, "completed", receiver.url)
    callbacks.send(task.id, "completed", task.version)
    (request,) = receiver.requests
    body = request["json"]
    assert list(body) == ["taskId", "status", "timestamp"]
    assert (body["taskId"], body["status"]) == (task.id, "completed")
    assert body["timestamp"].endswith("Z") and len(body["timestamp"]) == 24
    assert request["raw"] == json.dumps(body, separators=(",", ":")).encode()
    assert request["headers"]["Content-Type"] == "application/json"
    assert request["headers"]["User-Agent"].startswith("agenttasks/")
    assert "X-Agenttasks-Signature" not in request["headers"]
    (event,) = outcome_events(task)
    assert event.type == "callback.delivered" and event.data["httpStatus"] == 200
    assert event.data["status"] == "completed" and "durationMs" in event.data


@override_settings(AGENTTASKS={**ALLOW_LOOPBACK, "CALLBACK_SIGNING_SECRET": "s3cret"})
def test_failed_signed(user, receiver):
    task = ended(user, "failed", receiver.url, error="kaboom")
    callbacks.send(task.id, "failed", task.version)
    (request,) = receiver.requests
    assert request["json"]["error"] == "kaboom" and list(request["json"]) == [
        "taskId",
        "status",
        "error",
        "timestamp",
    ]
    header = request["headers"]["X-Agenttasks-Signature"]
    t, v1 = (part.split("=", 1)[1] for part in header.split(","))
    expected = hmac.new(b"s3cret", f"{t}.".encode() + request["raw"], hashlib.sha256).hexdigest()
    assert v1 == expected


@override_settings(AGENTTASKS=ALLOW_LOOPBACK)
def test_a_job_delivered_twice_sends_once(user, receiver):
    task = ended(user, "completed", receiver.url)
    callbacks.send(task.id, "completed", task.version)
    callbacks.send(task.id, "completed", task.version)
    assert len(receiver.requests) == 1


@override_settings(AGENTTASKS=ALLOW_LOOPBACK)
def test_non_2xx_is_a_failure_without_retry(user, receiver, caplog):
    receiver.status = 500
    task = ended(user, "completed", receiver.url)
    with caplog.at_level(logging.WARNING, logger="agenttasks.delivery.callbacks"):
        callbacks.send(task.id, "completed", task.version)
    assert len(receiver.requests) == 1
    (event,) = outcome_events(task)
    assert event.type == "callback.failed" and event.data["httpStatus"] == 500
    assert f"Callback failed: task_id={task.id} status=500" in caplog.text
    assert Task.objects.read(task.id).status == "completed"


@override_settings(AGENTTASKS=ALLOW_LOOPBACK)
def test_redirects_are_not_followed(user, receiver):
    from ..receiver import Receiver

    target = Receiver()
    try:
        receiver.status, receiver.location = 302, target.url
        task = ended(user, "completed", receiver.url)
        callbacks.send(task.id, "completed", task.version)
        assert len(receiver.requests) == 1 and target.requests == []
        (event,) = outcome_events(task)
        assert event.type == "callback.failed" and event.data["httpStatus"] == 302
    finally:
        target.close()


@override_settings(AGENTTASKS={**ALLOW_LOOPBACK, "CALLBACK_TIMEOUT": 1})
def test_timeout(user, receiver, caplog):
    receiver.delay = 3
    task = ended(user, "completed", receiver.url)
    with caplog.at_level(logging.WARNING, logger="agenttasks.delivery.callbacks"):
        callbacks.send(task.id, "completed", task.version)
    (event,) = outcome_events(task)
    assert event.type == "callback.failed" and "timed out" in event.data["error"]
    assert f"Error sending callback to 127.0.0.1: task_id={task.id}" in caplog.text


class Dripper:
    """A receiver on loopback that answers one byte every `gap` seconds (a slow-loris answer)."""

    ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nX-Padding: " + b"x" * 60 + b"\r\n\r\n"

    def __init__(self, gap: float = 0.3):
        self.gap = gap
        self.server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}/cb"
        self.stop = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while not self.stop.is_set():
            try:
                peer, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._drip, args=(peer,), daemon=True).start()

    def _drip(self, peer):
        with peer:
            peer.recv(65536)
            for byte in self.ANSWER:
                if self.stop.wait(self.gap):
                    return
                try:
                    peer.sendall(bytes([byte]))
                except OSError:
                    return  # the sender gave up

    def close(self):
        self.stop.set()
        self.server.close()


@override_settings(AGENTTASKS={**ALLOW_LOOPBACK, "CALLBACK_TIMEOUT": 1})
def test_the_timeout_bounds_the_whole_exchange_not_each_read(user):
    """A byte every 0.3 s never trips a per-read timeout of 1 s; the exchange is cut at 1 s."""
    dripper = Dripper()
    try:
        task = ended(user, "completed", dripper.url)
        begun = time.monotonic()
        callbacks.send(task.id, "completed", task.version)
        took = time.monotonic() - begun
    finally:
        dripper.close()
    (event,) = outcome_events(task)
    assert event.type == "callback.failed" and event.data["error"] == "timed out after 1s"
    assert took < 3  # the whole answer would take about 25 s


@override_settings(AGENTTASKS={**ALLOW_LOOPBACK, "CALLBACK_TIMEOUT": 1})
def test_an_a2a_push_is_bounded_the_same_way(user, monkeypatch):
    from agenttasks.a2a import push

    monkeypatch.setattr(push.time, "sleep", lambda seconds: None)  # no backoff between attempts
    dripper = Dripper()
    try:
        task = lifecycle.create(owner=user, agent_id="echo", input="x")
        config = A2APushConfig.objects.create(task=task, url=dripper.url)
        store.claim(task.run_id, "w")
        store.finalize(task.id, task.run_id, "completed", result="ok")  # owes the push
        task = Task.objects.read(task.id)
        begun = time.monotonic()
        outcomes = push.deliver(config.pk, "completed", task.version)
        took = time.monotonic() - begun
    finally:
        dripper.close()
    assert [o["error"] for o in outcomes] == ["timed out after 1s"] * 3
    assert took < 6  # three attempts of at most 1 s each


REFUSED = [
    ("ftp://x.example/cb", "callbackUrl must be an http or https URL"),
    ("http://user:pw@127.0.0.1/cb", "callbackUrl must not contain credentials"),
    ("http://10.0.0.5/cb", "callbackUrl resolves to a non-public address: 10.0.0.5"),
    ("http://100.64.0.1/cb", "callbackUrl resolves to a non-public address: 100.64.0.1"),
    ("http://169.254.169.254/", "callbackUrl resolves to a non-public address: 169.254.169.254"),
    ("http://[::1]/cb", "callbackUrl resolves to a non-public address: ::1"),
    ("http://[::ffff:127.0.0.1]/cb", "callbackUrl resolves to a non-public address: ::ffff:7f00:1"),
    ("http://127.0.0.1/cb", "callbackUrl resolves to a non-public address: 127.0.0.1"),
    ("http://0.0.0.0/cb", "callbackUrl resolves to a non-public address: 0.0.0.0"),
    ("http://224.0.0.1/cb", "callbackUrl resolves to a non-public address: 224.0.0.1"),
    ("http://240.0.0.1/cb", "callbackUrl resolves to a non-public address: 240.0.0.1"),
    ("http://192.168.1.1/cb", "callbackUrl resolves to a non-public address: 192.168.1.1"),
    ("http://[fe80::1]/cb", "callbackUrl resolves to a non-public address: fe80::1"),
    ("http://[fc00::1]/cb", "callbackUrl resolves to a non-public address: fc00::1"),
    ("http://localhost/cb", "callbackUrl resolves to a non-public address: 127.0.0.1"),
    ("http://mixed.test/cb", "callbackUrl resolves to a non-public address: 10.1.2.3"),
    ("http://nowhere.test/cb", "callbackUrl host could not be resolved: nowhere.test"),
    # IPv6 addresses that carry a non-public IPv4 address: 6to4, Teredo, NAT64, IPv4-compatible.
    (
        "http://[2002:c0a8:101::1]/cb",
        "callbackUrl resolves to a non-public address: 2002:c0a8:101::1",
    ),
    ("http://[2002:7f00:1::]/cb", "callbackUrl resolves to a non-public address: 2002:7f00:1::"),
    ("http://6to4.test/cb", "callbackUrl resolves to a non-public address: 2002:a00:5::1"),
    (
        "http://[2001:0:4136:e378:8000:63bf:f5ff:fffe]/cb",
        "callbackUrl resolves to a non-public address: 2001:0:4136:e378:8000:63bf:f5ff:fffe",
    ),
    (
        "http://[2001:0:c0a8:101:8000:63bf:f7ba:fefd]/cb",
        "callbackUrl resolves to a non-public address: 2001:0:c0a8:101:8000:63bf:f7ba:fefd",
    ),
    ("http://[64:ff9b::a00:1]/cb", "callbackUrl resolves to a non-public address: 64:ff9b::a00:1"),
    (
        "http://[64:ff9b:1::a9fe:a9fe]/cb",
        "callbackUrl resolves to a non-public address: 64:ff9b:1::a9fe:a9fe",
    ),
    ("http://[::a00:1]/cb", "callbackUrl resolves to a non-public address: ::a00:1"),
    # Ports: by default only the scheme's own.
    ("http://public.test:8080/cb", "callbackUrl port 8080 is not allowed"),
    ("https://public.test:22/cb", "callbackUrl port 22 is not allowed"),
    ("http://public.test:443/cb", "callbackUrl port 443 is not allowed"),
    ("http://" + "a" * 2000 + ".test/", "callbackUrl must be at most 2000 characters"),
]


DNS = {
    "localhost": ["127.0.0.1"],
    "mixed.test": ["93.184.216.34", "10.1.2.3"],
    "6to4.test": ["2002:808:808::1", "2002:a00:5::1"],
    "public.test": ["93.184.216.34"],
}


@pytest.mark.parametrize("url, message", REFUSED)
def test_guard_at_create(user, resolver, url, message):
    resolver.answers.update(DNS)
    with pytest.raises(CallbackURLError) as raised:
        lifecycle.create(owner=user, agent_id="echo", input="x", callback_url=url)
    assert str(raised.value) == message
    assert not Task.objects.exists()


def test_public_and_allowed_hosts_pass(user, resolver):
    resolver.answers["public.test"] = ["93.184.216.34", "2606:2800:220:1:248:1893:25c8:1946"]
    assert callbacks.check_address("https://public.test/cb") == [
        "93.184.216.34",
        "2606:2800:220:1:248:1893:25c8:1946",
    ]
    with override_settings(AGENTTASKS={"CALLBACK_ALLOWED_HOSTS": ["Hooks.Internal"]}):
        resolver.answers["hooks.internal"] = ["10.0.0.7"]
        assert callbacks.check_address("http://hooks.internal/cb") == ["10.0.0.7"]
        # An allowed host may use any port.
        assert callbacks.check_address("http://hooks.internal:9000/cb") == ["10.0.0.7"]
    # 6to4 of a public IPv4 address is public.
    assert callbacks.check_address("https://[2002:808:808::1]:443/cb") == ["2002:808:808::1"]


def test_allowed_ports_setting(user, resolver):
    resolver.answers.update({"public.test": ["93.184.216.34"], "hooks.internal": ["10.0.0.7"]})
    strict = {"CALLBACK_ALLOWED_PORTS": [8443], "CALLBACK_ALLOWED_HOSTS": ["hooks.internal"]}
    with override_settings(AGENTTASKS=strict):
        assert callbacks.check_address("https://public.test:8443/cb") == ["93.184.216.34"]
        for url, port in [
            ("https://public.test/cb", 443),
            ("http://public.test/cb", 80),
            ("http://hooks.internal:9000/cb", 9000),  # a list is the whole policy
        ]:
            with pytest.raises(CallbackURLError) as raised:
                callbacks.check_address(url)
            assert str(raised.value) == f"callbackUrl port {port} is not allowed"


@pytest.mark.parametrize(
    "url, message", [(u, m) for u, m in REFUSED if "resolves" in m or "port" in m]
)
def test_guard_at_send(user, resolver, monkeypatch, url, message):
    resolver.answers.update(DNS)
    task = store.create_task(NewTask(owner=user, agent="echo", input="x", callback_url=url))
    store.claim(task.run_id)
    store.finalize(task.id, task.run_id, "completed", result="ok")
    task = Task.objects.read(task.id)
    monkeypatch.setattr(
        callbacks, "_post", lambda *a, **k: pytest.fail("no connection may be made")
    )
    callbacks.send(task.id, "completed", task.version)
    (event,) = outcome_events(task)
    assert event.type == "callback.failed" and event.data["error"] == message


def test_a_dns_answer_that_changes_cannot_reach_a_refused_address(user, resolver, monkeypatch):
    # Public at create; at send the name answers private: no connection is made.
    resolver.answers["rebind.test"] = [["93.184.216.34"], ["10.0.0.5"]]
    task = lifecycle.create(
        owner=user, agent_id="echo", input="x", callback_url="http://rebind.test/cb"
    )
    store.claim(task.run_id)
    store.finalize(task.id, task.run_id, "completed", result="ok")
    monkeypatch.setattr(
        callbacks, "_post", lambda *a, **k: pytest.fail("no connection may be made")
    )
    callbacks.send(task.id, "completed", Task.objects.read(task.id).version)
    (event,) = outcome_events(task)
    assert event.data["error"] == "callbackUrl resolves to a non-public address: 10.0.0.5"


def test_the_connection_goes_to_the_checked_address(user, resolver, receiver):
    # Resolved once at send; the request goes to that address and names the host in Host.
    resolver.answers["cb.test"] = [["127.0.0.1"], ["10.9.9.9"]]
    with override_settings(AGENTTASKS={"CALLBACK_ALLOWED_HOSTS": ["cb.test"]}):
        url = f"http://cb.test:{receiver.port}/cb"
        task = store.create_task(NewTask(owner=user, agent="echo", input="x", callback_url=url))
        store.claim(task.run_id)
        store.finalize(task.id, task.run_id, "completed", result="ok")
        resolver.calls.clear()
        callbacks.send(task.id, "completed", Task.objects.read(task.id).version)
    assert resolver.calls == ["cb.test"]
    (request,) = receiver.requests
    assert request["headers"]["Host"] == f"cb.test:{receiver.port}"


# --- verify, for receivers ---------------------------------------------------------------------


@override_settings(AGENTTASKS={**ALLOW_LOOPBACK, "CALLBACK_SIGNING_SECRET": "s3cret"})
def test_verify_accepts_a_callback_as_sent(user, receiver):
    task = ended(user, "completed", receiver.url)
    callbacks.send(task.id, "completed", task.version)
    (request,) = receiver.requests
    assert callbacks.verify(request["headers"], request["raw"], "s3cret") is None
    lower = {k.lower(): v for k, v in request["headers"].items()}
    assert callbacks.verify(lower, request["raw"], "s3cret") is None
    with pytest.raises(callbacks.InvalidSignature, match="does not match"):
        callbacks.verify(request["headers"], request["raw"], "other")
    with pytest.raises(callbacks.InvalidSignature, match="does not match"):
        callbacks.verify(request["headers"], request["raw"] + b" ", "s3cret")


def test_verify_refuses_old_future_missing_and_malformed_signatures():
    body = b'{"taskId":"task_x","status":"completed","timestamp":"2025-01-01T00:00:05.000Z"}'
    header = {"X-Agenttasks-Signature": callbacks.signature("k", 1_000_000, body)}
    callbacks.verify(header, body, "k", now=1_000_300)
    callbacks.verify(header, body.decode(), "k", now=999_700)
    with pytest.raises(callbacks.InvalidSignature, match="301s old; the limit is 300s"):
        callbacks.verify(header, body, "k", now=1_000_301)
    with pytest.raises(callbacks.InvalidSignature, match="old; the limit is 300s"):
        callbacks.verify(header, body, "k", now=999_699)  # signed in the future
    with pytest.raises(callbacks.InvalidSignature, match="61s old; the limit is 60s"):
        callbacks.verify(header, body, "k", tolerance=60, now=1_000_061)
    with pytest.raises(callbacks.InvalidSignature, match="No X-Agenttasks-Signature header"):
        callbacks.verify({}, body, "k", now=1_000_000)
    for bad in ["", "t=abc,v1=00", "v1=00", "t=1000000", "garbage"]:
        with pytest.raises(callbacks.InvalidSignature):
            callbacks.verify({"X-Agenttasks-Signature": bad}, body, "k", now=1_000_000)
    # Several v1 values (a receiver rotating its secret): any one that matches is enough.
    rotated = {"x-agenttasks-signature": header["X-Agenttasks-Signature"] + ",v1=" + "0" * 64}
    callbacks.verify(rotated, body, "k", now=1_000_000)


def test_signatures_import_without_django_settings():
    """A receiver that is not a Django site can import verify."""
    import subprocess
    import sys

    code = (
        "import time; from agenttasks import signatures as c; b = b'{}'; "
        "c.verify({'X-Agenttasks-Signature': c.signature('k', int(time.time()), b)}, b, 'k')"
    )
    env = {k: v for k, v in __import__("os").environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=60)
