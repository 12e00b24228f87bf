"""Errors of the task lifecycle: each refusal carries its code and its data, as DRF's do.

A refusal's `str()` is what Python is told, in the stored statuses (`running`,
`waiting_for_input`, …). Every other surface words it from its `code`, `status_code` and data
(ids, limits, statuses) in one place of its own: REST, A2A, MCP and the admin through
`toolkit.errors.refusal` (the envelope of docs/rest.md#errors), the model tools through
`runtime.task_tools.model_text` (the model-facing words `working`, `input_required`). `.info` is
the task as it was when refused (the tools show it).
"""

from datetime import datetime
from typing import Any

from .text import go_quote, iso


class TaskError(Exception):
    """Base class of every lifecycle error."""

    default_message = "tasks: error"
    status_code = 409
    code = "task_error"

    def __init__(self, message: str | None = None, *, info: Any = None) -> None:
        super().__init__(message or self.default_message)
        self.info = info


# --- not found -------------------------------------------------------------------------------


class TaskNotFound(TaskError, LookupError):
    default_message = "tasks: not found"
    status_code = 404
    code = "NOT_FOUND"

    def __init__(self, task_id: str = "", *, info: Any = None) -> None:
        super().__init__(info=info)
        self.task_id = task_id


class RunNotFound(TaskError, LookupError):
    default_message = "tasks: run not found"
    status_code = 404
    code = "NOT_FOUND"

    def __init__(self, run_id: str = "", *, info: Any = None) -> None:
        super().__init__(info=info)
        self.run_id = run_id


class ConversationNotFound(TaskError, LookupError):
    default_message = "tasks: conversation not found"
    status_code = 404
    code = "NOT_FOUND"

    def __init__(self, conversation_id: str = "", *, info: Any = None) -> None:
        super().__init__(info=info)
        self.conversation_id = conversation_id


class ScheduleNotFound(TaskError, LookupError):
    default_message = "tasks: schedule not found"
    status_code = 404
    code = "NOT_FOUND"

    def __init__(self, schedule_id: str = "", *, info: Any = None) -> None:
        super().__init__(info=info)
        self.schedule_id = schedule_id


class InvalidField(TaskError, ValueError):
    """An argument that cannot be used; `field` names it as the API does."""

    default_message = "tasks: invalid argument"
    status_code = 400
    code = "VALIDATION_ERROR"

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


class InvalidSchedule(InvalidField):
    """A schedule's clock or target that cannot be used; `field` is the one at fault."""

    default_message = "tasks: invalid schedule"


class ActionNotFound(TaskError, LookupError):
    default_message = "tasks: action not found"
    status_code = 404
    code = "NOT_FOUND"

    def __init__(self, action_id: str = "", *, info: Any = None) -> None:
        super().__init__(info=info)
        self.action_id = action_id


# --- limits ----------------------------------------------------------------------------------


class DepthLimit(TaskError):
    def __init__(self, limit: int, *, info: Any = None) -> None:
        super().__init__(f"tasks: cannot spawn from a task at depth {limit}", info=info)
        self.limit = limit


class TaskLimit(TaskError):
    """A conversation already has MAX_CONCURRENT_PER_PARENT live tasks it spawned."""

    code = "task_limit"

    def __init__(self, limit: int, *, info: Any = None) -> None:
        super().__init__(
            f"tasks: this conversation already has {limit} tasks running; wait for one to finish",
            info=info,
        )
        self.limit = limit


class ActiveTaskLimit(TaskError):
    """The user already has MAX_ACTIVE_TASKS_PER_USER active tasks."""

    code = "task_limit"

    def __init__(self, limit: int, *, info: Any = None) -> None:
        super().__init__(
            f"tasks: you already have {limit} active tasks; wait for one to finish", info=info
        )
        self.limit = limit


# --- refusals of a task in the wrong state ---------------------------------------------------


class NotRetryable(TaskError):
    """Only a failed task that is not a delegate can be retried."""

    code = "task_not_retryable"

    def __init__(
        self, status: str, *, task_id: str = "", delegate: bool = False, info: Any = None
    ) -> None:
        super().__init__(self.text(status), info=info)
        self.status, self.task_id, self.delegate = status, task_id, delegate

    def text(self, status: str) -> str:
        """Return this refusal's text with `status` in the words of its reader."""
        return f"tasks: cannot retry a task that is {status}; only a failed task can be retried"


class RetryLimit(TaskError):
    code = "retry_limit"

    def __init__(self, limit: int, *, task_id: str = "", attempt: int = 0, info: Any = None):
        super().__init__(
            f"tasks: this task has already used its {limit} attempts; start a new task instead",
            info=info,
        )
        self.limit, self.task_id, self.attempt = limit, task_id, attempt


