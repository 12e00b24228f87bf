"""What agents are written against: the `tool` decorator, ToolResult and Reply."""

import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

DEFAULT_PARAMETERS = {"type": "object", "properties": {}}


@dataclass
class ToolResult:
    """The result of a tool call as the model will see it."""

    output: str
    is_error: bool = False
    metadata: dict | None = None


@dataclass
class Reply:
    """What a callable handler returns."""

    content: str = ""
    usage: dict | None = None
    metadata: dict = field(default_factory=dict)
    files: list = field(default_factory=list)


@dataclass(frozen=True)
class ToolSpec:
    """A registered tool: the function and what the model is told about it."""

    name: str
    description: str
    parameters: dict
    func: Callable[..., Any]
    needs_approval: bool = False
    approval_prompt: str | None = None
    path: str = ""


def tool(
    func=None,
    *,
    name: str | None = None,
    description: str | None = None,
    parameters: dict | None = None,
    needs_approval: bool = False,
    approval_prompt: str | None = None,
):
    """Attach a JSON schema (and approval settings) to a tool function `fn(ctx, args)`."""

    def decorate(fn):
        doc = (fn.__doc__ or "").strip().splitlines()
        fn.agenttasks_tool = {
            "name": name or fn.__name__,
            "description": description if description is not None else (doc[0] if doc else ""),
            "parameters": parameters if parameters is not None else dict(DEFAULT_PARAMETERS),
            "needs_approval": needs_approval,
            "approval_prompt": approval_prompt,
        }
        return fn

    return decorate(func) if func is not None else decorate


class RunStopped(Exception):
    """Raised at a checkpoint when the run was told to stop now (or its wall budget is gone)."""

    def __init__(self, reason: str = "stopped"):
        super().__init__(reason)
        self.reason = reason


class GracefulStop(Exception):
    """Raised where a run asked to stop after its turn would otherwise pause for a person."""


class PauseRun(Exception):
    """Raised by ctx.ask / ctx.request_approval the first time: the run pauses for a person."""

    def __init__(self, actions, text: str = ""):
        super().__init__("the run pauses for input")
        self.actions = tuple(actions)
        self.text = text


class StopFlag:
    """The run's stop request as its heartbeat last read it: '', 'after_turn' or 'now'."""

    def __init__(self):
        self._value = ""
        self._lock = threading.Lock()
        self.changed = threading.Event()

    @property
    def value(self) -> str:
        return self._value

    def set(self, value: str) -> None:
        with self._lock:
            if value and value != self._value and self._value != "now":
                self._value = value
                self.changed.set()

    @property
    def now(self) -> bool:
        return self._value == "now"

    @property
    def after_turn(self) -> bool:
        return self._value == "after_turn"


@dataclass
class Decision:
    """The recorded answer to an approval: truthy when approved."""

    approved: bool
    status: str
    comment: str = ""

    def __bool__(self) -> bool:
        return self.approved


class Answers(dict):
    """Normalized answers to a question, by question id; `expired` when nobody answered in time."""

    expired: bool = False


@dataclass
class FileHandle:
    """A file of the run's conversation: metadata, and the bytes on demand."""

    id: str
    name: str
    mime_type: str
    size: int
    storage_name: str = field(repr=False, default="")

    def read(self) -> bytes:
        from ..files import storage

        with storage().open(self.storage_name, "rb") as fh:
            return fh.read()


