"""What a run's agent code is written against: RunContext, Reply and the run's stop exceptions."""

import json
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import NoReturn

from django.db import connection
from django.utils import timezone

from .. import lifecycle, store
from ..conf import _positive_number, app_settings
from ..exceptions import TaskError
from ..models import Comment, Event, File, PendingAction, Run
from ..states import STOPPED_AS, TaskKind
from ..store.files import storage
from ..types import ActionRequest
from .budget import Budget, BudgetExceeded, Window
from .chain import depth_of, detached_callers


@dataclass
class Reply:
    """What a callable handler returns."""

    content: str = ""
    usage: dict | None = None
    metadata: dict = field(default_factory=dict)
    files: list = field(default_factory=list)


class RunStopped(Exception):
    """Raised at a checkpoint when the run was told to stop now (or its wall budget is gone)."""

    def __init__(self, reason: str = "stopped"):
        super().__init__(reason)
        self.reason = reason


class GracefulStop(Exception):
    """Raised where a run asked to stop after its turn would otherwise pause for a person."""


class RetryableError(Exception):
    """Raised by a callable agent for a failure that may pass: the task is tried again as its
    agent's retry policy allows (docs/delegation.md#retry-policy), else it fails with the text."""


class PauseRun(Exception):
    """Raised by ctx.ask / ctx.request_approval the first time: the run pauses for a person."""

    def __init__(self, actions, text: str = ""):
        super().__init__("the run pauses for input")
        self.actions = tuple(actions)
        self.text = text


class StopFlag:
    """The run's stop request as its heartbeat last read it: '', 'after_turn', or one that stops
    it now: 'now', 'interrupt' or 'rollback' (states.STOPPED_AS)."""

    def __init__(self):
        self._value = ""
        self.timed_out = ""  # the error, once the run's deadline has passed
        self._lock = threading.Lock()
        self.changed = threading.Event()
        self._waiters: set[threading.Event] = set()

    @property
    def value(self) -> str:
        return self._value

    def set(self, value: str) -> None:
        with self._lock:
            if not value or value == self._value or self.now:
                return
            self._value = value
            self.changed.set()
            waiters = list(self._waiters)
        for event in waiters:
            event.set()

    def wake(self, event: threading.Event, *, on: bool = True) -> None:
        """Set `event` whenever this flag changes (until called again with `on=False`)."""
        with self._lock:
            if on:
                self._waiters.add(event)
            else:
                self._waiters.discard(event)

    @property
    def now(self) -> bool:
        return self._value in STOPPED_AS

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
        with storage().open(self.storage_name, "rb") as fh:
            return fh.read()