class RetryConflict(TaskError):
    default_message = "tasks: another writer claimed this task first; try again"
    code = "retry_conflict"


class AlreadyFinal(TaskError):
    """A stop reached a task that had already ended (REST: task_finished)."""

    code = "task_finished"

    def __init__(self, status: str, *, task_id: str = "", info: Any = None) -> None:
        super().__init__(self.text(status), info=info)
        self.status, self.task_id = status, task_id

    def text(self, status: str) -> str:
        """Return this refusal's text with `status` in the words of its reader."""
        return f"tasks: task already {status}"


class TaskBusy(TaskError):
    """A comment reached a task that is pending or running, or a delegate (its caller drives it)."""

    code = "task_busy"

    def __init__(
        self, status: str, *, task_id: str = "", delegate: bool = False, info: Any = None
    ) -> None:
        self.status, self.task_id, self.delegate = status, task_id, delegate
        super().__init__(self.text(status), info=info)

    def text(self, status: str) -> str:
        """Return this refusal's text with `status` in the words of its reader."""
        if self.delegate:
            return "tasks: a delegate task is driven by its caller"
        return f"tasks: task is {status}"


class ActionPending(TaskError):
    """A comment reached a task waiting on an approval or a question."""

    code = "action_pending"

    def __init__(self, action_ids: Any = (), *, task_id: str = "", info: Any = None) -> None:
        super().__init__("tasks: task is waiting on an approval or a question", info=info)
        self.action_ids, self.task_id = list(action_ids), task_id


class ConversationBusy(TaskError):
    """A message reached a conversation with an action pending or a run in progress."""

    code = "conversation_busy"

    def __init__(self, conversation_id: str, *, run_id: str = "", action_ids: Any = ()) -> None:
        super().__init__(f"tasks: conversation {conversation_id} is busy")
        self.conversation_id = conversation_id
        self.run_id = run_id
        self.action_ids = list(action_ids)


class RunNotWaiting(TaskError):
    """A cancel of a waiting run reached one that has started (or ended)."""

    code = "run_started"

    def __init__(self, run_id: str) -> None:
        super().__init__(f"tasks: run {run_id} is not waiting its turn")
        self.run_id = run_id


class ActionResolved(TaskError):
    """An answer reached an action that is settled, stale (its run moved on) or expired."""

    code = "action_resolved"

    def __init__(self, action_id: str, status: str, *, reason: str) -> None:
        super().__init__(f"tasks: action {action_id} cannot be answered: {reason}")
        self.action_id, self.status, self.reason = action_id, status, reason

    @classmethod
    def settled(cls, action_id: str, status: str) -> "ActionResolved":
        return cls(action_id, status, reason=f"is already {status}")

    @classmethod
    def stale(cls, action_id: str, status: str) -> "ActionResolved":
        return cls(action_id, status, reason="belongs to a run that is no longer current")

    @classmethod
    def expired(cls, action_id: str, status: str, deadline: datetime) -> "ActionResolved":
        return cls(action_id, status, reason=f"expired at {iso(deadline)}")


# --- faults ----------------------------------------------------------------------------------


class LaunchFailed(TaskError):
    status_code = 500
    code = "INTERNAL_ERROR"

    @classmethod
    def spawn(cls, cause: object, *, info: Any = None) -> "LaunchFailed":
        return cls(f"tasks: starting task run: {cause}", info=info)

    @classmethod
    def retry(cls, cause: object, *, info: Any = None) -> "LaunchFailed":
        return cls(f"tasks: restarting task run: {cause}", info=info)


class SpawnError(TaskError):
    @classmethod
    def no_parent(cls) -> "SpawnError":
        return cls("tasks: Spawn requires a parent session")

    @classmethod
    def looking_up(cls, conversation_id: str, cause: object) -> "SpawnError":
        return cls(f"tasks: looking up session {go_quote(conversation_id)}: {cause}")

    @classmethod
    def resolving_agent(cls, agent: str, cause: object) -> "SpawnError":
        return cls(f"tasks: resolving agent {go_quote(agent)}: {cause}")

    @classmethod
    def creating_task(cls, cause: object) -> "SpawnError":
        return cls(f"tasks: creating task: {cause}")


class StoreError(TaskError):
    status_code = 500
    code = "INTERNAL_ERROR"

    @classmethod
    def failing_orphans(cls, cause: object) -> "StoreError":
        return cls(f"tasks: failing orphaned tasks: {cause}")

    @classmethod
    def listing_live(cls, cause: object) -> "StoreError":
        return cls(f"tasks: listing live tasks: {cause}")


class TransitionError(RuntimeError):
    """A status change the transition table does not allow: a bug, never a lost race."""
