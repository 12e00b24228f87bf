"""The chat runtime: an OpenAI-compatible chat-completions loop over httpx.

docs/delegation.md#the-chat-runtime is the contract. A run reads its transcript from the conversation's
event log, calls the model, appends what the model said and what its tools returned, and ends
completed, failed, paused or cancelled. No transaction or row lock is held while the model thinks
or a tool runs; every event is appended in its own short transaction.
"""

import json
import logging
import socket
import threading
import time
from dataclasses import dataclass, field

import httpcore
import httpx

from .. import __version__, store
from ..conf import app_settings
from ..models import Event, PendingAction, Run
from ..states import TaskKind
from ..types import ActionRequest, RunOutcome
from . import approvals, delegation
from . import task_tools as background
from .base import BudgetExceeded, RunContext, RunStopped, ToolContext, ToolResult
from .registry import ASK_USER_PATH

logger = logging.getLogger(__name__)

RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
INTERRUPTED = "Tool call interrupted: the run ended before it returned a result"
NO_SERVER = (
    'No model server configured: set AGENTTASKS["MODEL_BASE_URL"] or the '
    "AGENTTASKS_MODEL_BASE_URL environment variable"
)
NO_MODEL = (
    'No model configured for agent "{id}": set AGENTTASKS["DEFAULT_MODEL"] or the agent\'s model'
)
PRIMITIVES = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
}
TRANSCRIPT_TYPES = ("message.user", "message.assistant", "tool.result", "task.notification")
POLL = 0.05  # how often a waiting run looks at its stop flags


def execute(ctx: RunContext) -> RunOutcome:
    """Run the chat loop for one run and report how it ended."""
    return ChatRun(ctx).execute()


# --- the toolset (docs/delegation.md#the-toolset) ---------------------------------------------


@dataclass
class Tool:
    """One tool of a run's toolset, as the model sees it and as the runtime calls it."""

    name: str
    kind: str  # "own", "ask_user", "background" or "task"
    parameters: dict
    schema: dict
    spec: object = None  # ToolSpec of an own tool
    model_tool: object = None  # ModelTool of a background-task tool


def _function(name: str, description: str, parameters: dict) -> dict:
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": parameters},
    }


def toolset(ctx: RunContext) -> dict[str, Tool]:
    """Build a run's tools in wire order: own tools, background-task tools, then `task`."""
    tools: dict[str, Tool] = {}
    for spec in ctx.agent.tools:
        kind = "ask_user" if spec.path == ASK_USER_PATH else "own"
        schema = _function(spec.name, spec.description, spec.parameters)
        tools[spec.name] = Tool(spec.name, kind, spec.parameters, schema, spec=spec)
    # A task's own run never gets the four tools (delegates never; others per MAX_DEPTH).
    is_delegate = ctx.task is not None and ctx.task.kind == TaskKind.DELEGATE
    if not is_delegate and background.attachable(ctx.conversation):
        for model_tool in background.task_tools(ctx.conversation, ctx.run, stop_check=ctx.stop_now):
            tools[model_tool.name] = Tool(
                model_tool.name,
                "background",
                model_tool.parameters,
                model_tool.schema(),
                model_tool=model_tool,
            )
    if ctx.agent.team:
        schema = _function("task", delegation.description(ctx.agent.team), delegation.PARAMETERS)
        tools["task"] = Tool("task", "task", delegation.PARAMETERS, schema)
    return tools


def parse_arguments(name: str, raw, parameters: dict) -> tuple[dict | None, str]:
    """Parse and check a call's arguments (docs/delegation.md#executing-a-responses-calls): (args, "") or (None, the error text)."""
    prefix = f"invalid arguments for {name}: "
    if isinstance(raw, str):
        if not raw.strip():
            value = {}
        else:
            try:
                value = json.loads(raw)
            except ValueError:
                return None, prefix + "arguments are not valid JSON"
    else:
        value = raw
    if not isinstance(value, dict):
        return None, prefix + "arguments must be a JSON object"
    properties = parameters.get("properties") or {}
    for prop in parameters.get("required") or ():
        if prop not in value:
            return None, prefix + f'missing required property "{prop}"'
    for prop, schema in properties.items():
        expected = schema.get("type") if isinstance(schema, dict) else None
        if prop in value and expected in PRIMITIVES and not PRIMITIVES[expected](value[prop]):
            return None, prefix + f'property "{prop}" must be of type {expected}'
    return value, ""