class RunContext:
    """What a runtime (and a callable handler) sees of the run it executes.

    Built by the worker from rows read after the claim. `check_cancelled()`, `progress()`,
    `request_approval()` and `ask()` are the handler's checkpoints and requests.
    """

    def __init__(
        self,
        *,
        run,
        conversation,
        task,
        agent,
        stop: StopFlag,
        depth: int | None = None,
        callers: list | None = None,
    ):
        self.run = run
        self.conversation = conversation
        self.task = task
        self.agent = agent
        self.stop = stop
        # A delegate child executed inline gets its depth and its callers' windows and stop
        # flags from the calling thread; any other run works them out from the database.
        self._depth = depth
        self._callers = callers
        self._window = None
        self._stopped_for_caller = False
        self._asks = 0

    # identity -------------------------------------------------------------------------------
    @property
    def run_id(self) -> str:
        return self.run.id

    @property
    def conversation_id(self) -> str:
        return self.conversation.id

    @property
    def task_id(self) -> str | None:
        return self.task.id if self.task is not None else None

    @property
    def agent_id(self) -> str:
        return self.agent.id

    @property
    def user(self):
        return self.conversation.owner

    @property
    def input(self) -> str:
        return self.run.input

    @property
    def trigger(self) -> str:
        return self.run.trigger

    @property
    def kind(self) -> str:
        return self.task.kind if self.task is not None else ""

    @property
    def state(self):
        return self.task.state if self.task is not None else None

    @property
    def attempt(self) -> int:
        return self.task.attempt_no() if self.task is not None else 1

    @property
    def is_retry(self) -> bool:
        return self.run.trigger == "retry"

    # what the conversation holds ------------------------------------------------------------
    @property
    def messages(self) -> list[dict]:
        """The conversation's messages so far: user, assistant and notification, oldest first."""
        from ..models import Event

        roles = {
            "message.user": "user",
            "message.assistant": "assistant",
            "task.notification": "notification",
        }
        rows = Event.objects.filter(conversation_id=self.conversation.id, type__in=roles).order_by(
            "seq"
        )
        out = []
        for event in rows:
            message = {"role": roles[event.type], "content": event.data.get("content", "")}
            if event.data.get("files"):
                message["files"] = event.data["files"]
            out.append(message)
        return out

    @property
    def latest_user_message(self) -> str:
        """The newest user message (or wake-up notification): what started this run."""
        # Every run starts from the message that made it (input, comment, message, retry prompt,
        # continuation, notification), and a resumed run keeps its input.
        return self.input

    @property
    def files(self) -> list[FileHandle]:
        from ..models import File

        return [
            FileHandle(f.id, f.name, f.mime_type, f.size, f.storage_name)
            for f in File.objects.filter(conversation_id=self.conversation.id).order_by(
                "created_at", "id"
            )
        ]

    @property
    def metadata(self) -> dict:
        """The task's metadata with `comments`: every comment, oldest first."""
        if self.task is None:
            return {"comments": []}
        from ..models import Comment

        comments = [
            {"id": c.id, "role": c.role, "content": c.content, "metadata": c.metadata}
            for c in Comment.objects.filter(task_id=self.task.id).order_by("created_at", "id")
        ]
        return {**(self.task.metadata or {}), "comments": comments}

    # delegation and budgets ------------------------------------------------------------------
    @property
    def depth(self) -> int:
        """The run's delegation depth: 1 unless its conversation belongs to a delegate task."""
        if self._depth is None:
            from .delegation import depth_of

            self._depth = depth_of(self.conversation.id)
        return self._depth

    @property
    def callers(self) -> list:
        """The CallerLinks above this run, nearest first (empty unless it is a delegate's)."""
        if self._callers is None:
            from .delegation import detached_callers

            self._callers = detached_callers(self)
        return self._callers

    @property
    def window(self) -> "Window":
        """The run's own budget window (it continues the totals of a paused run it resumes)."""
        if self._window is None:
            self._window = Window.for_run(self.run, self.agent)
        return self._window

    @property
    def budget(self) -> "Budget":
        return Budget(self.window, [link.window for link in self.callers])

    def stop_now(self) -> bool:
        """Whether this run, or a caller it executes inline for, was told to stop now."""
        if self.stop.now:
            return True
        if any(link.flag is not None and link.flag.now for link in self.callers):
            self._stop_for_caller()
            return True
        return False

    def _stop_for_caller(self) -> None:
        # A caller's immediate stop reaches its inline children through the lifecycle, so the
        # child's task records that it was stopped while its run was executing.
        if self._stopped_for_caller or self.task is None:
            return
        self._stopped_for_caller = True
        from .. import lifecycle
        from ..exceptions import TaskError

        try:
            lifecycle.stop(self.task.id)
        except TaskError:
            pass

    # checkpoints and requests ---------------------------------------------------------------
    def check_cancelled(self) -> None:
        """Raise RunStopped on an immediate stop, BudgetExceeded when the wall time is gone."""
        if self.stop_now():
            raise RunStopped()
        message = self.budget.wall_reached()
        if message:
            raise BudgetExceeded(message)

    def progress(self, state) -> None:
        """Record a progress state (DESCRIBE_STATE renders it for tools, API and admin)."""
        from .. import lifecycle

        lifecycle.record_progress(self.run.id, state)

    def request_approval(
        self, tool: str, args: dict | None = None, prompt: str | None = None
    ) -> Decision:
        """Ask a person to approve a tool call; the run pauses until they answer.

        Handlers are re-entered: on the resumed run the same call returns the recorded Decision.
        """
        from ..types import ActionRequest

        action = self._recorded()
        if action is not None:
            resolution = action.resolution or {}
            return Decision(
                action.status == "approved", action.status, resolution.get("comment", "")
            )
        if prompt is None:
            import json

            prompt = f"Allow {tool} with arguments {json.dumps(args or {}, ensure_ascii=False, sort_keys=True)}?"
        request = ActionRequest(
            kind="approval",
            tool_name=tool,
            tool_call_id=self._call_id(),
            args=args or {},
            prompt=prompt,
            **self._deadline(),
        )
        self._pause(request)

    def ask(self, questions) -> Answers:
        """Ask a person one or more questions; the run pauses until they answer (re-entered)."""
        from ..types import ActionRequest

        action = self._recorded()
        if action is not None:
            answers = Answers((action.resolution or {}).get("answers") or {})
            answers.expired = action.status == "expired"
            return answers
        normalized = normalize_questions(questions)
        request = ActionRequest(
            kind="question",
            tool_name="ask_user",
            tool_call_id=self._call_id(),
            questions=normalized,
            prompt=normalized[0]["question"] if normalized else "",
            **self._deadline(),
        )
        self._pause(request)

    def _call_id(self) -> str:
        return f"call_{self.run.id[4:]}_{self._asks}"

    def _recorded(self):
        from ..models import PendingAction

        self._asks += 1
        return (
            PendingAction.objects.filter(run_id=self.run.id, tool_call_id=self._call_id())
            .exclude(status="pending")
            .first()
        )

    def _deadline(self) -> dict:
        from datetime import timedelta

        from django.utils import timezone

        from ..conf import _positive_number, app_settings

        default = app_settings.DEFAULT_HITL
        hitl = {**default, **(self.agent.hitl or {})}
        # Every action lapses (REST's expiresAt is always present).
        minutes = _positive_number(hitl.get("timeout_minutes"), default["timeout_minutes"])
        deadline = timezone.now() + timedelta(minutes=minutes)
        return {"deadline": deadline, "on_timeout": hitl.get("on_timeout") or "deny"}

    def read_stop_request(self) -> str:
        """Read the run's stop request from the database now (a turn boundary needs it exact)."""
        from ..models import Run

        current = Run.objects.filter(pk=self.run.id).values_list("stop_request", flat=True).first()
        self.stop.set("now" if current is None else current)
        return self.stop.value

    def _pause(self, request) -> None:
        if self.read_stop_request() == "after_turn":
            raise GracefulStop()
        self.check_cancelled()
        raise PauseRun([request])


