"""The chat runtime's client of an OpenAI-compatible model server (docs/delegation.md#the-wire-format).

The request body, the reading of a response, retries on 429/5xx and connection failures, and
the process's one client (`model_io`): its requests run on an event loop of their own, so a
run waits on its reply holding no database connection, and an immediate stop or a wall budget
cancels that request alone. The loop that decides what to send lives in chat.py.
"""

import asyncio
import json
import logging
import math
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import httpx
from django.utils import timezone

from .. import __version__, tracing
from ..conf import app_settings
from ..flow import budgets, hints
from ..models import Run
from ..operations import metrics
from ..store.faults import reconnecting
from .base import RunContext, RunStopped, release_connection
from .budget import Budget, BudgetExceeded
from .streaming import Accumulator, StreamCut, StreamError

logger = logging.getLogger(__name__)

RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
NO_SERVER = (
    'No model server configured: set AGENTTASKS["MODEL_BASE_URL"] or the '
    "AGENTTASKS_MODEL_BASE_URL environment variable"
)
NO_MODEL = (
    'No model configured for agent "{id}": set AGENTTASKS["DEFAULT_MODEL"] or the agent\'s model'
)
STREAM_TOO_LONG = "Model server stream took longer than {seconds}s"
POLL = 0.05  # how often a run waiting on its inline children looks at their progress
BUSY_POLL = (0.05, 1.0)  # a full concurrency limit: the first wait for a permit, the longest
# A request that would leave more than LATE seconds after its turn takes a new turn (LATE_TURNS
# times at most): the provider counts arrivals, and a late one arrives with the turns after it.
LATE, LATE_TURNS = 0.02, 2
DRAIN_WITHIN = 1.0  # seconds: the most a stream's end is waited for after its [DONE]
POOL_SIZE = 32  # connections of one of the process's pools (_ModelIO)
RETRY_AFTER_CAP = 30.0  # seconds: the longest wait before a retry that is not for a limit
PATIENCE_TEXT = (
    "The model provider's rate limit kept this run waiting longer than its patience "
    '({patience:g}s) on endpoint "{endpoint}"'
)


class Parked(Exception):
    """A request's turn is further off than PARK_AFTER: the run gives back its slot and is
    queued again until shortly before its place in the line (docs/operating.md#meeting-your-providers-limits)."""

    def __init__(self, since: datetime, until: datetime):
        super().__init__("the run is parked until its turn")
        self.since = since  # the wait began then: the run's patience counts from then
        self.until = until


class LateTurn(Exception):
    """A request that would leave later than its turn allows (the process was busy): sent, it
    would arrive together with the turns after it, and providers count arrivals."""


class ModelError(Exception):
    """A model-server failure; its message is the run's error (docs/delegation.md#model-server-errors)."""

    def __init__(
        self,
        message: str,
        *,
        retryable: bool = False,
        retry_after: float | None = None,
        limited: bool = False,
        transient: bool | None = None,
    ):
        super().__init__(message)
        self.retryable = retryable  # this request may be sent again (MODEL_RETRIES)
        self.retry_after = retry_after
        self.limited = limited  # the provider's "later": a 429, or a 503 that says when
        # A failure that may pass (a 5xx, a lost connection, a timeout): the task may be tried
        # again by its agent's retry policy.
        self.transient = retryable if transient is None else transient
        self.sent_at: float | None = None  # when its request was sent (epoch), if it was


@dataclass
class Response:
    content: str | None
    calls: list[dict]
    usage: dict = field(default_factory=dict)
    finish_reason: str = ""


def request_body(model: str, messages: list, tools: list, params: dict) -> bytes:
    """Return the request body: model, messages, tools and tool_choice (only with tools), then
    params."""
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