# --- the transcript (docs/delegation.md#the-transcript) ---------------------------------------


@dataclass
class Outstanding:
    """A recorded tool call without a result, and the run whose assistant message made it."""

    run_id: str
    call: dict


def transcript(conversation_id: str, system_prompt: str) -> tuple[list[dict], list[Outstanding]]:
    """Build the request's messages from the event log, and list the calls still outstanding."""
    events = Event.objects.filter(
        conversation_id=conversation_id, type__in=TRANSCRIPT_TYPES
    ).order_by("seq")
    entries: list = []  # a message, or an assistant slot: (message, run_id, calls, results)
    slot_of: dict[str, tuple] = {}
    for event in events:
        data = event.data or {}
        if event.type in ("message.user", "task.notification"):
            entries.append({"role": "user", "content": data.get("content", "")})
        elif event.type == "message.assistant":
            message = {"role": "assistant", "content": data.get("content")}
            calls = data.get("toolCalls") or []
            if calls:
                message["tool_calls"] = calls
                slot = (message, event.run_id, calls, {})
                entries.append(slot)
                for call in calls:
                    slot_of[call["id"]] = slot
            else:
                entries.append(message)
        else:  # tool.result: it goes after its assistant message, whenever it was appended
            slot = slot_of.get(data.get("toolCallId"))
            if slot is not None:
                slot[3].setdefault(
                    data["toolCallId"],
                    {
                        "role": "tool",
                        "tool_call_id": data["toolCallId"],
                        "content": data.get("content", ""),
                    },
                )
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    outstanding = []
    for entry in entries:
        if isinstance(entry, dict):
            messages.append(entry)
            continue
        message, run_id, calls, results = entry
        messages.append(message)
        for call in calls:
            if call["id"] in results:
                messages.append(results[call["id"]])
            else:
                outstanding.append(Outstanding(run_id, call))
    return messages, outstanding


# --- the wire (docs/delegation.md#the-wire-format) --------------------------------------------


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
    return Response(_content(message.get("content")), _calls(message), _usage(data.get("usage")))


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

    def __init__(self, url: str, headers: dict, body: bytes, timeout: float):
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

    def run(self) -> None:
        url, headers, body = self.request
        try:
            self.response = self.client.post(url, content=body, headers=headers)
        except BaseException as exc:  # noqa: BLE001 (handed to the run's thread)
            self.error = exc
        finally:
            self.client.close()
            self.done.set()

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


# --- one response's calls (docs/delegation.md#executing-a-responses-calls) -------------------


@dataclass
class Batch:
    """What executing one response's calls produced, by call id."""

    results: dict = field(default_factory=dict)  # call id -> ToolResult
    escalated: dict = field(default_factory=dict)  # call id -> delegation.CallResult
    outstanding: list = field(default_factory=list)  # call ids without a final result
    actions: list = field(default_factory=list)  # ActionRequests the pause creates


# --- the loop (docs/delegation.md#the-loop) ---------------------------------------------------


