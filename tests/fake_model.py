"""A scripted OpenAI-compatible model server on loopback, and the harness of the chat scenarios.

`FakeModel(script)` is a real `ThreadingHTTPServer` on 127.0.0.1 (port 0). The script is a
function from the recorded `Request` to a reply built with `answer`, `calls`, `http` or `hold`.
Every request is recorded (path, headers, raw body, parsed JSON, arrival order), with per-model
counters of requests served and the most in flight at once. A cluster in another process
reaches it over HTTP at `url`, so the script always runs here, in the test process.

The test modules load this file as a plugin (`pytest_plugins`) for its fixtures after importing
its helpers, so it opts out of assertion rewriting: PYTEST_DONT_REWRITE.
"""

import json
import select
import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.conf import settings
from django.db import connection
from django.test import override_settings

from agenttasks import lifecycle, registry
from agenttasks.execution import worker
from agenttasks.models import Event, Task
from agenttasks.tools import tool

U = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
ASK_USER = "agenttasks.runtime.approvals.ask_user"


# --- replies ---------------------------------------------------------------------------------


@dataclass
class Reply:
    status: int = 200
    body: bytes = b""
    headers: dict = field(default_factory=dict)
    until: object = None  # hold: a predicate of the request
    deadline: float = 5.0
    then: "Reply | None" = None
    label: str = ""  # what the reply was, for `FakeModel.sent`
    chunks: list | None = None  # a streamed reply: SSE frames, sent one by one (chunked)
    gap: float = 0.0  # seconds between two frames


def _json(value) -> bytes:
    return json.dumps(value, ensure_ascii=False).encode()


def answer(text, usage=U) -> Reply:
    """200 with the assistant's text (no tool calls)."""
    body = {"choices": [{"message": {"role": "assistant", "content": text}}]}
    if usage is not None:
        body["usage"] = usage
    return Reply(
        body=_json(body), headers={"Content-Type": "application/json"}, label=f"answer:{text}"
    )


def calls(*specs, usage=U) -> Reply:
    """200 with content null and tool calls (id, name, args); a dict is sent as a JSON string."""
    tool_calls = [
        {
            "id": call_id,
            "type": "function",
            "function": {
                "name": name,
                "arguments": args if isinstance(args, str) else json.dumps(args),
            },
        }
        for call_id, name, args in specs
    ]
    body = {
        "choices": [{"message": {"role": "assistant", "content": None, "tool_calls": tool_calls}}]
    }
    if usage is not None:
        body["usage"] = usage
    label = "calls:" + ",".join(s[0] for s in specs)
    return Reply(body=_json(body), headers={"Content-Type": "application/json"}, label=label)


def _frame(value) -> bytes:
    return b"data: " + (value if isinstance(value, bytes) else _json(value)) + b"\n\n"