def normalize_questions(questions) -> list[dict]:
    """Give questions ids (q1, q2, …) and the defaults of the Question shape."""
    if isinstance(questions, (str, dict)):
        questions = [questions]
    out = []
    for index, q in enumerate(questions, start=1):
        q = {"question": q} if isinstance(q, str) else dict(q)
        q.setdefault("id", f"q{index}")
        options = [
            {"label": o, "value": o}
            if isinstance(o, str)
            else {**o, "value": o.get("value", o["label"])}
            for o in q.get("options") or []
        ]
        if options:
            q["options"] = options
        else:
            q.pop("options", None)
        q.setdefault("multiSelect", False)
        q.setdefault("required", True)
        q.setdefault("allowFreeText", not options)
        out.append(q)
    return out


# --- budgets (docs/delegation.md#budgets) ------------------------------------------------------

BUDGET_PATTERN = re.compile(r"^The max_(turns|tokens|tool_calls|wall_seconds) budget \(")


class BudgetExceeded(Exception):
    """A budget cut the run short; the message is the run's error (`... budget (...) was reached`)."""


def budget_message(limit: str, value, caller: str | None = None) -> str:
    """The sentence (docs/delegation.md#budget-messages) for a limit of this window (caller None) or of a calling agent's."""
    head = f"The {limit} budget ({format(value, 'g')})"
    return (
        f'{head} of the calling agent "{caller}" was reached' if caller else f"{head} was reached"
    )


