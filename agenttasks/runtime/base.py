"""What agents are written against: the `tool` decorator, ToolResult and Reply."""

import threading
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

    def __init__(self, *, run, conversation, task, agent, stop: StopFlag, depth: int = 1):
        self.run = run
        self.conversation = conversation
        self.task = task
        self.agent = agent
        self.stop = stop
        self.depth = depth
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

    # checkpoints and requests ---------------------------------------------------------------
    def check_cancelled(self) -> None:
        """Raise RunStopped when an immediate stop was requested."""
        if self.stop.now:
            raise RunStopped()

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

        from ..conf import app_settings

        hitl = {**app_settings.DEFAULT_HITL, **(self.agent.hitl or {})}
        minutes = hitl.get("timeout_minutes")
        deadline = timezone.now() + timedelta(minutes=minutes) if minutes else None
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
