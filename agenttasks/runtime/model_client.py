"""The chat runtime's client of an OpenAI-compatible model server (docs/delegation.md#the-wire-format).

The request body, the reading of a response, retries on 429/5xx and connection failures, and
an exchange in a thread of its own that an immediate stop or a wall budget abandons and
disconnects. The loop that decides what to send lives in chat.py.
"""

import json
import logging
import queue
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpcore
import httpx

from .. import __version__, metrics
from ..conf import app_settings
from .base import RunContext, RunStopped
from .budget import Budget, BudgetExceeded
from .streaming import Accumulator, StreamError

logger = logging.getLogger(__name__)

RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
NO_SERVER = (
    'No model server configured: set AGENTTASKS["MODEL_BASE_URL"] or the '
    "AGENTTASKS_MODEL_BASE_URL environment variable"
)
NO_MODEL = (
    'No model configured for agent "{id}": set AGENTTASKS["DEFAULT_MODEL"] or the agent\'s model'
)
POLL = 0.05  # how often a waiting run looks at its stop flags


class ModelError(Exception):
    """A model-server failure; its message is the run's error (docs/delegation.md#model-server-errors)."""

    def __init__(self, message: str, *, retryable: bool = False, retry_after: float | None = None):
        super().__init__(message)
        self.retryable = retryable
        self.retry_after = retry_after


@dataclass
class Response:
    content: str | None
    calls: list[dict]
    usage: dict = field(default_factory=dict)


def request_body(model: str, messages: list, tools: list, params: dict) -> bytes:
    """The request body: model, messages, tools and tool_choice (only with tools), then params."""
    body = {"model": model, "messages": messages}
    if tools:
        body["tools"] = tools
        body["tool_choice"] = "auto"
    body.update(params)
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def _detail(response: httpx.Response) -> str:
    text = response.text
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    detail = None
    if isinstance(data, dict):
        error = data.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            detail = error["message"]
        elif isinstance(error, str):
            detail = error
    if detail is None:
        detail = text.strip()
    return detail[:500] + "…" if len(detail) > 500 else detail


def _drain(deltas: queue.Queue | None, on_delta: Callable | None) -> None:
    """Hand the pieces that arrived to the run, in order, in the run's own thread."""
    while deltas is not None and on_delta is not None:
        try:
            piece = deltas.get_nowait()
        except queue.Empty:
            return
        on_delta(piece)


def _retry_after(response: httpx.Response) -> float | None:
    try:
        return min(float(response.headers.get("Retry-After", "")), 30.0)
    except ValueError:
        return None


def parse_response(response: httpx.Response) -> Response:
    """Read choices[0].message and usage from a response, or raise the ModelError of docs/delegation.md#model-server-errors."""
    if not 200 <= response.status_code < 300:
        detail = _detail(response)
        head = f"Model server returned HTTP {response.status_code}"
        raise ModelError(
            f"{head}: {detail}" if detail else head,
            retryable=response.status_code in RETRY_STATUSES,
            retry_after=_retry_after(response),
        )
    try:
        data = json.loads(response.content)
    except ValueError:
        raise ModelError(
            f"Model server returned malformed JSON: {response.text[:200].strip()}"
        ) from None
    choices = data.get("choices") if isinstance(data, dict) else None
    message = choices[0].get("message") if choices and isinstance(choices[0], dict) else None
    if not isinstance(message, dict):
        raise ModelError("Model server response has no choices[0].message")
    return from_message(message, data.get("usage"))


def from_message(message: dict, usage) -> Response:
    """A Response from `choices[0].message` and `usage` (answered whole or joined from a stream)."""
    return Response(_content(message.get("content")), _calls(message), _usage(usage))


def _content(content) -> str | None:
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part["text"]
            for part in content
            if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    return json.dumps(content, ensure_ascii=False)