class Window:
    """One budget window: what a run and, live, the inline children below it spent.

    The window of a run that resumes after a pause is the same run row, so it continues the
    totals recorded at the pause. Counters are guarded by a lock: parallel children add to
    their callers' windows from their own threads.
    """

    def __init__(
        self,
        *,
        run_id: str,
        agent_id: str,
        limits: dict,
        turns: int = 0,
        tool_calls: int = 0,
        prompt_tokens: int = 0,
        completion_tokens: int = 0,
        total_tokens: int = 0,
        seconds: float = 0.0,
    ):
        self.run_id = run_id
        self.agent_id = agent_id
        self.limits = limits
        self.turns = turns
        self.tool_calls = tool_calls
        self.prompt_tokens = prompt_tokens
        self.completion_tokens = completion_tokens
        self.total_tokens = total_tokens
        self.seconds = seconds
        self._started = time.monotonic()
        self._lock = threading.Lock()
        # Spend added live by the runs below, by the child run directly below this window, so
        # that absorbing that run later adds only what was not already counted.
        self._live: dict[str, list[int]] = {}

    @classmethod
    def for_run(cls, run, agent) -> "Window":
        from ..conf import app_settings

        return cls(
            run_id=run.id,
            agent_id=agent.id,
            limits={**app_settings.DEFAULT_BUDGET, **(agent.budget or {})},
            turns=run.turns,
            tool_calls=run.tool_calls,
            prompt_tokens=run.prompt_tokens,
            completion_tokens=run.completion_tokens,
            total_tokens=run.total_tokens,
            seconds=run.exec_seconds,
        )

    def wall(self) -> float:
        return self.seconds + (time.monotonic() - self._started)

    def usage(self) -> dict:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.total_tokens,
        }

    def add(self, *, turns=0, prompt=0, completion=0, total=0, tool_calls=0, via=None) -> None:
        """Count spend; `via` names the child run below when it comes from an inline child."""
        with self._lock:
            self.turns += turns
            self._add(prompt, completion, total, tool_calls)
            if via is not None:
                live = self._live.setdefault(via, [0, 0, 0, 0])
                for i, value in enumerate((prompt, completion, total, tool_calls)):
                    live[i] += value

    def absorb(self, run_id: str, prompt: int, completion: int, total: int, tool_calls: int):
        """Add a child run's not yet counted spend, less what its inline execution added live."""
        with self._lock:
            live = self._live.pop(run_id, [0, 0, 0, 0])
            spent = (prompt, completion, total, tool_calls)
            delta = [max(value - seen, 0) for value, seen in zip(spent, live, strict=True)]
            self._add(*delta)

    def _add(self, prompt, completion, total, tool_calls) -> None:
        self.prompt_tokens += prompt
        self.completion_tokens += completion
        self.total_tokens += total
        self.tool_calls += tool_calls

    def reached(self, *, turns: bool, calls: int | None = None, spent: bool = False) -> str:
        """Name the first limit this window has reached ('' when none).

        `calls` is the number of tool calls about to run (checkpoint B); `spent` asks whether
        anything at all is left for a subtask (tool calls at or above the limit).
        """
        limits = self.limits
        if turns and limits.get("max_turns") is not None and self.turns >= limits["max_turns"]:
            return "max_turns"
        if limits.get("max_tokens") is not None and self.total_tokens >= limits["max_tokens"]:
            return "max_tokens"
        max_calls = limits.get("max_tool_calls")
        if max_calls is not None:
            if calls is not None and self.tool_calls + calls > max_calls:
                return "max_tool_calls"
            if spent and self.tool_calls >= max_calls:
                return "max_tool_calls"
        wall = limits.get("max_wall_seconds")
        if wall is not None and self.wall() >= wall:
            return "max_wall_seconds"
        return ""

    def wall_left(self) -> float | None:
        wall = self.limits.get("max_wall_seconds")
        return None if wall is None else wall - self.wall()


