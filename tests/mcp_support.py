"""The MCP tests' harness: the live server, a real django-q2 cluster, and the real `mcp` client.

`Host(server, token, mode)` opens the official SDK's `Client` on the endpoint over Streamable
HTTP, negotiating as `mode` says: "legacy" (the 2025-11-25 handshake and a session) or
"2026-07-28" (stateless). `host.run(body)` runs `await body(client)` with a fresh client (its own
event loop and connections): one MCP session per run under "legacy".
"""

import asyncio
import json
import sys

import httpx
import httpx2
import pytest
from django.core.cache import cache
from django.db import connections
from mcp import Client, MCPError
from mcp.client.streamable_http import streamable_http_client
from rest_framework.authtoken.models import Token

from .factories import UserFactory

if sys.version_info < (3, 11):  # pragma: no cover
    from exceptiongroup import BaseExceptionGroup

PREFIX = "/api/agents"
LEGACY, MODERN = "legacy", "2026-07-28"
MODES = [LEGACY, MODERN]


def endpoint(server: str) -> str:
    return f"{server}{PREFIX}/mcp"


class Host:
    """One principal's MCP client, as a host would run it."""

    def __init__(self, server, token, mode, *, scheme="Bearer", **callbacks):
        self.server, self.token, self.mode, self.scheme = server, token, mode, scheme
        self.callbacks = callbacks  # elicitation_callback, logging_callback, message_handler

    def headers(self) -> dict:
        return {"Authorization": f"{self.scheme} {self.token}"} if self.token else {}

    def run(self, body):
        async def main():
            async with httpx2.AsyncClient(headers=self.headers(), timeout=120) as http:
                transport = streamable_http_client(endpoint(self.server), http_client=http)
                async with Client(transport, mode=self.mode, **self.callbacks) as client:
                    return await body(client)

        return asyncio.run(main())

    def call(self, name: str, arguments: dict, **kwargs):
        return self.run(lambda client: client.call_tool(name, arguments, **kwargs))


def text(result) -> str:
    return "".join(block.text for block in result.content if block.type == "text")


def card(result) -> dict:
    """A task card (`key: value` lines) as a dict."""
    return dict(line.split(": ", 1) for line in text(result).splitlines() if ": " in line)


def post(server, body, *, token=None, headers=None, content=None):
    """One raw POST to the endpoint (httpx); the response."""
    sent = {"Accept": "application/json, text/event-stream", **(headers or {})}
    if token:
        sent["Authorization"] = f"Token {token}"
    if content is None:
        content = json.dumps(body)
    sent.setdefault("Content-Type", "application/json")
    return httpx.post(endpoint(server), content=content, headers=sent, timeout=60)


def modern_headers(method: str, name: str | None = None) -> dict:
    out = {"MCP-Protocol-Version": MODERN, "Mcp-Method": method}
    if name:
        out["Mcp-Name"] = name
    return out


def modern_params(**params) -> dict:
    meta = {
        "io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientCapabilities": {},
    }
    return {**params, "_meta": meta}


# --- fixtures ----------------------------------------------------------------------------------


@pytest.fixture
def server(live_server):
    """The live server (WSGI, a thread per request); server threads close their connections."""
    settings_dict = connections.settings["default"]
    previous = settings_dict.get("CONN_MAX_AGE", 0)
    settings_dict["CONN_MAX_AGE"] = 0
    cache.clear()
    yield live_server.url
    settings_dict["CONN_MAX_AGE"] = previous
    cache.clear()


@pytest.fixture
def cluster(shared_cluster):
    """A real django-q2 cluster on the test database, shared by the module's tests."""
    return shared_cluster(workers=2)


def _user(name: str):
    user = UserFactory(username=name)
    user.token = Token.objects.create(user=user).key
    return user


@pytest.fixture
def alice(transactional_db):
    return _user("alice")


@pytest.fixture
def bob(transactional_db):
    return _user("bob")


@pytest.fixture
def host(server, alice):
    """host(mode, user=alice, **callbacks) -> Host."""

    def make(mode: str, user=alice, **callbacks) -> Host:
        return Host(server, getattr(user, "token", None), mode, **callbacks)

    return make


def refusal(run):
    """Run `run()`, which must fail; return the MCPError it raised (out of any exception group)."""
    try:
        run()
    except BaseException as exc:  # noqa: BLE001 (looked into below)
        found = exc
        while isinstance(found, BaseExceptionGroup) and len(found.exceptions) == 1:
            found = found.exceptions[0]
        if isinstance(found, MCPError):
            return found
        raise
    raise AssertionError("the call succeeded")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def asgi_server(transactional_db):
    """The app served by uvicorn (ASGI) on loopback, in this process; its URL."""
    from .conftest import served_asgi

    with served_asgi() as url:
        yield url


@pytest.fixture
def gunicorn_server(transactional_db):
    """The app served by gunicorn (WSGI, gthread, as the README recommends) in a subprocess."""
    import os
    import signal
    import subprocess
    import sys

    from .cluster import ROOT, database_env
    from .conftest import wait_for

    port = free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gunicorn",
            "project.wsgi:application",
            f"--bind=127.0.0.1:{port}",
            "--workers=1",
            "--worker-class=gthread",
            "--threads=4",
            "--preload",
        ],
        cwd=ROOT,
        env={**os.environ, **database_env(), "DJANGO_SETTINGS_MODULE": "tests.settings"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"

    def answers() -> bool:
        try:
            return httpx.get(f"{url}{PREFIX}/", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_for(answers, timeout=30, interval=0.2, message="gunicorn answers")
        yield url
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)