class RunContext:
    """What a runtime (and a callable handler) sees of the run it executes.

    Built by the run driver from rows read after the claim. `check_cancelled()`, `progress()`,
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
        execute_inline=None,
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
        # The driver's `execute_inline(run_id, depth=, callers=)`: how the `task` tool executes a
        # child's run in this thread. Handed down, since the driver imports the runtimes.
        self.execute_inline = execute_inline
        self._window: Window | None = None
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
        """Return the conversation's messages so far: user, assistant and notification, oldest
        first."""
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
        """Return the newest user message (or wake-up notification): what started this run."""
        # Every run starts from the message that made it (input, comment, message, retry prompt,
        # continuation, notification), and a resumed run keeps its input.
        return self.input

    def steered(self) -> list[str]:
        """Take in the messages steered to this run since the last call: their texts, oldest
        first. An agent registered `steerable=True` calls it between steps (each is then in the
        transcript as a user message, origin `steer`: docs/lifecycle.md#busy-conversations)."""
        return [event.data.get("content", "") for event in store.take_steers(self.run.id)]

    @property
    def files(self) -> list[FileHandle]:
        return [
            FileHandle(f.id, f.name, f.mime_type, f.size, f.storage_name)
            for f in File.objects.filter(conversation_id=self.conversation.id).order_by(
                "created_at", "id"
            )
        ]

    @property
    def metadata(self) -> dict:
        """Return the task's metadata with `comments`: every comment, oldest first. A run
        without a task gets the metadata of the message that started it."""
        if self.task is None:
            started = (
                Event.objects.filter(
                    conversation_id=self.conversation.id, run_id=self.run.id, type="message.user"
                )
                .order_by("seq")
                .values_list("data", flat=True)
                .first()
            )
            return {**((started or {}).get("metadata") or {}), "comments": []}
        comments = [
            {"id": c.id, "role": c.role, "content": c.content, "metadata": c.metadata}
            for c in Comment.objects.filter(task_id=self.task.id).order_by("created_at", "id")
        ]
        return {**(self.task.metadata or {}), "comments": comments}

    def may_park(self) -> bool:
        """Say whether this run may give back its slot to wait (a task's own run: a delegate's
        caller waits on it inline, and a conversation's turn is answered while the person waits)."""
        return self.task is not None and self.task.kind != TaskKind.DELEGATE

    # delegation and budgets ------------------------------------------------------------------
    @property
    def depth(self) -> int:
        """Return the run's delegation depth: 1 unless its conversation belongs to a delegate task."""
        if self._depth is None:
            self._depth = depth_of(self.conversation.id)
        return self._depth

    @property
    def callers(self) -> list:
        """Return the CallerLinks above this run, nearest first (empty unless it is a delegate's)."""
        if self._callers is None:
            self._callers = detached_callers(self)
        return self._callers

    @property
    def window(self) -> Window:
        """Return the run's own budget window (it continues the totals of a paused run it resumes)."""
        if self._window is None:
            self._window = Window.for_run(self.run, self.agent)
        return self._window

    @property
    def budget(self) -> Budget:
        return Budget(self.window, [link.window for link in self.callers])

    def stop_flags(self) -> list[StopFlag]:
        """Return this run's stop flag and those of the callers it executes inline for."""
        return [self.stop, *(link.flag for link in self.callers if link.flag is not None)]

    def wait(self, seconds: float, ready=None, woken: threading.Event | None = None) -> bool:
        """Wait up to `seconds` until `ready()`, holding no database connection; whether it is.

        Whatever makes `ready()` true sets `woken`; so does a change of a stop flag. Raises
        RunStopped at once when this run (or a caller it executes for) is told to stop now.
        """
        release_connection()
        woken = woken or threading.Event()
        flags = self.stop_flags()
        deadline = time.monotonic() + seconds
        for flag in flags:
            flag.wake(woken)
        try:
            while True:
                if ready is not None and ready():
                    return True
                if self.stop_now():
                    raise RunStopped()
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                woken.wait(left)
                woken.clear()
        finally:
            for flag in flags:
                flag.wake(woken, on=False)

    def stop_now(self) -> bool:
        """Say whether this run, or a caller it executes inline for, was told to stop now."""
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
        try:
            lifecycle.stop(self.task.id)
        except TaskError:
            pass

    # checkpoints and requests ---------------------------------------------------------------
    def check_cancelled(self) -> None:
        """Raise RunStopped on an immediate stop, BudgetExceeded when the wall time is gone.

        A checkpoint is where a handler waits or works: it holds no database connection here.
        """
        release_connection()
        if self.stop_now():
            raise RunStopped()
        message = self.budget.wall_reached()
        if message:
            raise BudgetExceeded(message)

    def progress(self, state) -> None:
        """Record a progress state (DESCRIBE_STATE renders it for tools, API and admin)."""
        lifecycle.record_progress(self.run.id, state)
        release_connection()

    def request_approval(
        self, tool: str, args: dict | None = None, prompt: str | None = None
    ) -> Decision:
        """Ask a person to approve a tool call; the run pauses until they answer.

        Handlers are re-entered: on the resumed run the same call returns the recorded Decision.
        """
        action = self._recorded()
        if action is not None:
            resolution = action.resolution or {}
            return Decision(
                action.status == "approved", action.status, resolution.get("comment", "")
            )
        if prompt is None:
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
        self._asks += 1
        return (
            PendingAction.objects.filter(run_id=self.run.id, tool_call_id=self._call_id())
            .exclude(status="pending")
            .first()
        )

    def _deadline(self) -> dict:
        default = app_settings.DEFAULT_HITL
        hitl = {**default, **(self.agent.hitl or {})}
        # Every action lapses (REST's expiresAt is always present).
        minutes = _positive_number(hitl.get("timeout_minutes"), default["timeout_minutes"])
        deadline = timezone.now() + timedelta(minutes=minutes)
        return {"deadline": deadline, "on_timeout": hitl.get("on_timeout") or "deny"}

    def read_stop_request(self) -> str:
        """Read the run's stop request from the database now (a turn boundary needs it exact)."""
        current = Run.objects.filter(pk=self.run.id).values_list("stop_request", flat=True).first()
        self.stop.set("now" if current is None else current)
        return self.stop.value

    def _pause(self, request) -> NoReturn:
        if self.read_stop_request() == "after_turn":
            raise GracefulStop()
        self.check_cancelled()
        raise PauseRun([request])


def release_connection() -> None:
    """Give this thread's database connection back while it waits (to the pool, when pooled).

    A run holds a connection only while it talks to the database: the many runs a worker
    process holds share a bounded number of them (docs/architecture.md#in-flight-runs).
    """
    if not connection.in_atomic_block:
        connection.close()


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