class Budget:
    """A run's own window and its callers' windows above it (nearest first)."""

    def __init__(self, own: Window, callers: list[Window] = ()):
        self.own = own
        self.callers = list(callers)

    def spend(self, *, turns=0, prompt=0, completion=0, total=0, tool_calls=0) -> None:
        """Count spend in the own window and, at once, in every caller window above it."""
        self.own.add(
            turns=turns, prompt=prompt, completion=completion, total=total, tool_calls=tool_calls
        )
        below = self.own
        for window in self.callers:
            window.add(
                prompt=prompt,
                completion=completion,
                total=total,
                tool_calls=tool_calls,
                via=below.run_id,
            )
            below = window

    def _first(self, **check) -> str:
        limit = self.own.reached(turns=check.pop("turns"), **check)
        if limit:
            return budget_message(limit, self.own.limits[limit])
        for window in self.callers:  # turns are never shared
            limit = window.reached(turns=False, **check)
            if limit:
                return budget_message(limit, window.limits[limit], window.agent_id)
        return ""

    def before_call(self) -> str:
        """Checkpoint A: the message of the first budget that forbids another model call."""
        return self._first(turns=True)

    def before_tools(self, calls: int) -> str:
        """Checkpoint B: the message of the first budget that forbids running `calls` tools."""
        return self._first(turns=True, calls=calls)

    def exhausted(self) -> str:
        """Whether a subtask may still start: no tokens, tool calls or wall time left."""
        return self._first(turns=False, spent=True)

    def wall_reached(self) -> str:
        for window, caller in [(self.own, None)] + [(w, w.agent_id) for w in self.callers]:
            left = window.wall_left()
            if left is not None and left <= 0:
                return budget_message("max_wall_seconds", window.limits["max_wall_seconds"], caller)
        return ""

    def wall_deadline(self) -> tuple[float | None, str]:
        """The seconds left before the nearest wall budget runs out, and its message."""
        best, message = None, ""
        for window, caller in [(self.own, None)] + [(w, w.agent_id) for w in self.callers]:
            left = window.wall_left()
            if left is not None and (best is None or left < best):
                best = left
                message = budget_message(
                    "max_wall_seconds", window.limits["max_wall_seconds"], caller
                )
        return best, message


@dataclass
class CallerLink:
    """A caller above an inline child: its budget window and its stop flag (None when paused)."""

    window: Window
    flag: StopFlag | None = None


class ToolContext:
    """What a tool function `fn(ctx, args)` sees of the run that calls it."""

    def __init__(self, run_ctx: RunContext, tool_call_id: str):
        self._run = run_ctx
        self.tool_call_id = tool_call_id

    @property
    def run_id(self) -> str:
        return self._run.run_id

    @property
    def conversation_id(self) -> str:
        return self._run.conversation_id

    @property
    def task_id(self) -> str | None:
        return self._run.task_id

    @property
    def agent_id(self) -> str:
        return self._run.agent_id

    @property
    def user(self):
        return self._run.user

    def check_cancelled(self) -> None:
        """Raise the runtime's stop exception on an immediate stop or when wall time is gone."""
        self._run.check_cancelled()

    def progress(self, state) -> None:
        """Record a progress state for the run."""
        self._run.progress(state)
