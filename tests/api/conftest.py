"""Fixtures of the REST tests: users alice and bob with DRF tokens, a JSON client, workers.

Two ways to run agents:
- `workers`: an in-process pool that executes every run the recording queue receives with
  `agenttasks.execution.worker.execute_run(run_id)`, one thread per run (the test's own process, the test
  database, after commit) — deterministic and fast;
- `start_cluster` (tests/conftest.py): a real django-q2 cluster in a subprocess.
"""

import base64
import json
import os
import socket
import threading
import time

import pytest
from django.conf import settings
from django.core.cache import cache
from django.db import connection, connections
from django.test import Client
from django.test.utils import override_settings
from rest_framework.authtoken.models import Token

from agenttasks.execution import worker
from agenttasks.models import Task

from ..conftest import served_asgi, wait_for
from ..factories import UserFactory

PREFIX = "/api/agents"
ALLOW_LOOPBACK = {"CALLBACK_ALLOWED_HOSTS": ["127.0.0.1"]}


def agenttasks(**overrides):
    """override_settings for AGENTTASKS keys, keeping the test site's other keys."""
    return override_settings(AGENTTASKS={**settings.AGENTTASKS, **overrides})


class Api:
    """A JSON client for one principal (a user with a token, or anonymous)."""

    def __init__(self, user=None, token: str | None = None):
        self.user = user
        self.client = Client()
        self.headers = {}
        if token is not None:
            self.headers["HTTP_AUTHORIZATION"] = f"Token {token}"

    def request(self, method: str, path: str, body=None, *, raw=None, content_type=None, **extra):
        url = path if path.startswith("/") and path.startswith(PREFIX) else PREFIX + path
        data = raw if raw is not None else (json.dumps(body) if body is not None else "")
        kwargs = {**self.headers, **extra, "content_type": content_type or "application/json"}
        return getattr(self.client, method.lower())(url, data=data, **kwargs)

    def get(self, path, **extra):
        url = path if path.startswith(PREFIX) else PREFIX + path
        return self.client.get(url, **{**self.headers, **extra})

    def post(self, path, body=None, **kw):
        return self.request("POST", path, body, **kw)

    def patch(self, path, body=None, **kw):
        return self.request("PATCH", path, body, **kw)

    def delete(self, path, body=None, **kw):
        return self.request("DELETE", path, body, **kw)

    # shortcuts ---------------------------------------------------------------------------------
    def create(self, agent="echo", input="hello", expect=201, **fields):
        response = self.post("/tasks", {"agentId": agent, "input": input, **fields})
        assert response.status_code == expect, response.content
        return response.json()["task"] if expect == 201 else response

    def task(self, task_id) -> dict:
        response = self.get(f"/tasks/{task_id}")
        assert response.status_code == 200, response.content
        return response.json()

    def status(self, task_id) -> dict:
        response = self.get(f"/tasks/{task_id}/status")
        assert response.status_code == 200, response.content
        return response.json()

    def events(self, conversation_id, after=0) -> list[dict]:
        out, cursor = [], after
        while True:
            page = self.get(f"/conversations/{conversation_id}/events?after={cursor}&limit=500")
            assert page.status_code == 200, page.content
            body = page.json()
            out.extend(body["events"])
            if not body["hasMore"]:
                return out
            cursor = body["events"][-1]["seq"]

    def wait_status(self, task_id, *statuses, timeout=10.0) -> dict:
        """Wait (by condition) until the task's status is one of `statuses`."""
        return wait_for(
            lambda: (b := self.status(task_id))["status"] in statuses and b,
            timeout=timeout,
            message=f"task {task_id} in {statuses}",
        )


def error(response, status: int, code: str, message: str | None = None) -> dict:
    """Assert an error envelope and return its `error` object."""
    assert response.status_code == status, (response.status_code, response.content)
    assert response["Content-Type"] == "application/json", response["Content-Type"]
    body = response.json()
    assert set(body) == {"error"}, body
    assert body["error"]["code"] == code, body
    if message is not None:
        assert body["error"]["message"] == message, body
    return body["error"]


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@pytest.fixture(autouse=True)
def _media(settings, tmp_path):
    """Uploaded files go to a temporary directory, never the demo's media/."""
    settings.MEDIA_ROOT = str(tmp_path / "media")


@pytest.fixture(autouse=True)
def _fresh_throttles():
    cache.clear()
    yield
    cache.clear()


@pytest.fixture
def alice(transactional_db):
    return UserFactory(username="alice")


@pytest.fixture
def bob(transactional_db):
    return UserFactory(username="bob")


@pytest.fixture
def as_alice(alice):
    return Api(alice, Token.objects.create(user=alice).key)


