# ruff: noqa: F811  (the fixtures imported from tests.mcp_support are parameters here)
"""OpenTelemetry traces across the queue (docs/operating.md#traces): a server and a cluster in
processes of their own, with TRACING on, export to a real OTLP otlp on loopback, which
decodes what they send with opentelemetry-proto."""

import json
import os
import signal
import subprocess
import sys

import httpx
import pytest

from agenttasks.models import Run, Task

from ..a2a_support import message_json
from ..cluster import ROOT, database_env
from ..conftest import wait_for
from ..fake_model import answer, calls
from ..mcp.test_tasks_extension import envelope as mcp_envelope
from ..mcp.test_tasks_extension import headers_for
from ..mcp_support import alice, free_port  # noqa: F401  (fixtures)
from ..otlp_receiver import Receiver

pytest_plugins = ["tests.fake_model"]
pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.postgres,
    pytest.mark.serial,
    pytest.mark.timeout(180),
]
API = "/api/agents"
TRACED = {"TRACING": True, "MAX_DEPTH": 2, "CALLBACK_ALLOWED_HOSTS": ["127.0.0.1"]}


@pytest.fixture
def otlp():
    r = Receiver()
    yield r
    r.close()


def otel_env(otlp: Receiver, service: str) -> dict:
    return {
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": otlp.url,
        "OTEL_SERVICE_NAME": service,
        "OTEL_BSP_SCHEDULE_DELAY": "100",  # milliseconds: the test waits for what is exported
    }