def parse_response(response: httpx.Response) -> Response:
    """Read choices[0].message and usage from a response, or raise the ModelError of docs/delegation.md#model-server-errors."""
    if not 200 <= response.status_code < 300:
        detail = _detail(response)
        head = f"Model server returned HTTP {response.status_code}"
        wait = hints.retry_after(response.headers)
        raise ModelError(
            f"{head}: {detail}" if detail else head,
            retryable=response.status_code in RETRY_STATUSES,
            retry_after=wait,
            limited=response.status_code == 429
            or (response.status_code == 503 and wait is not None),
        )
    try:
        data = json.loads(response.content)
    except ValueError:
        raise ModelError(
            f"Model server returned malformed JSON: {response.text[:200].strip()}"
        ) from None
    choices = data.get("choices") if isinstance(data, dict) else None
    choice = choices[0] if choices and isinstance(choices[0], dict) else {}
    message = choice.get("message")
    if not isinstance(message, dict):
        raise ModelError("Model server response has no choices[0].message")
    return from_message(message, data.get("usage"), choice.get("finish_reason") or "")


def from_message(message: dict, usage, finish_reason: str = "") -> Response:
    """Return a Response from `choices[0].message` and `usage` (answered whole or joined from a
    stream)."""
    return Response(
        _content(message.get("content")), _calls(message), _usage(usage), str(finish_reason)
    )


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


class _ModelIO:
    """This process's one client of the model server: an event loop in a thread of its own.

    Every run of the process sends its requests through it: keep-alive, at most
    MODEL_MAX_CONNECTIONS connections (one per slot by default), and a request that a stop
    abandons is cancelled, which closes its connection and no other. The connections are split
    among pools of POOL_SIZE at most (httpcore's pool looks at all its connections for each
    idle one whenever a request starts or ends: at 500 kept alive, the loop did little else).
    """

    def __init__(self, max_connections: int):
        self.pid = os.getpid()
        self.loop = asyncio.new_event_loop()
        count = math.ceil(max_connections / POOL_SIZE)
        tls = httpx.create_ssl_context()  # one for every pool: each takes a while to make
        self.sizes = [
            max_connections // count + (i < max_connections % count) for i in range(count)
        ]
        self.clients = [
            httpx.AsyncClient(
                limits=httpx.Limits(max_connections=size, max_keepalive_connections=size),
                verify=tls,
            )
            for size in self.sizes
        ]
        self.sending = [0] * count  # requests under way in each pool (touched in the loop only)
        threading.Thread(
            target=self.loop.run_forever, name="agenttasks-model-io", daemon=True
        ).start()

    def send(
        self,
        url: str,
        headers: dict,
        body: bytes,
        timeout: float,
        on_piece: Callable | None,
        not_after: float | None,
        endpoint: str,
        note: list,
    ) -> Future:
        """Start one request; its future holds (response, None) or (None, the joined stream).

        A request that cannot leave by `not_after` (monotonic) is not sent: LateTurn. An
        answer's status is noted for `endpoint`'s budget when the answer begins (in `note`, as
        budgets.sent makes it).
        """
        return asyncio.run_coroutine_threadsafe(
            self._send(
                url, headers, body, httpx.Timeout(timeout), on_piece, not_after, endpoint, note
            ),
            self.loop,
        )

    async def _send(self, url, headers, body, timeout, on_piece, not_after, endpoint, note):
        if not_after is not None and time.monotonic() > not_after:
            raise LateTurn()
        # The first pool with room: the fewest connections are opened, the most reused.
        room = (i for i, sending in enumerate(self.sending) if sending < self.sizes[i])
        index = next(room, len(self.sending) - 1)
        self.sending[index] += 1
        try:
            return await self._exchange(
                self.clients[index], url, headers, body, timeout, on_piece, endpoint, note
            )
        finally:
            self.sending[index] -= 1

    async def _exchange(self, client, url, headers, body, timeout, on_piece, endpoint, note):
        async def on_trace(event: str, info: dict) -> None:
            # Noted as its headers go out, not before its wait for a connection: the first
            # refusal's measure counts the requests the provider saw in the second before it.
            if note[0] is None and event.endswith("send_request_headers.started"):
                budgets.sent(endpoint, note)

        request = client.build_request(
            "POST",
            url,
            content=body,
            headers=headers,
            timeout=timeout,
            extensions={"trace": on_trace},
        )
        response = await client.send(request, stream=True)
        budgets.answered(note, response.status_code)
        if on_piece is None:
            try:
                await response.aread()
                return response, None
            finally:
                await response.aclose()
        try:
            kind = response.headers.get("content-type", "")
            if not 200 <= response.status_code < 300 or "text/event-stream" not in kind:
                await response.aread()  # an error, or a server that answered whole: read as JSON
                return response, None
            accumulator = Accumulator(on_piece)
            lines = response.aiter_lines()
            async for line in lines:
                accumulator.line(line)
                if accumulator.done:
                    break
            accumulator.ended()
            await _read_to_end(lines)
            return None, accumulator
        finally:
            await response.aclose()


