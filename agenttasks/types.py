"""Value types shared by the store, the lifecycle, the worker and the model tools."""

import enum
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class TaskInfo:
    """The model-facing view of a task (status is the model-facing name)."""

    task_id: str
    run_id: str
    label: str
    kind: str
    agent: str
    status: str
    attempt: int
    summary: str
    result: str
    state: Any
    progress: str


@dataclass(frozen=True)
class TaskMeta:
    """What `meta_for` answers about a task's own conversation."""

    task_id: str
    label: str
    parent_conversation_id: str | None
    depth: int


@dataclass(frozen=True)
class ActionRequest:
    """An approval or a question a pausing run asks."""

    kind: str  # "approval" or "question"
    tool_name: str
    tool_call_id: str
    args: dict | None = None
    questions: list | None = None
    prompt: str = ""
    deadline: Any = None  # datetime or None (never lapses)
    on_timeout: str = "deny"


@dataclass(frozen=True)
class RunOutcome:
    """How a run ended, as its runtime reports it to `lifecycle.on_run_finished`."""

    run_id: str | None
    status: str  # completed, failed, cancelled or input_required
    text: str = ""
    error: str = ""
    graceful_stop: bool = False
    actions: tuple[ActionRequest, ...] = ()
    clarification: str | None = None
    task_result: dict | None = None
    usage: dict | None = None
    metadata: dict = field(default_factory=dict)
    # False when the runtime already appended its reply to the log (the chat loop does).
    append_message: bool = True


@dataclass(frozen=True)
class Continuation:
    """The CONTINUE hook's answer: the next run's input, the state, or an error ending."""

    input: str = ""
    state: Any = None
    error: str = ""


class StopOutcome(enum.Enum):
    UNKNOWN_RUN = "unknown_run"
    CANCELLED = "cancelled"
    ALREADY_FINISHED = "already_finished"
    AFTER_TURN = "after_turn"
    MOVED = "moved"