def _calls(message: dict) -> list[dict]:
    raw = message.get("tool_calls")
    if not raw:
        return []
    if not isinstance(raw, list):
        raise ModelError("Model server response has a malformed tool call at index 0")
    calls, seen = [], set()
    for index, call in enumerate(raw):
        function = call.get("function") if isinstance(call, dict) else None
        name = function.get("name") if isinstance(function, dict) else None
        call_id = call.get("id") if isinstance(call, dict) else None
        arguments = function.get("arguments", "") if isinstance(function, dict) else None
        if arguments is None:
            arguments = ""
        if isinstance(arguments, dict):
            arguments = json.dumps(arguments, ensure_ascii=False, separators=(",", ":"))
        if (
            not isinstance(call_id, str)
            or not call_id
            or call_id in seen
            or call.get("type", "function") != "function"
            or not isinstance(name, str)
            or not name
            or not isinstance(arguments, str)
        ):
            raise ModelError(f"Model server response has a malformed tool call at index {index}")
        seen.add(call_id)
        calls.append(
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
        )
    return calls


def _usage(usage) -> dict:
    usage = usage if isinstance(usage, dict) else {}

    def number(key):
        value = usage.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else 0

    prompt, completion = number("prompt_tokens"), number("completion_tokens")
    total = number("total_tokens") if "total_tokens" in usage else prompt + completion
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": total}


class _TrackingBackend(httpcore.NetworkBackend):
    """Remember the sockets a request opens, so that an immediate stop can shut them down."""

    def __init__(self, inner, sockets: list):
        self.inner = inner
        self.sockets = sockets

    def _track(self, stream):
        sock = stream.get_extra_info("socket")
        if sock is not None:
            self.sockets.append(sock)
        return stream

    def connect_tcp(self, *args, **kwargs):
        return self._track(self.inner.connect_tcp(*args, **kwargs))

    def connect_unix_socket(self, *args, **kwargs):
        return self._track(self.inner.connect_unix_socket(*args, **kwargs))

    def sleep(self, seconds: float) -> None:
        self.inner.sleep(seconds)


class _Exchange(threading.Thread):
    """One HTTP request in a thread of its own, which the run can abandon and disconnect."""

    def __init__(
        self,
        url: str,
        headers: dict,
        body: bytes,
        timeout: float,
        deltas: queue.Queue | None = None,
    ):
        super().__init__(name="agenttasks-model", daemon=True)
        self.sockets: list = []
        transport = httpx.HTTPTransport()
        pool = getattr(transport, "_pool", None)
        # httpx has no public hook for the sockets; without it an abort only abandons the thread.
        if pool is not None and hasattr(pool, "_network_backend"):
            pool._network_backend = _TrackingBackend(pool._network_backend, self.sockets)
        self.client = httpx.Client(transport=transport, timeout=httpx.Timeout(timeout))
        self.request = (url, headers, body)
        self.response: httpx.Response | None = None
        self.error: BaseException | None = None
        self.done = threading.Event()
        # Streaming: content pieces go to `deltas` as they arrive; the joined message lands here.
        self.deltas = deltas
        self.streamed: Accumulator | None = None

    def run(self) -> None:
        url, headers, body = self.request
        try:
            if self.deltas is None:
                self.response = self.client.post(url, content=body, headers=headers)
            else:
                self._stream(url, headers, body)
        except BaseException as exc:  # noqa: BLE001 (handed to the run's thread)
            self.error = exc
        finally:
            self.client.close()
            self.done.set()

    def _stream(self, url: str, headers: dict, body: bytes) -> None:
        with self.client.stream("POST", url, content=body, headers=headers) as response:
            kind = response.headers.get("content-type", "")
            if not 200 <= response.status_code < 300 or "text/event-stream" not in kind:
                response.read()  # an error, or a server that answered whole: read as JSON
                self.response = response
                return
            accumulator = Accumulator(self.deltas)
            for line in response.iter_lines():
                accumulator.line(line)
                if accumulator.done:
                    break
            self.streamed = accumulator

    def abort(self) -> None:
        """Disconnect from the server: the request thread ends with an error, unread."""
        for sock in list(self.sockets):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.client.close()


@dataclass
class Config:
    url: str
    headers: dict
    model: str
    timeout: float
    retries: int


