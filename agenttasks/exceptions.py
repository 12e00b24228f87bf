"""Errors of the task lifecycle: what each refusal says to Python, to a model, and over REST.

A refusal's `str()` speaks the stored statuses (`running`, `waiting_for_input`, …), as Python and
REST do; `model_message()` is the text the task tools hand a model verbatim, in the model-facing
words (`working`, `input_required`). Over REST it answers `status_code` with the error envelope `{"error": {"code", "message", "details"}}` built
from `code`, `api_message()` and `api_details()` (docs/rest.md#errors), as DRF's exceptions carry
`status_code` and `default_code`. `.info` is the task as it was when refused (the tools show it).
"""

from datetime import datetime
from typing import Any

from .states import model_status
from .text import go_quote, iso


class TaskError(Exception):
    """Base class of every lifecycle error."""

    default_message = "tasks: error"
    status_code = 409
    code = "task_error"

    def __init__(self, message: str | None = None, *, info: Any = None) -> None:
        super().__init__(message or self.default_message)
        self.info = info

    def model_message(self) -> str:
        """Return the text a model is handed (the task tools return it verbatim)."""
        return str(self)

    def api_message(self) -> str:
        """Return the message of the REST error envelope."""
        return str(self)

    def api_details(self) -> dict[str, Any] | None:
        """Return the details of the REST error envelope, if any."""
        return None


# --- not found -------------------------------------------------------------------------------


class TaskNotFound(TaskError, LookupError):
    default_message = "tasks: not found"
    status_code = 404
    code = "NOT_FOUND"


class RunNotFound(TaskError, LookupError):
    default_message = "tasks: run not found"
    status_code = 404
    code = "NOT_FOUND"


class ConversationNotFound(TaskError, LookupError):
    default_message = "tasks: conversation not found"
    status_code = 404
    code = "NOT_FOUND"


class ActionNotFound(TaskError, LookupError):
    default_message = "tasks: action not found"
    status_code = 404
    code = "NOT_FOUND"


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

    def api_message(self) -> str:
        return (
            f"The conversation that spawned this task already has {self.limit} tasks running; "
            "wait for one to finish"
        )

    def api_details(self) -> dict[str, Any]:
        return {"limit": self.limit}


class ActiveTaskLimit(TaskError):
    """The user already has MAX_ACTIVE_TASKS_PER_USER active tasks."""

    code = "task_limit"

    def __init__(self, limit: int, *, info: Any = None) -> None:
        super().__init__(
            f"tasks: you already have {limit} active tasks; wait for one to finish", info=info
        )
        self.limit = limit

    def api_message(self) -> str:
        return f"You already have {self.limit} active tasks; wait for one to finish"

    def api_details(self) -> dict[str, Any]:
        return {"limit": self.limit}


# --- refusals of a task in the wrong state ---------------------------------------------------


class NotRetryable(TaskError):
    """Only a failed task that is not a delegate can be retried."""

    code = "task_not_retryable"

    def __init__(
        self, status: str, *, task_id: str = "", delegate: bool = False, info: Any = None
    ) -> None:
        super().__init__(self._text(status), info=info)
        self.status, self.task_id, self.delegate = status, task_id, delegate

    @staticmethod
    def _text(status: str) -> str:
        return f"tasks: cannot retry a task that is {status}; only a failed task can be retried"

    def model_message(self) -> str:
        return self._text(model_status(self.status))

    def api_message(self) -> str:
        if self.delegate:
            return f"Task {self.task_id} is a delegate task; it is driven by its caller"
        return f"Only a failed task can be retried; task {self.task_id} is {self.status}"

    def api_details(self) -> dict[str, Any]:
        return {"status": self.status}


class RetryLimit(TaskError):
    code = "retry_limit"

    def __init__(self, limit: int, *, task_id: str = "", attempt: int = 0, info: Any = None):
        super().__init__(
            f"tasks: this task has already used its {limit} attempts; start a new task instead",
            info=info,
        )
        self.limit, self.task_id, self.attempt = limit, task_id, attempt

    def api_message(self) -> str:
        return (
            f"Task {self.task_id} has already used its {self.limit} attempts; create a new "
            "task instead"
        )

    def api_details(self) -> dict[str, Any]:
        return {"limit": self.limit, "attempt": self.attempt}


class RetryConflict(TaskError):
    default_message = "tasks: another writer claimed this task first; try again"
    code = "retry_conflict"

    def api_message(self) -> str:
        return "Another request claimed this task first; try again"


class AlreadyFinal(TaskError):
    """A stop reached a task that had already ended (REST: task_finished)."""

    code = "task_finished"

    def __init__(self, status: str, *, task_id: str = "", info: Any = None) -> None:
        super().__init__(f"tasks: task already {status}", info=info)
        self.status, self.task_id = status, task_id

    def model_message(self) -> str:
        return f"tasks: task already {model_status(self.status)}"

    def api_message(self) -> str:
        return f"Task {self.task_id} has already {self.status}"

    def api_details(self) -> dict[str, Any]:
        return {"status": self.status}


class TaskBusy(TaskError):
    """A comment reached a task that is pending or running, or a delegate (its caller drives it)."""

    code = "task_busy"

    def __init__(
        self, status: str, *, task_id: str = "", delegate: bool = False, info: Any = None
    ) -> None:
        super().__init__(self._text(status, delegate), info=info)
        self.status, self.task_id, self.delegate = status, task_id, delegate

    @staticmethod
    def _text(status: str, delegate: bool) -> str:
        if delegate:
            return "tasks: a delegate task is driven by its caller"
        return f"tasks: task is {status}"

    def model_message(self) -> str:
        return self._text(model_status(self.status), self.delegate)

    def api_message(self) -> str:
        if self.delegate:
            return f"Task {self.task_id} is a delegate task; it is driven by its caller"
        return f"Task {self.task_id} is {self.status}; wait for it to finish or cancel it"

    def api_details(self) -> dict[str, Any]:
        return {"status": self.status}


class ActionPending(TaskError):
    """A comment reached a task waiting on an approval or a question."""

    code = "action_pending"

    def __init__(self, action_ids: Any = (), *, task_id: str = "", info: Any = None) -> None:
        super().__init__("tasks: task is waiting on an approval or a question", info=info)
        self.action_ids, self.task_id = list(action_ids), task_id

    def api_message(self) -> str:
        return f"Task {self.task_id} is waiting on an approval or a question; answer it first"

    def api_details(self) -> dict[str, Any]:
        return {"actionIds": self.action_ids}


class ConversationBusy(TaskError):
    """A message reached a conversation with an action pending or a run in progress."""

    code = "conversation_busy"

    def __init__(self, conversation_id: str, *, run_id: str = "", action_ids: Any = ()) -> None:
        super().__init__(f"tasks: conversation {conversation_id} is busy")
        self.conversation_id = conversation_id
        self.run_id = run_id
        self.action_ids = list(action_ids)

    def api_message(self) -> str:
        if self.action_ids:
            return f"Conversation {self.conversation_id} is waiting on an approval or a question"
        return f"Conversation {self.conversation_id} has a run in progress"

    def api_details(self) -> dict[str, Any]:
        if self.action_ids:
            return {"actionIds": self.action_ids}
        return {"runId": self.run_id}


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

    def api_message(self) -> str:
        return f"Action {self.action_id} {self.reason}"

    def api_details(self) -> dict[str, Any]:
        return {"status": self.status}


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
