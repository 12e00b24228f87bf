"""Statuses, the task transition table and the model-facing status names."""

from django.db import models


class TaskStatus(models.TextChoices):
    PENDING = "pending", "pending"
    RUNNING = "running", "running"
    WAITING_FOR_INPUT = "waiting_for_input", "waiting for input"
    COMPLETED = "completed", "completed"
    FAILED = "failed", "failed"
    CANCELLED = "cancelled", "cancelled"


class RunStatus(models.TextChoices):
    QUEUED = "queued", "queued"
    RUNNING = "running", "running"
    PAUSED = "paused", "paused"
    COMPLETED = "completed", "completed"
    FAILED = "failed", "failed"
    CANCELLED = "cancelled", "cancelled"
    # Enqueued behind the conversation's current run (the `enqueue` strategy): no worker claims
    # it until the conversation is idle and it is released, oldest first, to `queued`.
    WAITING = "waiting", "waiting its turn"
    # Stopped for a newer message (the `interrupt` and `rollback` strategies): an interrupted
    # run's words stay in the transcript; a rolled-back run's are gone from every read.
    INTERRUPTED = "interrupted", "interrupted"
    ROLLED_BACK = "rolled_back", "rolled back"


class RunTrigger(models.TextChoices):
    INITIAL = "initial", "initial"
    RETRY = "retry", "retry"
    CONTINUATION = "continuation", "continuation"
    COMMENT = "comment", "comment"
    WAKEUP = "wakeup", "wake-up"
    MESSAGE = "message", "message"


class OutcomeStatus(models.TextChoices):
    """How a run's runtime says it ended (`RunOutcome.status`)."""

    COMPLETED = "completed", "completed"
    FAILED = "failed", "failed"
    CANCELLED = "cancelled", "cancelled"
    INPUT_REQUIRED = "input_required", "input required"
    PARKED = "parked", "parked"  # queued again to wait for its provider's limit


class TaskKind(models.TextChoices):
    """The kinds the app itself gives meaning to (any other kind is the site's own)."""

    PLAIN = "", "plain"
    DELEGATE = "delegate", "delegate"


class StopRequest(models.TextChoices):
    NONE = "", "none"
    AFTER_TURN = "after_turn", "after the current turn"
    NOW = "now", "now"
    INTERRUPT = "interrupt", "now, to end it interrupted"
    ROLLBACK = "rollback", "now, to roll it back"


class StopReason(models.TextChoices):
    """Why a task was cancelled or failed other than by its run (`Task.stop_reason`, the
    `reason` of its `task.status` event)."""

    NONE = "", "none"
    STOPPED = "stopped", "stopped"
    WHILE_QUEUED = "stopped while queued", "stopped while queued"
    WHILE_AWAITING_INPUT = "stopped while awaiting input", "stopped while awaiting input"
    AFTER_TURN = "stopped after the current turn", "stopped after the current turn"
    INPUT_TIMED_OUT = "timed out waiting for input", "timed out waiting for input"
    LEASE_EXPIRED = "lease expired", "lease expired"
    TIMED_OUT = "timed out", "timed out at its deadline"


class ActionKind(models.TextChoices):
    APPROVAL = "approval", "approval"
    QUESTION = "question", "question"


class ActionStatus(models.TextChoices):
    PENDING = "pending", "pending"
    APPROVED = "approved", "approved"
    DENIED = "denied", "denied"
    ANSWERED = "answered", "answered"
    EXPIRED = "expired", "expired"
    CANCELLED = "cancelled", "cancelled"


class WakeupStatus(models.TextChoices):
    COMPLETED = "completed", "completed"
    FAILED = "failed", "failed"


class WakeupState(models.TextChoices):
    PENDING = "pending", "pending"
    DELIVERED = "delivered", "delivered"
    CONSUMED = "consumed", "consumed"
    DROPPED = "dropped", "dropped"


S = TaskStatus

