"""Per-user caps on open event streams and status waits, held across server processes.

Two real servers share the test database: this process's threaded WSGI live server and a
`manage.py runserver` process. Streams are read with httpx; a client that goes away must give
its place back within a few seconds (well before the 15 s keep-alive), and a server process that
dies gives its places back when their leases expire.
"""

import json
import os
import socket
from datetime import timedelta

import httpx
import pytest
from django.test import RequestFactory
from django.utils import timezone

from agenttasks.models import Slot
from agenttasks.toolkit import caps, errors

from .conftest import PREFIX, _free_port, agenttasks, error, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

CAPS = {"MAX_STREAMS_PER_USER": 2, "MAX_WAITS_PER_USER": 2, "SLOT_LEASE_SECONDS": 3}
NOTICED = 5.0  # seconds: "within a few seconds", against the 15 s keep-alive


def token_of(api) -> str:
    return api.headers["HTTP_AUTHORIZATION"].split()[1]


def held(kind: str, api) -> int:
    return Slot.objects.filter(key__startswith=f"{kind}:user:{api.user.pk}:").count()


class OpenStream:
    """An events stream held open by a client until `close()`."""

    def __init__(self, base: str, token: str, conversation_id: str):
        self.client = httpx.Client(timeout=30)
        request = self.client.build_request(
            "GET",
            f"{base}{PREFIX}/conversations/{conversation_id}/events/stream",
            headers={"Authorization": f"Token {token}"},
        )
        self.response = self.client.send(request, stream=True)
        self.status = self.response.status_code
        if self.status == 200:
            # Keep the iterator: httpx closes the connection when it is garbage-collected.
            self.lines = self.response.iter_lines()
            assert next(self.lines) == "event: snapshot"  # the server holds the stream now
        else:
            self.body = self.response.read()

    def close(self) -> None:
        self.response.close()
        self.client.close()


@pytest.fixture
def streams():
    opened: list[OpenStream] = []

    def open_(base, api, conversation_id) -> OpenStream:
        opened.append(OpenStream(base, token_of(api), conversation_id))
        return opened[-1]

    yield open_
    for stream in opened:
        stream.close()


def refused(response_status: int, body: bytes, message: str) -> None:
    import json

    assert response_status == 429, body
    found = json.loads(body)["error"]
    assert found["code"] == "rate_limited" and found["message"] == message, found
    assert found["details"]["limit"] == 2 and found["details"]["retryAfter"] >= 1


def test_streams_are_capped_per_user_across_processes(
    live_server, short_lived_connections, server_process, streams, as_alice, as_bob
):
    other = server_process(**CAPS)
    here = live_server.url
    conversation = as_alice.post("/conversations", {"agentId": "echo"}).json()["conversation"]
    theirs = as_bob.post("/conversations", {"agentId": "echo"}).json()["conversation"]
    with agenttasks(**CAPS):
        first = streams(here, as_alice, conversation["id"])
        second = streams(other.url, as_alice, conversation["id"])
        assert (first.status, second.status) == (200, 200)
        message = "You already have 2 open event streams; close one and try again"
        for base in (here, other.url):
            third = streams(base, as_alice, conversation["id"])
            refused(third.status, third.body, message)
            assert third.response.headers["Retry-After"] in ("1", "2", "3")
        assert streams(other.url, as_bob, theirs["id"]).status == 200  # bob has his own

        # A client that goes away frees its place within seconds (not at the keep-alive).
        first.close()
        wait_for(lambda: held("stream", as_alice) == 1, timeout=NOTICED, message="the release")
        assert streams(other.url, as_alice, conversation["id"]).status == 200
        # The other process dies holding two places: they lapse with their leases.
        other.kill()
        assert held("stream", as_alice) == 2
        reopened = wait_for(
            lambda: (s := streams(here, as_alice, conversation["id"])).status == 200 and s,
            timeout=3 * CAPS["SLOT_LEASE_SECONDS"],
            interval=0.5,
            message="the dead server's places lapse",
        )
        reopened.close()
        live = Slot.objects.filter(key__startswith=f"stream:user:{as_alice.user.pk}:")
        wait_for(
            lambda: not live.filter(expires_at__gt=timezone.now()).exists(),
            timeout=NOTICED,
            message="the last release",
        )