@pytest.fixture
def as_bob(bob):
    return Api(bob, Token.objects.create(user=bob).key)


@pytest.fixture
def anonymous(transactional_db):
    return Api()


class Workers:
    """Execute every run the recording queue receives, each in its own thread."""

    def __init__(self, queue):
        self.queue = queue
        self.seen = 0
        self.threads: list[threading.Thread] = []
        self.by_run: dict[str, threading.Thread] = {}
        self.paused = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="api-test-workers", daemon=True)

    def start(self):
        self._thread.start()
        return self

    def _loop(self):
        while not self._stop.is_set():
            if not self.paused:
                while self.seen < len(self.queue.run_ids):
                    run_id = self.queue.run_ids[self.seen]
                    self.seen += 1
                    thread = threading.Thread(target=_execute, args=(run_id,), daemon=True)
                    self.threads.append(thread)
                    self.by_run[run_id] = thread
                    thread.start()
            self._stop.wait(0.01)

    def finished(self, run_id: str) -> bool:
        """Whether the execution of this run has returned."""
        thread = self.by_run.get(run_id)
        return thread is not None and not thread.is_alive()

    def stop(self, timeout=10):
        self._stop.set()
        self._thread.join(timeout)
        for thread in self.threads:
            thread.join(timeout)


def _execute(run_id):
    try:
        worker.execute_run(run_id)
    finally:
        connection.close()


@pytest.fixture
def workers(recording_queue, transactional_db, gates):
    """An in-process worker pool fed by the recording queue."""
    pool = Workers(recording_queue).start()
    yield pool
    gates.release_all()
    pool.stop()


class Gates:
    """Gate files for the `gate` agent: metadata {"gate": path}; release() lets it reply."""

    def __init__(self, root):
        self.root = root
        self.paths: list[str] = []

    def new(self) -> dict:
        path = os.path.join(self.root, f"gate-{len(self.paths)}")
        self.paths.append(path)
        return {"gate": path}

    def release(self, metadata: dict) -> None:
        open(metadata["gate"], "w").close()

    def release_all(self) -> None:
        for path in self.paths:
            open(path, "w").close()


@pytest.fixture
def gates(tmp_path):
    g = Gates(str(tmp_path))
    yield g
    g.release_all()


def gate_task(api: Api, gates: Gates, **fields) -> tuple[dict, dict]:
    """Create a `gate` task; return (task, its gate metadata)."""
    meta = gates.new()
    return api.create("gate", "hold", metadata=meta, **fields), meta


def at_gate(api: Api, task_id: str) -> dict:
    """Wait until a gate task is running with its progress recorded."""
    return wait_for(
        lambda: (b := api.status(task_id))["status"] == "running" and "progress" in b and b,
        message=f"task {task_id} at its gate",
    )


def settled(task_id, *statuses, timeout=10.0) -> Task:
    statuses = statuses or ("completed", "failed", "cancelled")
    return wait_for(
        lambda: (
            (t := Task.objects.filter(pk=task_id).first()) is not None
            and t.status in statuses
            and t
        ),
        timeout=timeout,
        message=f"task {task_id} in {statuses}",
    )


def monotonic_deadline(seconds: float) -> float:
    return time.monotonic() + seconds


# --- real servers on loopback ----------------------------------------------------------------


@pytest.fixture
def short_lived_connections():
    """Server threads close their database connections after each request (PostgreSQL reuses
    them otherwise, and the test database could not be dropped at the end)."""
    settings_dict = connections.settings["default"]
    previous = settings_dict.get("CONN_MAX_AGE", 0)
    settings_dict["CONN_MAX_AGE"] = 0
    yield
    settings_dict["CONN_MAX_AGE"] = previous


@pytest.fixture
def wsgi_server(live_server, short_lived_connections):
    return live_server.url


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def asgi_server(transactional_db):
    with served_asgi() as url:
        yield url


class ServerProcess:
    """`manage.py runserver` in a process of its own, on the test database."""

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
            "PYTHONUNBUFFERED": "1",
        }
        self.process = subprocess.Popen(
            [sys.executable, "manage.py", "runserver", f"127.0.0.1:{self.port}", "--noreload"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        wait_for(self._answers, timeout=60, message="the other server process answers")

    def _answers(self) -> bool:
        import httpx

        try:
            return httpx.get(self.url + PREFIX + "/docs/openapi.json", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    def kill(self) -> None:
        """SIGKILL: a server process dying with whatever it held."""
        import signal

        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)


@pytest.fixture
def server_process(transactional_db):
    """Start another server process with AGENTTASKS overrides; all are killed after the test."""
    started = []

    def start(**settings) -> ServerProcess:
        started.append(ServerProcess(settings))
        return started[-1]

    yield start
    for process in started:
        process.kill()