class ChatRun:
    """One execution of a chat agent's run."""

    def __init__(self, ctx: RunContext):
        self.ctx = ctx
        self.run = ctx.run
        self.agent = ctx.agent
        self.budget = ctx.budget

    def execute(self) -> RunOutcome:
        try:
            return self._loop()
        except RunStopped:
            return self._outcome("cancelled")
        except BudgetExceeded as exc:
            return self._outcome("failed", error=str(exc))
        except ModelError as exc:
            return self._outcome("failed", error=str(exc))
        finally:
            self._save_usage()

    def _outcome(self, status: str, **fields) -> RunOutcome:
        return RunOutcome(
            self.run.id, status, usage=self.budget.own.usage(), append_message=False, **fields
        )

    def _save_usage(self) -> None:
        # Written before the ending is recorded, so a resume continues the window's totals and
        # a caller absorbing this run reads what it spent.
        own = self.budget.own
        Run.objects.filter(pk=self.run.id).update(
            turns=own.turns,
            tool_calls=own.tool_calls,
            prompt_tokens=own.prompt_tokens,
            completion_tokens=own.completion_tokens,
            total_tokens=own.total_tokens,
            usage_known=True,
            exec_seconds=own.wall(),
        )

    def _loop(self) -> RunOutcome:
        self.config = config(self.agent)
        self.tools = toolset(self.ctx)
        _, outstanding = transcript(self.ctx.conversation_id, self.agent.system_prompt)
        if outstanding:
            paused = self._settle(outstanding)
            if paused is not None:
                return paused
        while True:
            self._check_stop()
            if self.ctx.read_stop_request() == "after_turn":
                return self._outcome("completed", graceful_stop=True)
            message = self.budget.before_call()
            if message:
                raise BudgetExceeded(message)
            messages, _ = transcript(self.ctx.conversation_id, self.agent.system_prompt)
            self.budget.spend(turns=1)
            response = self._call_model(messages)
            usage = response.usage
            self.budget.spend(
                prompt=usage["prompt_tokens"],
                completion=usage["completion_tokens"],
                total=usage["total_tokens"],
            )
            self._append_assistant(response)
            if not response.calls:
                text = response.content or ""
                return self._outcome("completed", text=text, graceful_stop=self.ctx.stop.after_turn)
            self._check_stop()
            message = self.budget.before_tools(len(response.calls))
            if message:
                raise BudgetExceeded(message)
            self.budget.spend(tool_calls=len(response.calls))
            batch = self._execute(response.calls)
            self._append_results(response.calls, batch)
            if batch.outstanding:
                return self._pause(batch)

    # stops --------------------------------------------------------------------------------
    def _check_stop(self) -> None:
        if self.ctx.stop_now():
            raise RunStopped()

    def _sleep(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self._check_stop()
            message = self.budget.wall_reached()
            if message:
                raise BudgetExceeded(message)
            time.sleep(min(POLL, max(deadline - time.monotonic(), 0)))

    # the model ----------------------------------------------------------------------------
    def _call_model(self, messages: list) -> Response:
        tools = [tool.schema for tool in self.tools.values()]
        body = request_body(self.config.model, messages, tools, self.agent.model_params or {})
        attempt = 0
        while True:
            try:
                return self._send(body)
            except ModelError as exc:
                if not exc.retryable or attempt >= self.config.retries:
                    raise
                attempt += 1
                delay = exc.retry_after if exc.retry_after is not None else 0.5 * 2 ** (attempt - 1)
                logger.info("chat.retry run=%s attempt=%d error=%s", self.run.id, attempt, exc)
                self._sleep(delay)

    def _send(self, body: bytes) -> Response:
        timeout, cut = self.config.timeout, ""
        left, budget_text = self.budget.wall_deadline()
        if left is not None and left < timeout:
            timeout, cut = left, budget_text
        if timeout <= 0:
            raise BudgetExceeded(cut)
        exchange = _Exchange(self.config.url, self.config.headers, body, timeout)
        deadline = time.monotonic() + timeout
        exchange.start()
        while not exchange.done.wait(POLL):
            if self.ctx.stop_now():
                exchange.abort()
                raise RunStopped()
            if time.monotonic() >= deadline:
                exchange.abort()
                self._timed_out(cut)
        if isinstance(exchange.error, httpx.TimeoutException):
            self._timed_out(cut)
        if exchange.error is not None:
            raise ModelError(f"Model server unreachable: {exchange.error}", retryable=True)
        return parse_response(exchange.response)

    def _timed_out(self, cut: str):
        if cut:  # the deadline came from a wall budget
            raise BudgetExceeded(cut)
        raise ModelError(f"Model server timed out after {format(self.config.timeout, 'g')}s")

    # the log ------------------------------------------------------------------------------
    def _append(self, events: list[tuple[str, dict, str]]) -> None:
        task_id = self.ctx.task_id or ""
        store.append_events(
            self.ctx.conversation_id,
            [(kind, data, self.run.id, other or task_id) for kind, data, other in events],
        )

    def _append_assistant(self, response: Response) -> None:
        usage = response.usage
        data = {
            "role": "assistant",
            "content": response.content,
            "toolCalls": response.calls,
            "model": self.config.model,
            # camelCase as the chat spec names it, plus the REST Usage names of the same values.
            "usage": {
                "promptTokens": usage["prompt_tokens"],
                "completionTokens": usage["completion_tokens"],
                "totalTokens": usage["total_tokens"],
                "inputTokens": usage["prompt_tokens"],
                "outputTokens": usage["completion_tokens"],
            },
        }
        events = [("message.assistant", data, "")]
        for call in response.calls:
            args, _ = parse_arguments(call["function"]["name"], call["function"]["arguments"], {})
            events.append(
                (
                    "tool.call",
                    {
                        "toolCallId": call["id"],
                        "toolName": call["function"]["name"],
                        "args": args if args is not None else {},
                    },
                    "",
                )
            )
        self._append(events)

    def _append_results(self, calls: list[dict], batch: Batch) -> None:
        events = []
        for call in calls:
            call_id, name = call["id"], call["function"]["name"]
            if call_id in batch.results:
                result = batch.results[call_id]
                data = {
                    "toolCallId": call_id,
                    "toolName": name,
                    "name": name,
                    "content": result.output,
                    "isError": result.is_error,
                    "metadata": result.metadata,
                }
                events.append(("tool.result", data, ""))
            elif call_id in batch.escalated:
                escalation = batch.escalated[call_id]
                data = {
                    "taskId": escalation.task_id,
                    "toolCallId": call_id,
                    "runId": self.run.id,
                    "output": escalation.result.output,
                    "isError": True,
                    "metadata": escalation.result.metadata,
                }
                events.append(("task.escalated", data, escalation.task_id))
        if events:
            self._append(events)

    # settling and pausing (docs/delegation.md#pausing-resuming-and-replay) ----------------
    def _settle(self, outstanding: list[Outstanding]) -> RunOutcome | None:
        """Replay this run's own outstanding calls (a resume); close any other run's."""
        others = [o.call for o in outstanding if o.run_id != self.run.id]
        if others:
            batch = Batch(results={c["id"]: ToolResult(INTERRUPTED, is_error=True) for c in others})
            self._append_results(others, batch)
        mine = [o.call for o in outstanding if o.run_id == self.run.id]
        if not mine:
            return None
        batch = self._execute(mine, replay=True)
        self._append_results(mine, batch)
        return self._pause(batch) if batch.outstanding else None

    def _pause(self, batch: Batch) -> RunOutcome:
        escalated = [e.task_id for e in batch.escalated.values()]
        if self.ctx.read_stop_request() == "after_turn" or self.ctx.stop_now():
            # A run told to stop never pauses for a person; the children it waits on go too.
            delegation.stop_children(escalated)
            if self.ctx.stop.now:
                raise RunStopped()
            return self._outcome("completed", graceful_stop=True)
        for task_id in escalated:
            logger.info("chat.paused_on_child run=%s task=%s", self.run.id, task_id)
        return self._outcome("input_required", actions=tuple(batch.actions))

    # executing calls ----------------------------------------------------------------------
    def _execute(self, calls: list[dict], *, replay: bool = False) -> Batch:
        batch = Batch()
        ordinary = []  # (call id, thunk), run in this thread in call order
        groups: dict[str, list] = {}  # identical task calls share one thread, in call order
        recorded = self._recorded_actions(calls) if replay else {}
        for call in calls:
            call_id, name = call["id"], call["function"]["name"]
            tool = self.tools.get(name)
            if tool is None:
                batch.results[call_id] = ToolResult(f"Unknown tool: {name}", is_error=True)
                continue
            args, problem = parse_arguments(name, call["function"]["arguments"], tool.parameters)
            if problem:
                batch.results[call_id] = ToolResult(problem, is_error=True)
                continue
            if tool.kind == "task":
                key = delegation.delegation_key(str(args["agent"]), str(args["prompt"]))
                groups.setdefault(key, []).append((call_id, args))
            elif tool.kind == "ask_user":
                if not args["question"].strip():
                    batch.results[call_id] = ToolResult(approvals.EMPTY_QUESTION, is_error=True)
                elif replay:
                    self._settle_question(batch, call_id, recorded.get(call_id))
                else:
                    request = approvals.question_request(call_id, args, self.ctx._deadline())
                    self._ask(batch, call_id, request)
            elif tool.kind == "own" and tool.spec.needs_approval:
                if replay:
                    action = recorded.get(call_id)
                    thunk = self._settle_approval(batch, call_id, tool, action)
                    if thunk is not None:
                        ordinary.append((call_id, thunk))
                else:
                    request = approvals.approval_request(
                        tool.spec, call_id, args, self.ctx._deadline()
                    )
                    self._ask(batch, call_id, request)
            elif replay:
                # Re-running a side-effecting tool after an interruption is never automatic.
                batch.results[call_id] = ToolResult(INTERRUPTED, is_error=True)
            else:
                ordinary.append((call_id, self._thunk(tool, call_id, args)))
        dispatcher = (
            delegation.Dispatcher(self.ctx, self.budget, groups, replay) if groups else None
        )
        if dispatcher is not None:
            dispatcher.start()
        try:
            for call_id, thunk in ordinary:
                self._check_stop()
                batch.results[call_id] = thunk()
        finally:
            if dispatcher is not None:
                self._join(dispatcher)
        self._check_stop()
        if dispatcher is not None:
            for call_id, outcome in dispatcher.outcomes.items():
                if outcome.escalated:
                    batch.escalated[call_id] = outcome
                    batch.outstanding.append(call_id)
                else:
                    batch.results[call_id] = outcome.result
        return batch

    def _join(self, dispatcher) -> None:
        stopped = False
        while not dispatcher.finished.wait(POLL):
            if not stopped and self.ctx.stop_now():
                stopped = True
                dispatcher.stop()  # an immediate stop reaches every inline child
        dispatcher.join()

    def _ask(self, batch: Batch, call_id: str, request: ActionRequest) -> None:
        batch.actions.append(request)
        batch.outstanding.append(call_id)

    def _recorded_actions(self, calls: list[dict]) -> dict:
        ids = [c["id"] for c in calls]
        actions = PendingAction.objects.filter(run_id=self.run.id, tool_call_id__in=ids)
        return {a.tool_call_id: a for a in actions.order_by("created_at", "id")}

    def _settle_question(self, batch: Batch, call_id: str, action) -> None:
        if action is None or action.status == "cancelled":
            batch.results[call_id] = ToolResult(INTERRUPTED, is_error=True)
        elif action.status == "pending":
            batch.outstanding.append(call_id)  # still asked: the run pauses on it again
        else:
            batch.results[call_id] = approvals.answer(action)

    def _settle_approval(self, batch: Batch, call_id: str, tool: Tool, action):
        if action is None or action.status == "cancelled":
            batch.results[call_id] = ToolResult(INTERRUPTED, is_error=True)
            return None
        if action.status == "pending":
            batch.outstanding.append(call_id)
            return None
        refused = approvals.denial(action)
        if refused is not None:
            batch.results[call_id] = refused
            return None
        return self._thunk(tool, call_id, approvals.approved_args(action))

    def _thunk(self, tool: Tool, call_id: str, args: dict):
        if tool.kind == "background":
            return lambda: self._background(tool, call_id, args)
        return lambda: self._own(tool, call_id, args)

    def _own(self, tool: Tool, call_id: str, args: dict) -> ToolResult:
        try:
            value = tool.spec.func(ToolContext(self.ctx, call_id), args)
        except (RunStopped, BudgetExceeded):
            raise
        except Exception as exc:
            logger.exception("chat.tool_failed run=%s tool=%s", self.run.id, tool.name)
            return ToolResult(
                f"tool {tool.name} failed: {type(exc).__name__}: {exc}", is_error=True
            )
        if isinstance(value, ToolResult):
            return value
        if value is None:
            return ToolResult("")
        if isinstance(value, str):
            return ToolResult(value)
        return ToolResult(json.dumps(value, ensure_ascii=False, default=str))

    def _background(self, tool: Tool, call_id: str, args: dict) -> ToolResult:
        try:
            out = tool.model_tool.call(args, call_id)
        except Exception as exc:
            logger.exception("chat.tool_failed run=%s tool=%s", self.run.id, tool.name)
            return ToolResult(
                f"tool {tool.name} failed: {type(exc).__name__}: {exc}", is_error=True
            )
        return ToolResult(out.text, is_error=out.is_error, metadata=out.details)
