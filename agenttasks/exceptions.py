"""Errors of the task lifecycle; refusals carry `.info`, the task as it was when refused."""

from .states import model_status
from .text import go_quote


class TaskError(Exception):
    """Base class of every lifecycle error."""

    default_message = "tasks: error"

    def __init__(self, message: str | None = None, *, info=None):
        super().__init__(message or self.default_message)
        self.info = info


class TaskNotFound(TaskError, LookupError):
    default_message = "tasks: not found"


class RunNotFound(TaskError, LookupError):
    default_message = "tasks: run not found"


class ConversationNotFound(TaskError, LookupError):
    default_message = "tasks: conversation not found"


class DepthLimit(TaskError):
    def __init__(self, limit: int, *, info=None):
        super().__init__(f"tasks: cannot spawn from a task at depth {limit}", info=info)
        self.limit = limit


class TaskLimit(TaskError):
    def __init__(self, limit: int, *, info=None):
        super().__init__(
            f"tasks: this conversation already has {limit} tasks running; wait for one to finish",
            info=info,
        )
        self.limit = limit


class ActiveTaskLimit(TaskError):
    """The user already has MAX_ACTIVE_TASKS_PER_USER active tasks (REST: task_limit)."""

    def __init__(self, limit: int, *, info=None):
        super().__init__(
            f"tasks: you already have {limit} active tasks; wait for one to finish", info=info
        )
        self.limit = limit


class NotRetryable(TaskError):
    def __init__(self, status: str, *, info=None):
        super().__init__(
            f"tasks: cannot retry a task that is {status}; only a failed task can be retried",
            info=info,
        )
        self.status = status


class RetryLimit(TaskError):
    def __init__(self, limit: int, *, info=None):
        super().__init__(
            f"tasks: this task has already used its {limit} attempts; start a new task instead",
            info=info,
        )
        self.limit = limit


class RetryConflict(TaskError):
    default_message = "tasks: another writer claimed this task first; try again"


class AlreadyFinal(TaskError):
    def __init__(self, status: str, *, info=None):
        super().__init__(f"tasks: task already {status}", info=info)
        self.status = status


class LaunchFailed(TaskError):
    @classmethod
    def spawn(cls, cause, *, info=None):
        return cls(f"tasks: starting task run: {cause}", info=info)

    @classmethod
    def retry(cls, cause, *, info=None):
        return cls(f"tasks: restarting task run: {cause}", info=info)


class SpawnError(TaskError):
    @classmethod
    def no_parent(cls):
        return cls("tasks: Spawn requires a parent session")

    @classmethod
    def looking_up(cls, conversation_id: str, cause):
        return cls(f"tasks: looking up session {go_quote(conversation_id)}: {cause}")

    @classmethod
    def counting(cls, cause):
        return cls(f"tasks: counting live tasks: {cause}")

    @classmethod
    def resolving_agent(cls, agent: str, cause):
        return cls(f"tasks: resolving agent {go_quote(agent)}: {cause}")

    @classmethod
    def creating_session(cls, cause):
        return cls(f"tasks: creating task session: {cause}")

    @classmethod
    def creating_task(cls, cause):
        return cls(f"tasks: creating task: {cause}")


class TaskBusy(TaskError):
    """A comment reached a task that is pending or running (REST: task_busy)."""

    def __init__(self, status: str, message: str | None = None, *, info=None):
        # Messages use the model-facing name of a status (working, …).
        super().__init__(message or f"tasks: task is {model_status(status)}", info=info)
        self.status = status


class ActionPending(TaskError):
    """A comment reached a task waiting on an approval or a question (REST: action_pending)."""

    def __init__(self, action_ids=(), *, info=None):
        super().__init__("tasks: task is waiting on an approval or a question", info=info)
        self.action_ids = list(action_ids)


class ConversationBusy(TaskError):
    """A message reached a conversation with an action pending or a run in progress."""

    def __init__(self, conversation_id: str, *, run_id: str = "", action_ids=()):
        super().__init__(f"tasks: conversation {conversation_id} is busy")
        self.run_id = run_id
        self.action_ids = list(action_ids)


class TransitionError(RuntimeError):
    """A status change the transition table does not allow: a bug, never a lost race."""


class StoreError(TaskError):
    @classmethod
    def failing_orphans(cls, cause):
        return cls(f"tasks: failing orphaned tasks: {cause}")

    @classmethod
    def listing_live(cls, cause):
        return cls(f"tasks: listing live tasks: {cause}")