async def _read_to_end(lines) -> None:
    """Read what is left of a stream after its [DONE] (the end of its chunked body): a response
    read to its end leaves its connection open for the next request, one closed before closes
    it, and each new connection is a handshake more, late under load. A server that goes on
    sending after [DONE] is given DRAIN_WITHIN seconds, then its connection is closed."""
    try:
        async with asyncio.timeout(DRAIN_WITHIN):
            async for _ in lines:
                pass
    except (TimeoutError, httpx.HTTPError):
        pass


_io: _ModelIO | None = None
_io_lock = threading.Lock()


def model_io() -> _ModelIO:
    """Return this process's model-server client, starting it (again after a fork) when needed."""
    global _io
    with _io_lock:
        if _io is None or _io.pid != os.getpid():
            size = app_settings.MODEL_MAX_CONNECTIONS or app_settings.WORKER_SLOTS or 100
            _io = _ModelIO(size)
        return _io


@dataclass
class Config:
    url: str
    headers: dict
    model: str
    timeout: float  # a whole answer; a stream's first byte and each silence between its pieces
    retries: int
    stream_timeout: float = 600.0  # a whole streamed reply
    endpoint: str = "default"
    patience: float = 300.0

    @property
    def host(self) -> str:
        return httpx.URL(self.url).host


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
        stream_timeout=float(app_settings.MODEL_STREAM_TIMEOUT),
        endpoint=getattr(agent, "endpoint", "default"),
        patience=float(getattr(agent, "patience_seconds", None) or app_settings.PROVIDER_PATIENCE),
    )


# --- one run's requests ----------------------------------------------------------------------


def estimated_tokens(body: bytes, params: dict) -> int:
    """Estimate a request's tokens before it is sent: about four bytes a prompt token, plus
    the completion it allows (the usage the provider reports corrects it)."""
    completion = params.get("max_completion_tokens") or params.get("max_tokens") or 0
    return len(body) // 4 + (completion if isinstance(completion, int) else 0)


def timed(on_delta: Callable, first: list) -> Callable:
    """Wrap `on_delta` to note when the first piece arrived (in `first`)."""

    def noting(text):
        if not first:
            first.append(time.monotonic())
        on_delta(text)

    return noting