class Server:
    """gunicorn (as the README recommends) serving the app in a process of its own."""

    def __init__(self, env: dict, settings: dict):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gunicorn",
                "project.wsgi:application",
                f"--bind=127.0.0.1:{self.port}",
                "--workers=1",
                "--worker-class=gthread",
                "--threads=4",
                "--preload",
            ],
            cwd=ROOT,
            env={
                **os.environ,
                **database_env(),
                "DJANGO_SETTINGS_MODULE": "tests.settings",
                "AGENTTASKS_TEST_SETTINGS": json.dumps(settings),
                **env,
            },
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )

        def answers() -> bool:
            try:
                return httpx.get(f"{self.url}{API}/", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(answers, timeout=30, interval=0.2, message="gunicorn answers")

    def stop(self) -> None:
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(10)


@pytest.fixture
def traced(otlp, start_cluster):
    """Start a traced server and cluster (with `settings` added); return the server's URL."""
    servers = []

    def start(**settings) -> str:
        settings = {**TRACED, **settings}
        start.cluster = start_cluster(
            workers=1, env=otel_env(otlp, "agenttasks-worker"), **settings
        )
        server = Server(otel_env(otlp, "agenttasks-web"), settings)
        servers.append(server)
        return server.url

    yield start
    for server in servers:
        server.stop()


def create(url: str, user, **body) -> dict:
    headers = {"Authorization": f"Token {user.token}"}
    created = httpx.post(f"{url}{API}/tasks", json=body, headers=headers, timeout=30)
    assert created.status_code == 201, created.text
    return created.json()["task"]


def settled(task_id: str) -> Task:
    def done():
        task = Task.objects.get(pk=task_id)
        return task if task.status in ("completed", "failed", "cancelled") else None

    return wait_for(done, timeout=60, interval=0.1, message=f"{task_id} to settle")


def one(otlp: Receiver, name: str, **attributes):
    """Wait for the one span of that name (with these attributes) and return it."""

    def found():
        spans = [
            s
            for s in otlp.named(name)
            if all(s.attributes.get(k) == v for k, v in attributes.items())
        ]
        return spans[0] if len(spans) == 1 else None

    return wait_for(found, timeout=30, interval=0.1, message=f"the span {name} {attributes}")


def test_a_rest_create_of_lead_is_one_trace_across_processes(traced, otlp, alice, receiver):
    url = traced()
    lead = create(url, alice, agentId="lead", input="plan the trip", callbackUrl=receiver.url)
    child = wait_for(
        lambda: Task.objects.filter(parent_conversation_id=lead["conversationId"]).first(),
        timeout=30,
    )
    settled(child.id)
    wait_for(
        lambda: Run.objects.filter(task_id=lead["id"], trigger="wakeup", status="completed"),
        timeout=60,
        message="the lead's wake-up run",
    )

    request = one(otlp, "POST api/agents/tasks/?$", **{"http.target": "/api/agents/tasks"})
    assert request.service == "agenttasks-web" and request.parent_id == ""
    first_run = Run.objects.get(task_id=lead["id"], trigger="initial")
    lead_run = one(otlp, "invoke_agent lead", **{"agenttasks.run.id": first_run.id})
    assert lead_run.service == "agenttasks-worker"  # another process: the context crossed
    assert (lead_run.trace_id, lead_run.parent_id) == (request.trace_id, request.span_id)
    assert lead_run.attributes["gen_ai.agent.name"] == "lead"
    assert lead_run.attributes["gen_ai.conversation.id"] == lead["conversationId"]
    assert lead_run.attributes["agenttasks.task.id"] == lead["id"]
    assert lead_run.attributes["agenttasks.run.attempt"] == 1

    spawn = one(otlp, "execute_tool spawn_task")
    assert (spawn.trace_id, spawn.parent_id) == (request.trace_id, lead_run.span_id)
    assert spawn.attributes["agenttasks.child.task_id"] == child.id

    echo = one(otlp, "invoke_agent echo")
    assert (echo.trace_id, echo.parent_id) == (request.trace_id, spawn.span_id)
    assert echo.attributes["agenttasks.task.id"] == child.id

    woken = one(otlp, "invoke_agent lead", **{"agenttasks.run.trigger": "wakeup"})
    assert woken.trace_id == request.trace_id and woken.parent_id == request.span_id
    assert (request.trace_id, echo.span_id) in woken.links  # the child's run that woke it
    assert (request.trace_id, lead_run.span_id) in woken.links  # the run before it
    assert "error.type" not in woken.attributes

    stored = Task.objects.get(pk=lead["id"]).traceparent
    assert stored.split("-")[1:3] == [request.trace_id, request.span_id]

    # Each callback (its ending, and its ending after the wake-up) is a POST in the same trace,
    # and carries that span's context.
    def posts():
        found = [s for s in otlp.named("POST") if s.attributes.get("url.full") == receiver.url]
        return found if len(found) == len(receiver.requests) == 2 else None

    callbacks = wait_for(posts, timeout=30, message="two callbacks and their spans")
    assert {c.trace_id for c in callbacks} == {request.trace_id}
    assert {c.kind for c in callbacks} == {3}  # CLIENT
    sent = {tuple(r["headers"]["traceparent"].split("-")[1:3]) for r in receiver.requests}
    assert sent == {(c.trace_id, c.span_id) for c in callbacks}

    # The run's own log line names its trace and span.
    (line,) = [x for x in traced.cluster.lines if f"lead.spawning run={first_run.id}" in x]
    assert line.endswith(f" trace_id={request.trace_id} span_id={lead_run.span_id}")


@pytest.mark.parametrize("content", [False, True], ids=["by-default", "opted-in"])
def test_a_chat_agents_model_calls_are_chat_spans_and_carry_traceparent(
    traced, otlp, alice, model, content
):
    model.set(AGENTS={"chatter": {"runtime": "chat", "model": "fake", "stream": False}})
    model.script(
        lambda r: calls(("c1", "noop", {})) if not r.has_tool_message else answer("all done")
    )
    url = traced(TRACE_CONTENT=content, **model.values)
    task = create(url, alice, agentId="chatter", input="secret question")
    assert settled(task["id"]).status == "completed"
    chats = wait_for(lambda: len(otlp.named("chat fake")) == 2 and otlp.named("chat fake"))
    run = one(otlp, "invoke_agent chatter")
    for chat in chats:
        assert chat.parent_id == run.span_id and chat.trace_id == run.trace_id
        assert chat.attributes["gen_ai.request.model"] == "fake"
        assert chat.attributes["gen_ai.provider.name"] == "openai"
        assert chat.attributes["gen_ai.usage.input_tokens"] == 1
        assert chat.attributes["gen_ai.usage.output_tokens"] == 1
        if content:
            assert "secret question" in chat.attributes["gen_ai.input.messages"]
        else:  # the conventions' rule: no message content unless a setting opts in
            assert not any(key.endswith(".messages") for key in chat.attributes)
    final = [c for c in chats if c.attributes.get("gen_ai.output.messages")]
    assert [c.attributes["gen_ai.output.messages"] for c in final] == (
        ["all done"] if content else []
    )
    seen = [r.headers.get("traceparent", "") for r in model.server.requests]
    assert sorted(tp.split("-")[2] for tp in seen) == sorted(c.span_id for c in chats)
    assert all(tp.split("-")[1] == run.trace_id for tp in seen)


def test_an_a2a_send_and_an_mcp_call_start_traces_with_their_conventions_attributes(
    traced, otlp, alice
):
    url = traced()
    headers = {"Authorization": f"Token {alice.token}", "A2A-Version": "1.0"}
    body = {"message": message_json("hello over a2a"), "configuration": {"returnImmediately": True}}
    envelope = {"jsonrpc": "2.0", "id": 7, "method": "SendMessage", "params": body}
    sent = httpx.post(f"{url}{API}/a2a/echo/", json=envelope, headers=headers, timeout=30).json()
    a2a_task = sent["result"]["task"]
    settled(a2a_task["id"])
    a2a = one(otlp, "SendMessage")
    assert a2a.kind == 2  # SERVER
    assert a2a.attributes["a2a.method"] == "SendMessage"
    assert a2a.attributes["a2a.agent.id"] == "echo"
    assert a2a.attributes["a2a.binding"] == "jsonrpc"
    assert a2a.attributes["a2a.task.id"] == a2a_task["id"]
    assert a2a.attributes["a2a.context.id"] == a2a_task["contextId"]
    assert a2a.attributes["jsonrpc.request.id"] == "7"
    echo = one(otlp, "invoke_agent echo", **{"agenttasks.task.id": a2a_task["id"]})
    assert (echo.trace_id, echo.parent_id) == (a2a.trace_id, a2a.span_id)

    mcp = headers_for(alice, "tools/call", "echo")
    meta = mcp_envelope()
    call = {
        "jsonrpc": "2.0",
        "id": 9,
        "method": "tools/call",
        "params": {"name": "echo", "arguments": {"input": "hello over mcp"}, "_meta": meta},
    }
    created = httpx.post(f"{url}{API}/mcp", json=call, headers=mcp, timeout=30).json()["result"]
    settled(created["taskId"])
    tool = one(otlp, "tools/call echo")
    assert tool.kind == 2  # SERVER
    assert tool.attributes["mcp.method.name"] == "tools/call"
    assert tool.attributes["mcp.protocol.version"] == "2026-07-28"
    assert tool.attributes["gen_ai.tool.name"] == "echo"
    assert tool.attributes["gen_ai.operation.name"] == "execute_tool"
    assert tool.attributes["jsonrpc.request.id"] == "9"
    echo = one(otlp, "invoke_agent echo", **{"agenttasks.task.id": created["taskId"]})
    assert (echo.trace_id, echo.parent_id) == (tool.trace_id, tool.span_id)
    refused = {
        **call,
        "id": 10,
        "method": "tasks/get",
        "params": {"taskId": "task_x", "_meta": meta},
    }
    headers = {**mcp, "Mcp-Method": "tasks/get", "Mcp-Name": "task_x"}
    httpx.post(f"{url}{API}/mcp", json=refused, headers=headers, timeout=30)
    error = one(otlp, "tasks/get")
    assert error.attributes["error.type"] == "-32602" and error.status == 2


def test_with_tracing_off_nothing_is_exported_and_nothing_of_opentelemetry_imported(
    otlp, start_cluster, alice
):
    env = otel_env(otlp, "untraced")
    start_cluster(workers=1, env=env, MAX_DEPTH=2)
    server = Server(env, {"MAX_DEPTH": 2})
    try:
        lead = create(server.url, alice, agentId="lead", input="no traces")
        wait_for(
            lambda: Run.objects.filter(task_id=lead["id"], trigger="wakeup", status="completed"),
            timeout=60,
            message="the lead's wake-up run",
        )
    finally:
        server.stop()
    assert Task.objects.get(pk=lead["id"]).traceparent == ""
    assert otlp.spans == []
    probe = (
        "import sys, django; django.setup(); import project.urls, agenttasks.urls; "
        "from agenttasks.execution import worker; from agenttasks.runtime import chat; "
        "from agenttasks.a2a import views; from agenttasks.mcp import views; "
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=ROOT,
        env={**os.environ, **database_env(), "DJANGO_SETTINGS_MODULE": "tests.settings"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.stdout.strip() == "[]", out.stderr