TERMINAL = frozenset({S.COMPLETED, S.FAILED, S.CANCELLED})
LIVE = frozenset({S.PENDING, S.RUNNING, S.WAITING_FOR_INPUT})
# Entering one of these owes the task's callback and its A2A push notifications.
NOTIFIED = TERMINAL | {S.WAITING_FOR_INPUT}

RUN_ENDED = frozenset(
    {
        RunStatus.COMPLETED,
        RunStatus.FAILED,
        RunStatus.CANCELLED,
        RunStatus.INTERRUPTED,
        RunStatus.ROLLED_BACK,
    }
)
RUN_ACTIVE = frozenset({RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.PAUSED})
RUN_UNFINISHED = RUN_ACTIVE | {RunStatus.WAITING}
# The stop requests that stop a run at once, and the status each ends it with.
STOPPED_AS: dict[str, str] = {
    StopRequest.NOW: RunStatus.CANCELLED,
    StopRequest.INTERRUPT: RunStatus.INTERRUPTED,
    StopRequest.ROLLBACK: RunStatus.ROLLED_BACK,
}

# Every allowed change of Task.status (None = the task does not exist yet), with what makes it.
TRANSITIONS: dict[tuple[str | None, str], str] = {
    (None, S.PENDING): "create / spawn",
    (S.PENDING, S.RUNNING): "a worker claims the current run",
    (S.PENDING, S.PENDING): "continuation advance (new run id)",
    (S.RUNNING, S.PENDING): "continuation advance or automatic retry (new run id), or a park",
    (S.RUNNING, S.WAITING_FOR_INPUT): "the run pauses",
    (S.WAITING_FOR_INPUT, S.PENDING): "an answer or a comment resumes it",
    **{(src, dst): "finalize" for src in LIVE for dst in TERMINAL},
    (S.FAILED, S.PENDING): "retry (new run id, attempt + 1) or a re-opening comment",
    (S.COMPLETED, S.PENDING): "a re-opening comment (new run id)",
    (S.CANCELLED, S.PENDING): "a re-opening comment (new run id)",
}

# Every change of Wakeup.state (None = not written yet), with what makes it (store/debts.py).
W = WakeupState
WAKEUP_TRANSITIONS: dict[tuple[str | None, str], str] = {
    (None, W.PENDING): "an ending owes its result to the parent conversation",
    (W.PENDING, W.DELIVERED): "a wake-up run carried it",
    (W.PENDING, W.CONSUMED): "the model pulled the result in its turn",
    (W.PENDING, W.DROPPED): "its task runs again, or a cancelled task's children owed it",
}

_MODEL_NAMES: dict[str, str] = {
    S.PENDING: "working",
    S.RUNNING: "working",
    S.WAITING_FOR_INPUT: "input_required",
    S.COMPLETED: "completed",
    S.FAILED: "failed",
    S.CANCELLED: "cancelled",
}


def trigger_name(trigger: str) -> str:
    """Name a run's trigger as the API and `run.started` do (`initial` is `create` there)."""
    return "create" if trigger == RunTrigger.INITIAL else trigger


def model_status(status: str) -> str:
    """Return the model-facing name of a task status (working, input_required, …)."""
    return _MODEL_NAMES[status]


def is_allowed(src: str | None, dst: str) -> bool:
    """Return whether the transition table allows src → dst."""
    return (src, dst) in TRANSITIONS


class MultitaskStrategy(models.TextChoices):
    """What a write does when it would start a run in a busy conversation (docs/lifecycle.md)."""

    REJECT = "reject", "reject"
    ENQUEUE = "enqueue", "enqueue"
    INTERRUPT = "interrupt", "interrupt"
    ROLLBACK = "rollback", "rollback"
    STEER = "steer", "steer"


class MissedTicks(models.TextChoices):
    """What a schedule does with a tick that came due while no cluster ran it."""

    SKIP = "skip", "skip it"
    RUN_LATE = "run_late", "run it once, late"


class TickOutcome(models.TextChoices):
    """What one tick of a schedule did."""

    CREATED = "created", "created a task"
    POSTED = "posted", "posted a message"
    SKIPPED = "skipped", "skipped (missed)"
    REFUSED = "refused", "refused"