def test_an_asgi_stream_gives_its_place_back_at_the_disconnect(asgi_server, streams, as_alice):
    conversation = as_alice.post("/conversations", {"agentId": "echo"}).json()["conversation"]
    with agenttasks(**CAPS):
        stream = streams(asgi_server, as_alice, conversation["id"])
        assert stream.status == 200 and held("stream", as_alice) == 1
        stream.close()
        wait_for(lambda: held("stream", as_alice) == 0, timeout=NOTICED, message="the release")


def send_get(base: str, path: str, token: str) -> socket.socket:
    """Send a GET over a plain socket and leave it waiting for the answer."""
    host, port = base.removeprefix("http://").split(":")
    connection = socket.create_connection((host, int(port)), timeout=30)
    connection.sendall(
        f"GET {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Token {token}\r\n\r\n".encode()
    )
    return connection


def test_waits_are_capped_per_user_across_processes(
    live_server, short_lived_connections, server_process, as_alice
):
    other = server_process(**CAPS)
    task = as_alice.create()  # no worker: it stays pending, so a wait lasts its timeout
    token = token_of(as_alice)
    # Built whole: a replace("60", "0") on the path once cut a "60" out of the random task id.
    path = f"{PREFIX}/tasks/{task['id']}/wait?timeout=60"
    at_once = f"{PREFIX}/tasks/{task['id']}/wait?timeout=0"
    headers = {"Authorization": f"Token {token}"}
    with agenttasks(**CAPS):
        waiting = [send_get(base, path, token) for base in (live_server.url, other.url)]
        wait_for(lambda: held("wait", as_alice) == 2, timeout=30, message="two waits")
        message = "You already have 2 status waits in progress; let one return and try again"
        for base in (live_server.url, other.url):
            third = httpx.get(base + at_once, headers=headers, timeout=30)
            refused(third.status_code, third.content, message)
        # Clients that give up free their places within seconds, not at the wait's timeout.
        for connection in waiting:
            connection.close()
        wait_for(lambda: held("wait", as_alice) == 0, timeout=NOTICED, message="the release")
        again = httpx.get(live_server.url + at_once, headers=headers, timeout=30)
        assert again.status_code == 200, again.text


def test_places_are_leases(alice):
    request = RequestFactory().get("/")
    request.user = alice
    first = caps.take(request, caps.STREAM, 2, 30)
    second = caps.take(request, caps.STREAM, 2, 30)
    with pytest.raises(errors.ApiError) as raised:
        caps.take(request, caps.STREAM, 2, 30)
    assert raised.value.status == 429 and raised.value.details["retryAfter"] == 30
    assert caps.take(request, caps.WAIT, 2, 30).key == f"wait:user:{alice.pk}:0"  # other kind
    # An expired lease is taken over, and its old holder can neither renew nor release it.
    Slot.objects.filter(pk=first.key).update(expires_at=timezone.now() - timedelta(seconds=1))
    third = caps.take(request, caps.STREAM, 2, 30)
    assert third.key == first.key and third.holder != first.holder
    assert not first.renew()
    first.release()
    assert Slot.objects.filter(pk=third.key, holder=third.holder).exists()
    assert second.renew() and third.renew()
    second.release()
    second.release()  # idempotent
    assert Slot.objects.filter(key__startswith="stream:").count() == 1
    # No cap: no rows at all; the anonymous principal counts per client address.
    assert caps.take(request, caps.STREAM, 0, 30).key is None
    anonymous = RequestFactory().get("/", REMOTE_ADDR="203.0.113.5")
    assert caps.take(anonymous, caps.STREAM, 1, 30).key == "stream:addr:203.0.113.5:0"