def config(agent) -> Config:
    """Resolve the server, key, model and limits for one run (settings, then environment)."""
    base_url = app_settings.MODEL_BASE_URL
    if not base_url:
        raise ModelError(NO_SERVER)
    model = agent.model if agent.model not in ("", "inherit") else app_settings.DEFAULT_MODEL
    if not model:
        raise ModelError(NO_MODEL.format(id=agent.id))
    headers = {
        "Content-Type": "application/json",
        "Accept": "application/json",
        "User-Agent": f"agenttasks/{__version__}",
    }
    key = app_settings.MODEL_API_KEY
    if key:
        headers["Authorization"] = f"Bearer {key}"
    headers.update(app_settings.MODEL_HEADERS or {})
    return Config(
        url=str(base_url).rstrip("/") + "/chat/completions",
        headers=headers,
        model=model,
        timeout=float(app_settings.MODEL_TIMEOUT),
        retries=int(app_settings.MODEL_RETRIES),
    )


# --- one run's requests ----------------------------------------------------------------------


class ModelClient:
    """The model server of one run: each request retried, and abandoned on a stop or budget."""

    def __init__(self, ctx: RunContext, budget: Budget):
        self.config = config(ctx.agent)
        self.ctx = ctx
        self.budget = budget

    def complete(
        self, messages: list, tools: list, params: dict, on_delta: Callable | None = None
    ) -> Response:
        """Send one chat-completions request, retrying what may succeed on a second try.

        With `on_delta` the completion is streamed (`stream: true`, usage included) and
        `on_delta(text)` is called in this thread with each piece of content as it arrives.
        """
        if on_delta is not None:
            params = {**params, "stream": True, "stream_options": {"include_usage": True}}
        body = request_body(self.config.model, messages, tools, params)
        attempt = 0
        while True:
            try:
                response = self._send(body, on_delta)
            except ModelError as exc:
                metrics.count("agenttasks_model_requests_total", outcome="error")
                if not exc.retryable or attempt >= self.config.retries:
                    raise
                attempt += 1
                delay = exc.retry_after if exc.retry_after is not None else 0.5 * 2 ** (attempt - 1)
                logger.info("chat.retry run=%s attempt=%d error=%s", self.ctx.run_id, attempt, exc)
                self._sleep(delay)
            else:
                metrics.count("agenttasks_model_requests_total", outcome="ok")
                return response

    def _sleep(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.ctx.stop_now():
                raise RunStopped()
            message = self.budget.wall_reached()
            if message:
                raise BudgetExceeded(message)
            time.sleep(min(POLL, max(deadline - time.monotonic(), 0)))

    def _send(self, body: bytes, on_delta: Callable | None = None) -> Response:
        timeout, cut = self.config.timeout, ""
        left, budget_text = self.budget.wall_deadline()
        if left is not None and left < timeout:
            timeout, cut = left, budget_text
        if timeout <= 0:
            raise BudgetExceeded(cut)
        deltas: queue.Queue | None = queue.Queue() if on_delta is not None else None
        exchange = _Exchange(self.config.url, self.config.headers, body, timeout, deltas)
        deadline = time.monotonic() + timeout
        exchange.start()
        while not exchange.done.wait(POLL):
            _drain(deltas, on_delta)
            if self.ctx.stop_now():
                exchange.abort()
                raise RunStopped()
            if time.monotonic() >= deadline:
                exchange.abort()
                self._timed_out(cut)
        _drain(deltas, on_delta)
        if isinstance(exchange.error, StreamError):
            raise ModelError(str(exchange.error))
        if isinstance(exchange.error, httpx.TimeoutException):
            self._timed_out(cut)
        if exchange.error is not None:
            raise ModelError(f"Model server unreachable: {exchange.error}", retryable=True)
        if exchange.streamed is not None:
            return from_message(*exchange.streamed.message())
        if exchange.response is None:
            raise ModelError("Model server unreachable: no response", retryable=True)
        return parse_response(exchange.response)

    def _timed_out(self, cut: str):
        if cut:  # the deadline came from a wall budget
            raise BudgetExceeded(cut)
        raise ModelError(f"Model server timed out after {format(self.config.timeout, 'g')}s")
