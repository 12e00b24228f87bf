"""Value types shared by the store, the lifecycle, the worker and the model tools."""

import enum
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeAlias

if TYPE_CHECKING:
    from django.contrib.auth.base_user import AbstractBaseUser  # noqa: F401 (used in an alias)

    from .models import Conversation, Run, Task  # noqa: F401 (Conversation is used in an alias)

# A conversation, or its id.
ConversationRef: TypeAlias = "Conversation | str"
# A task's owner: a user, or None for the anonymous principal.
Owner: TypeAlias = "AbstractBaseUser | None"


@dataclass(frozen=True)
class TaskInfo:
    """The Python view of a task: the stored status; the model tools translate it."""

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
    priority: int = 0


@dataclass(frozen=True)
class ActionRequest:
    """An approval or a question a pausing run asks."""

    kind: str  # "approval" or "question"
    tool_name: str
    tool_call_id: str
    args: dict[str, Any] | None = None
    questions: list[Any] | None = None
    prompt: str = ""
    deadline: Any = None  # datetime; the runtimes always set one (DEFAULT_HITL)
    on_timeout: str = "deny"


@dataclass(frozen=True)
class RunOutcome:
    """How a run ended, as its runtime reports it to `lifecycle.on_run_finished`."""

    run_id: str | None
    status: str  # completed, failed, cancelled, input_required or parked
    text: str = ""
    error: str = ""
    graceful_stop: bool = False
    actions: tuple[ActionRequest, ...] = ()
    clarification: str | None = None
    task_result: dict[str, Any] | None = None
    usage: dict[str, Any] | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    # False when the runtime already appended its reply to the log (the chat loop does).
    append_message: bool = True
    retryable: bool = False  # a failure that may pass: the agent's retry policy may try again
    parked_until: datetime | None = None  # parked: queued again to start no earlier than this
    limited_since: datetime | None = None  # parked: it has waited for its limit since then


def usage_counts(usage: dict[str, Any] | None) -> tuple[int, int, int] | None:
    """Read (prompt, completion, total) tokens from a runtime's usage, in either spelling.

    A callable's Reply speaks the API's words (inputTokens, …); the chat runtime, the model
    server's (prompt_tokens, …).
    """
    if not usage:
        return None
    prompt = int(usage.get("inputTokens", usage.get("prompt_tokens", 0)) or 0)
    completion = int(usage.get("outputTokens", usage.get("completion_tokens", 0)) or 0)
    total = usage.get("totalTokens", usage.get("total_tokens"))
    return prompt, completion, int(total) if total is not None else prompt + completion


def usage_shape(usage: dict[str, Any] | None) -> dict[str, int] | None:
    """Return a runtime's usage in the API's words, as a result records it (None: unknown)."""
    counts = usage_counts(usage)
    if counts is None:
        return None
    return dict(zip(("inputTokens", "outputTokens", "totalTokens"), counts, strict=True))


@dataclass(frozen=True)
class Ending:
    """How a finalize settles a task: its terminal status and what it records."""

    status: str  # completed, failed or cancelled
    summary: str = ""  # kept when empty
    result: str = ""  # kept when empty
    error: str = ""  # a failure's error (the result when empty)
    state: Any = None  # None keeps the task's state
    task_result: dict[str, Any] | None = None  # the TaskResult to write, if any
    reason: str = ""  # why it stopped (task.status events carry it)


@dataclass(frozen=True)
class Ended:
    """What `store.end` did: whether it recorded the run's ending, and the task if it settled."""

    recorded: bool
    task: "Task | None"  # the task as written; None when the finalize lost


@dataclass(frozen=True)
class Claimed:
    """What `store.claim_many` did: the runs it claimed, and how many it passed over because
    another transaction held them (worth another try soon)."""

    runs: "list[Run]"
    passed: int = 0
    next_at: datetime | None = None  # when the next delayed start is due, if one is queued


LABEL_LENGTH = 60


def default_label(input: str) -> str:
    """Return the label of a task created without one: the first 60 characters of its input."""
    return input[:LABEL_LENGTH]


@dataclass
class NewTask:
    """A task to create, with its conversation and first run (`store.create_task`)."""

    agent: str
    input: str
    owner: Any = None  # a user, or None for the anonymous principal
    label: str = ""
    kind: str = ""
    state: Any = None
    inherit: dict[str, Any] = field(default_factory=dict)  # the agent's definition, as it was
    callback_url: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)
    files: list[Any] = field(default_factory=list)  # file refs carried by the first message
    parent_conversation_id: str | None = None  # a spawned task's parent (hidden conversation)
    parent_run_id: str | None = None
    depth: int = 1
    tool_call_id: str = ""
    delegation_key: str = ""
    task_id: str | None = None  # None: a fresh id
    run_id: str | None = None  # None: a fresh id
    not_before: datetime | None = None  # a delayed start: the first run is not claimed before
    priority: int = 0  # higher first, within each owner's share of the claims
    schedule_id: str | None = None  # the schedule whose tick creates it


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