def test_the_cap_answers_the_envelope_over_the_api(as_alice):
    conversation = as_alice.post("/conversations", {"agentId": "echo"}).json()["conversation"]
    for n in range(2):
        Slot.objects.create(
            key=f"stream:user:{as_alice.user.pk}:{n}",
            holder="elsewhere",
            expires_at=timezone.now() + timedelta(seconds=20),
        )
    with agenttasks(MAX_STREAMS_PER_USER=2):
        response = as_alice.get(f"/conversations/{conversation['id']}/events/stream")
        found = error(
            response,
            429,
            "rate_limited",
            "You already have 2 open event streams; close one and try again",
        )
        assert found["details"]["retryAfter"] in (19, 20) and response["Retry-After"] in (
            "19",
            "20",
        )


@pytest.mark.parametrize("kind", ["wsgi", "asgi"])
def test_a_long_stream_keeps_renewing_its_place(request, kind, streams, as_alice):
    base = request.getfixturevalue(f"{kind}_server")
    conversation = as_alice.post("/conversations", {"agentId": "echo"}).json()["conversation"]
    with agenttasks(MAX_STREAMS_PER_USER=1, SLOT_LEASE_SECONDS=1):
        stream = streams(base, as_alice, conversation["id"])
        assert stream.status == 200
        (slot,) = Slot.objects.all()
        wait_for(
            lambda: (
                Slot.objects.get(pk=slot.pk).expires_at > slot.expires_at + timedelta(seconds=2)
            ),
            timeout=10,
            message="the lease renewed past its first expiry",
        )
        assert Slot.objects.get(pk=slot.pk).holder == slot.holder
        stream.close()
        wait_for(lambda: not Slot.objects.exists(), timeout=NOTICED, message="the release")


class Gunicorn:
    """gunicorn (gthread: one process of 4 threads, as the README serves it) on the test database."""

    def __init__(self, settings: dict):
        import json
        import subprocess
        import sys

        from ..cluster import ROOT, database_env

        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {
            **os.environ,
            **database_env(),
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "AGENTTASKS_TEST_SETTINGS": json.dumps(settings),
        }
        self.process = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "project.wsgi:application", "--workers", "1"]
            + ["--worker-class", "gthread", "--threads", "4", "--bind", f"127.0.0.1:{self.port}"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        wait_for(self._answers, timeout=60, message="gunicorn answers")

    def _answers(self) -> bool:
        try:
            return httpx.get(self.url + PREFIX + "/agents", timeout=5).status_code in (
                200,
                401,
                403,
            )
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        import signal

        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)


@pytest.fixture
def gunicorn(transactional_db):
    started: list[Gunicorn] = []

    def start(**settings) -> Gunicorn:
        started.append(Gunicorn(settings))
        return started[-1]

    yield start
    for server in started:
        server.stop()


def test_one_users_streams_leave_a_pooled_servers_threads_for_others(
    gunicorn, short_lived_connections, streams, as_alice, as_bob
):
    """With the defaults, 4 streams of one user on a process of 4 threads: 2 open, 2 are refused,
    and another user's list still answers at once (all 4 threads streamed before)."""
    server = gunicorn()
    conversation = as_alice.post("/conversations", {"agentId": "echo"}).json()["conversation"]
    opened = [streams(server.url, as_alice, conversation["id"]) for _ in range(4)]
    assert [s.status for s in opened] == [200, 200, 429, 429]
    found = json.loads(opened[2].body)["error"]
    assert found == {
        "code": "rate_limited",
        "message": "This server is holding 2 open streams and waits; try again shortly",
        "details": {"limit": 2, "retryAfter": 5},
    }
    assert opened[2].response.headers["Retry-After"] == "5"
    headers = {"Authorization": f"Token {token_of(as_bob)}"}
    listed = httpx.get(server.url + PREFIX + "/tasks", headers=headers, timeout=3)
    assert listed.status_code == 200
    # A wait is held the same way, and a place comes back when its stream ends.
    task = as_bob.post("/tasks", {"agentId": "echo", "input": "x"}).json()["task"]
    wait = f"{server.url}{PREFIX}/tasks/{task['id']}/wait?timeout="
    assert httpx.get(wait + "1", headers=headers, timeout=10).status_code == 429
    opened[0].close()
    wait_for(
        lambda: httpx.get(wait + "0", headers=headers, timeout=10).status_code == 200,
        timeout=NOTICED,
        message="the closed stream's place to come back",
    )