class ModelClient:
    """The model server of one run: each request retried, and abandoned on a stop or budget."""

    def __init__(self, ctx: RunContext, budget: Budget):
        self.config = config(ctx.agent)
        self.ctx = ctx
        self.budget = budget
        # A parked run taken back: its first request has waited since it parked.
        self.limited_since = getattr(ctx.run, "limited_since", None)
        self.park_after = float(app_settings.PARK_AFTER or 0) if ctx.may_park() else 0.0
        model_io()  # started now (its TLS context takes a while), not between a turn and its send

    def complete(
        self, messages: list, tools: list, params: dict, on_delta: Callable | None = None
    ) -> Response:
        """Send one chat-completions request, retrying what may succeed on a second try.

        With `on_delta` the completion is streamed (`stream: true`, usage included) and
        `on_delta(text)` is called with each piece of content as it arrives, in the client's
        event loop: it must not block (deltas.publish only buffers).
        """
        with tracing.span(
            f"chat {self.config.model}",
            {
                "gen_ai.operation.name": "chat",
                "gen_ai.provider.name": "openai",  # the API it speaks: OpenAI's chat completions
                "gen_ai.request.model": self.config.model,
                "server.address": self.config.host,
                "agenttasks.endpoint": self.config.endpoint,
            },
            kind="CLIENT",
            expected=(Parked, RunStopped),
        ) as traced:
            traced.content("gen_ai.input.messages", messages)
            started = time.monotonic()
            first: list[float] = []
            if on_delta is not None and tracing.enabled():
                on_delta = timed(on_delta, first)
            response = self._complete(messages, tools, params, on_delta)
            usage = response.usage
            traced.set("gen_ai.usage.input_tokens", usage.get("prompt_tokens"))
            traced.set("gen_ai.usage.output_tokens", usage.get("completion_tokens"))
            if response.finish_reason:
                traced.set("gen_ai.response.finish_reasons", [response.finish_reason])
            if first:
                traced.set("gen_ai.response.time_to_first_chunk", first[0] - started)
            traced.content("gen_ai.output.messages", response.content or "")
            return response

    def _complete(
        self, messages: list, tools: list, params: dict, on_delta: Callable | None
    ) -> Response:
        if on_delta is not None:
            params = {**params, "stream": True, "stream_options": {"include_usage": True}}
        body = request_body(self.config.model, messages, tools, params)
        estimate = estimated_tokens(body, params)
        since, self.limited_since = self.limited_since, None
        parked_before = since is not None
        since = since or timezone.now()
        patience = self.config.patience - (timezone.now() - since).total_seconds()
        patience_ends = time.monotonic() + patience
        attempt, late_turns = 0, LATE_TURNS
        lasts = self.config.stream_timeout if on_delta is not None else self.config.timeout
        while True:
            turn = self._turn(estimate, lasts, patience_ends, since, parked_before)
            not_after = None
            if late_turns and not turn.busy:
                ahead = (turn.start - timezone.now()).total_seconds()
                not_after = time.monotonic() + max(ahead, 0.0) + LATE
            try:
                response = self._send(body, on_delta, not_after)
            except LateTurn:
                self._budget(budgets.release, turn)
                late_turns -= 1
                metrics.count("agenttasks_provider_late_turns_total", endpoint=turn.endpoint)
                continue
            except ModelError as exc:
                self._budget(budgets.release, turn)
                metrics.count("agenttasks_model_requests_total", outcome="error")
                if exc.limited:
                    # Not a failure: the whole cluster slows down, and this request waits its
                    # turn again (its patience bounds how long).
                    metrics.count("agenttasks_provider_refusals_total", endpoint=turn.endpoint)
                    tracing.current().event(
                        "agenttasks.provider.refused", retry_after=exc.retry_after
                    )
                    self._budget(
                        budgets.refused,
                        turn.endpoint,
                        exc.retry_after,
                        exc.sent_at,
                        turn.reserved_at,
                    )
                    continue
                if not exc.retryable or attempt >= self.config.retries:
                    raise
                attempt += 1
                delay = min(exc.retry_after or 0.5 * 2 ** (attempt - 1), RETRY_AFTER_CAP)
                logger.info("chat.retry run=%s attempt=%d error=%s", self.ctx.run_id, attempt, exc)
                self._sleep(delay)
            except BaseException:
                self._budget(budgets.release, turn)
                raise
            else:
                self._budget(budgets.release, turn, response.usage.get("total_tokens") or None)
                metrics.count("agenttasks_model_requests_total", outcome="ok")
                return response

    def _turn(
        self,
        estimate: int,
        lasts: float,
        patience_ends: float,
        since: datetime,
        parked_before: bool,
    ) -> budgets.Reservation:
        """Wait for this request's turn in its endpoint's shared budget; return its reservation
        (its permit outlives `lasts`, the longest the request may take).

        The wait holds no database connection; a stop ends it. A turn further off than
        PARK_AFTER parks the run (when it may park); a turn beyond the run's patience fails the
        run, saying it was the provider's limit.
        """
        busy_wait = BUSY_POLL[0]
        horizon = self.park_after or None
        while True:
            turn = self._budget(
                budgets.reserve,
                self.config.endpoint,
                estimate,
                lasts,
                horizon,
                owner=self.ctx.conversation.owner_id,
                priority=self.ctx.task.priority if self.ctx.task is not None else 0,
                parked_before=parked_before,
            )
            delay = busy_wait if turn.busy else (turn.start - timezone.now()).total_seconds()
            if parked_before and not turn.later:
                # It has its turn: a later park of this run (or its resume after a pause) waits
                # afresh, its patience whole again.
                self._budget(Run.objects.filter(pk=self.ctx.run_id).update, limited_since=None)
                parked_before = False
            if delay <= 0:
                metrics.count("agenttasks_provider_permits_total", endpoint=turn.endpoint)
                return turn
            if time.monotonic() + delay > patience_ends:
                self._budget(budgets.release, turn)
                metrics.count("agenttasks_provider_patience_ran_out_total", endpoint=turn.endpoint)
                raise ModelError(
                    PATIENCE_TEXT.format(patience=self.config.patience, endpoint=turn.endpoint)
                )
            if turn.later:
                # Back when about half the horizon is left before its place in the line.
                metrics.count("agenttasks_provider_parks_total", endpoint=turn.endpoint)
                tracing.current().event("agenttasks.provider.parked", turn_in_seconds=delay)
                raise Parked(since, turn.start - timedelta(seconds=self.park_after / 2))
            metrics.count("agenttasks_provider_waits_total", endpoint=turn.endpoint)
            tracing.current().event("agenttasks.provider.wait", seconds=delay)
            metrics.count("agenttasks_provider_wait_seconds_total", delay, endpoint=turn.endpoint)
            try:
                self._sleep(delay)
            except BaseException:
                self._budget(budgets.release, turn)
                raise
            if not turn.busy:
                metrics.count("agenttasks_provider_permits_total", endpoint=turn.endpoint)
                return turn
            busy_wait = min(busy_wait * 2, BUSY_POLL[1])

    @staticmethod
    def _budget(verb, *args, **kwargs):
        """Run one of the budget's verbs, then give the connection back (the run waits next).

        A verb is tried again while the database is away. One whose commit went through before
        its answer was lost counts twice: a reservation leaves one turn unused, a release moves
        the tokens' line by its correction twice, a refusal counts twice (its pause and drop
        are not repeated: docs/operating.md#meeting-your-providers-limits)."""
        try:
            return reconnecting(lambda: verb(*args, **kwargs))
        finally:
            release_connection()

    def _sleep(self, seconds: float) -> None:
        left, budget_text = self.budget.wall_deadline()
        if left is not None and left < seconds:
            self.ctx.wait(max(left, 0.0))
            raise BudgetExceeded(budget_text)
        self.ctx.wait(seconds)

    def _send(
        self, body: bytes, on_delta: Callable | None = None, not_after: float | None = None
    ) -> Response:
        # MODEL_TIMEOUT bounds a whole answer, but only each silence of a stream (as an HTTP
        # client's read timeout does): a stream still sending is cut by MODEL_STREAM_TIMEOUT.
        whole = self.config.stream_timeout if on_delta is not None else self.config.timeout
        cut = ""
        left, budget_text = self.budget.wall_deadline()
        if left is not None and left < whole:
            whole, cut = left, budget_text
        if whole <= 0:
            raise BudgetExceeded(cut)
        woken = threading.Event()
        note: list = [None, None]  # when the request was sent, and its answer's status
        future = model_io().send(
            self.config.url,
            # The span's context, by hand: the requests are sent from the process's own loop.
            {**self.config.headers, **tracing.headers()},
            body,
            min(self.config.timeout, whole),
            on_delta,
            not_after,
            self.config.endpoint,
            note,
        )
        future.add_done_callback(lambda _: woken.set())
        try:
            answered = self.ctx.wait(whole, future.done, woken)
        except RunStopped:
            future.cancel()  # disconnects this request, and no other
            raise
        if not answered:
            future.cancel()
            if on_delta is not None and not cut:
                raise ModelError(STREAM_TOO_LONG.format(seconds=format(whole, "g")), transient=True)
            self._timed_out(cut)
        try:
            response, streamed = future.result()
        except LateTurn:
            raise
        except StreamCut as exc:
            raise ModelError(str(exc), transient=True) from None
        except StreamError as exc:
            raise ModelError(str(exc)) from None
        except httpx.TimeoutException:
            self._timed_out(cut)
        except Exception as exc:
            raise ModelError(f"Model server unreachable: {exc}", retryable=True) from None
        if streamed is not None:
            message, usage = streamed.message()
            return from_message(message, usage, streamed.finish_reason)
        try:
            return parse_response(response)
        except ModelError as exc:
            exc.sent_at = note[0]
            raise

    def _timed_out(self, cut: str):
        if cut:  # the deadline came from a wall budget
            raise BudgetExceeded(cut)
        raise ModelError(
            f"Model server timed out after {format(self.config.timeout, 'g')}s", transient=True
        )