def streamed(
    deltas: list[dict], usage=U, gap: float = 0.0, finish="stop", cut: bool = False
) -> Reply:
    """200 text/event-stream: one chunk per `choices[0].delta`, then usage and [DONE] (with
    `cut`, the stream ends after the deltas, as a dropped one does)."""
    frames = [
        _frame({"choices": [{"index": 0, "delta": delta, "finish_reason": None}]})
        for delta in deltas
    ]
    if not cut:
        frames.append(_frame({"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}))
        if usage is not None:
            frames.append(_frame({"choices": [], "usage": usage}))
        frames.append(_frame(b"[DONE]"))
    return Reply(
        headers={"Content-Type": "text/event-stream"},
        chunks=frames,
        gap=gap,
        label=f"streamed:{len(deltas)}",
    )


def stream_answer(pieces: list[str], usage=U, gap: float = 0.0) -> Reply:
    """A streamed answer: the role, then each piece of content in its own chunk."""
    deltas = [{"role": "assistant", "content": ""}] + [{"content": p} for p in pieces]
    return streamed(deltas, usage=usage, gap=gap)


def http(status, body=b"", headers=None) -> Reply:
    """Any status with a body: a dict as JSON, a str as text."""
    if isinstance(body, (dict, list)):
        body = _json(body)
    elif isinstance(body, str):
        body = body.encode()
    return Reply(status=status, body=body, headers=dict(headers or {}), label=f"http:{status}")


def hold(until, deadline=5.0, then=None) -> Reply:
    """Block until `until(request)` holds, then send `then`; 500 when the deadline passes first."""
    return Reply(until=until, deadline=deadline, then=then or answer("released"))


def disconnected(request) -> bool:
    """A hold condition: the client closed its connection."""
    return request.disconnected()


# --- the server ------------------------------------------------------------------------------


class Request:
    """One recorded request."""

    def __init__(self, index, path, headers, raw, sock):
        self.index = index
        self.path = path
        self.headers = headers
        self.raw = raw
        self.json = json.loads(raw.decode()) if raw else {}
        self._sock = sock
        self.peer = sock.getpeername()  # the client's (host, port): one per connection
        self.answered = threading.Event()
        self.arrived = time.monotonic()

    @property
    def model(self) -> str:
        return self.json.get("model", "")

    @property
    def messages(self) -> list:
        return self.json.get("messages", [])

    @property
    def tools(self) -> list | None:
        return self.json.get("tools")

    @property
    def tool_names(self) -> list:
        return [t["function"]["name"] for t in self.tools or []]

    def tool_contents(self) -> list:
        return [m["content"] for m in self.messages if m["role"] == "tool"]

    @property
    def has_tool_message(self) -> bool:
        return bool(self.tool_contents())

    @property
    def last_tool(self) -> str:
        return self.tool_contents()[-1]

    @property
    def first_user(self) -> str:
        return next(m["content"] for m in self.messages if m["role"] == "user")

    def tool(self, name: str) -> dict:
        return next(t["function"] for t in self.tools if t["function"]["name"] == name)

    def disconnected(self) -> bool:
        try:
            readable, _, _ = select.select([self._sock], [], [], 0)
            return bool(readable) and self._sock.recv(1, socket.MSG_PEEK) == b""
        except (OSError, ValueError):  # ValueError: the server has closed the socket since
            return True


class _Server(ThreadingHTTPServer):
    request_queue_size = 1024  # hundreds of runs in flight connect at once


class FakeModel:
    """The server: answers each request from the script and records it."""

    def __init__(self, script=None):
        self.script = script or (lambda request: answer("ok"))
        self.requests: list[Request] = []
        self.served: Counter = Counter()
        self.max_in_flight: Counter = Counter()
        self.sent: list[tuple[str, str]] = []  # (model, reply label), in the order sent
        self._in_flight: Counter = Counter()
        self._lock = threading.Lock()
        self.server = _Server(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def close(self) -> None:
        # shutdown() waits for serve_forever without a deadline; this waits five seconds at most.
        threading.Thread(target=self.server.shutdown, daemon=True).start()
        self.thread.join(5)
        self.server.server_close()

    def of(self, model: str) -> list[Request]:
        """The requests for one model, in arrival order."""
        return [r for r in self.requests if r.model == model]

    def _handler(self):
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_POST(self):
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                headers = {k.lower(): v for k, v in self.headers.items()}
                with fake._lock:
                    request = Request(len(fake.requests), self.path, headers, raw, self.connection)
                    fake.requests.append(request)
                    model = request.model
                    fake._in_flight[model] += 1
                    fake.max_in_flight[model] = max(
                        fake.max_in_flight[model], fake._in_flight[model]
                    )
                try:
                    reply = fake._reply(request)
                    self._send(reply)
                    with fake._lock:
                        fake.sent.append((model, reply.label))
                finally:
                    with fake._lock:
                        fake._in_flight[model] -= 1
                        fake.served[model] += 1
                    request.answered.set()
                    connection.close()  # a script may have read the database in this thread

            def _send(self, reply):
                try:
                    self.send_response(reply.status)
                    for name, value in reply.headers.items():
                        self.send_header(name, value)
                    if reply.chunks is not None:
                        self._send_chunks(reply)
                        return
                    self.send_header("Content-Length", str(len(reply.body)))
                    self.end_headers()
                    self.wfile.write(reply.body)
                except OSError:
                    pass  # the client is gone

            def _send_chunks(self, reply):
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for index, chunk in enumerate(reply.chunks):
                    if index and reply.gap:
                        time.sleep(reply.gap)
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()

        return Handler

    def _reply(self, request: Request) -> Reply:
        try:
            reply = self.script(request)
            while reply.until is not None:
                deadline = time.monotonic() + reply.deadline
                while not reply.until(request):
                    if time.monotonic() > deadline:
                        return http(500, {"error": {"message": "fake model: hold deadline passed"}})
                    time.sleep(0.01)
                reply = reply.then
            return reply
        except Exception as exc:  # a broken script fails loudly, as a 500
            return http(500, {"error": {"message": f"fake model script: {exc!r}"}})


# --- tools the scenario agents use (dotted paths: tests.fake_model.<name>) --------------------

TOOL_RUNS: Counter = Counter()
TOOL_LOG: list[tuple[str, str]] = []  # (tool, run id)


def _ran(ctx, name: str) -> None:
    TOOL_RUNS[name] += 1
    TOOL_LOG.append((name, ctx.run_id))


@tool(
    description="Look a term up in the project index.",
    parameters={
        "type": "object",
        "properties": {"q": {"type": "string", "description": "What to look up"}},
        "required": ["q"],
    },
)
def lookup(ctx, args):
    _ran(ctx, "lookup")
    return f"data({args['q']})"


@tool(needs_approval=True, approval_prompt="approve secret access?")
def secret(ctx, args):
    """Read the secret."""
    _ran(ctx, "secret")
    return "secret-token"


@tool(
    needs_approval=True,
    parameters={"type": "object", "properties": {"to": {"type": "string"}}, "required": ["to"]},
)
def send_email(ctx, args):
    """Send an email."""
    _ran(ctx, "send_email")
    return "sent"


@tool
def boom(ctx, args):
    """Always fail."""
    _ran(ctx, "boom")
    raise ValueError("bad input")


LOOKUP = "tests.fake_model.lookup"
SECRET = "tests.fake_model.secret"
SEND_EMAIL = "tests.fake_model.send_email"


# --- fixtures and helpers --------------------------------------------------------------------


class ModelEnv:
    """The server of one test and the AGENTTASKS settings that point at it."""

    def __init__(self, server: FakeModel):
        self.server = server
        self.values = {
            "MODEL_BASE_URL": server.url,
            "MODEL_API_KEY": "sk-test",
            "DEFAULT_MODEL": "m-default",
            "MODEL_RETRIES": 0,
        }
        self._override = None

    def script(self, script) -> FakeModel:
        self.server.script = script
        return self.server

    def set(self, **values) -> None:
        """Change settings for the rest of the test (None removes a key)."""
        self.values.update(values)
        self._apply()

    def _apply(self) -> None:
        self.unset()
        merged = {**getattr(settings, "AGENTTASKS", {}), **self.values}
        merged = {k: v for k, v in merged.items() if v is not None}
        self._override = override_settings(AGENTTASKS=merged)
        self._override.enable()

    def unset(self) -> None:
        if self._override is not None:
            self._override.disable()
            self._override = None


@pytest.fixture
def model(monkeypatch):
    """A fake model server and settings pointing at it (no AGENTTASKS_MODEL_* from outside)."""
    for name in (
        "AGENTTASKS_MODEL_BASE_URL",
        "AGENTTASKS_MODEL_API_KEY",
        "AGENTTASKS_DEFAULT_MODEL",
    ):
        monkeypatch.delenv(name, raising=False)
    TOOL_RUNS.clear()
    TOOL_LOG.clear()
    server = FakeModel()
    env = ModelEnv(server)
    env._apply()
    yield env
    env.unset()
    server.close()


@pytest.fixture
def agents():
    """Register agents for one test (chat by default); the previous definitions come back after."""
    saved = {}

    def register(agent_id, **fields):
        if agent_id not in saved:
            try:
                saved[agent_id] = registry.get(agent_id)
            except registry.UnknownAgent:
                saved[agent_id] = None
        fields.setdefault("runtime", "chat")
        return registry.register(agent_id, replace=True, **fields)

    yield register
    for agent_id, previous in saved.items():
        registry.unregister(agent_id)
        if previous is not None:
            registry.register(previous, replace=True)


def in_thread(target, *args) -> threading.Thread:
    """Start target(*args) in a thread that closes its database connection when it ends."""

    def body():
        try:
            target(*args)
        finally:
            connection.close()

    thread = threading.Thread(target=body)
    thread.start()
    return thread


def run_to_idle(queue, limit: int = 200) -> list[str]:
    """Execute queued runs in this thread until none is left; return the run ids executed."""
    executed = []
    start = getattr(queue, "_idle_from", 0)
    while start < len(queue.run_ids):
        run_id = queue.run_ids[start]
        start += 1
        worker.execute_run(run_id)
        executed.append(run_id)
        assert len(executed) < limit, "runs never went idle"
    queue._idle_from = start
    return executed


def task_for(user, agent: str, text: str = "go") -> Task:
    """A task for an agent (lifecycle.create), its first run enqueued."""
    return lifecycle.create(owner=user, agent_id=agent, input=text)


def refresh(task: Task) -> Task:
    return Task.objects.select_related("run", "conversation").get(pk=task.pk)


def events(conversation_id, type_=None) -> list[Event]:
    rows = Event.objects.filter(conversation_id=conversation_id).order_by("seq")
    return list(rows.filter(type=type_) if type_ else rows)


def tool_results(conversation_id) -> dict:
    """The tool.result events' data by tool call id."""
    return {e.data["toolCallId"]: e.data for e in events(conversation_id, "tool.result")}


def transcript(conversation_id) -> list:
    """The conversation's transcript in short form: (role, content or call ids)."""
    from agenttasks.runtime.chat import transcript as build

    messages, _ = build(conversation_id, "")
    out = []
    for m in messages:
        if m["role"] == "assistant" and m.get("tool_calls"):
            out.append(("assistant", [c["id"] for c in m["tool_calls"]]))
        elif m["role"] == "tool":
            out.append(("tool", m["tool_call_id"], m["content"]))
        else:
            out.append((m["role"], m["content"]))
    return out


def delegates():
    return Task.objects.filter(kind="delegate").order_by("created_at", "id")


@pytest.fixture
def rest(user):
    """Call the REST API as `user` (token auth): rest(method, path, body) -> (status, json)."""
    from django.test import Client
    from rest_framework.authtoken.models import Token

    client = Client(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")

    def call(method: str, path: str, body=None):
        url = "/api/agents" + path
        if method == "get":
            response = client.get(url)
        else:
            response = client.post(url, json.dumps(body or {}), content_type="application/json")
        return response.status_code, response.json()

    return call
