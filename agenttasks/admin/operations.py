"""What operators do to tasks, through the lifecycle, each answering what happened per task."""

import logging
from collections import Counter
from dataclasses import dataclass, field

from django.contrib import messages

from .. import lifecycle
from ..exceptions import (
    ActionResolved,
    AlreadyFinal,
    LaunchFailed,
    NotRetryable,
    RetryConflict,
    RetryLimit,
    TaskError,
    TaskLimit,
    TaskNotFound,
)
from ..models import PendingAction, Task
from ..states import LIVE, TaskStatus
from ..toolkit import errors

logger = logging.getLogger(__name__)


@dataclass
class Report:
    """Outcomes of one operation over several tasks, counted by what happened."""

    verb: str
    outcomes: Counter = field(default_factory=Counter)
    succeeded: int = 0
    notes: list[str] = field(default_factory=list)
    _ok: set = field(default_factory=set)

    def add(self, outcome: str, ok: bool) -> None:
        self.outcomes[outcome] += 1
        self.succeeded += ok
        if ok:
            self._ok.add(outcome)

    @property
    def level(self) -> int:
        total = sum(self.outcomes.values())
        if self.succeeded == total:
            return messages.SUCCESS
        return messages.WARNING if self.succeeded else messages.ERROR

    def message(self) -> str:
        # What was done first, then what was refused, each in the order it first happened.
        ordered = sorted(self.outcomes.items(), key=lambda item: item[0] not in self._ok)
        parts = ", ".join(f"{n} {outcome}" for outcome, n in ordered)
        return f"{self.verb}: {'; '.join([parts, *self.notes])}."

    def send(self, request) -> None:
        messages.add_message(request, self.level, self.message())


def _status_now(task_id: str) -> str:
    """Read a task's status label as the operator sees it ('running', 'waiting for input')."""
    status = Task.objects.filter(pk=task_id).values_list("status", flat=True).first()
    return TaskStatus(status).label if status else "deleted"


def cancel(task_id: str, *, graceful: bool) -> tuple[str, bool]:
    """Stop a task now or after its current turn."""
    try:
        info = lifecycle.stop(task_id, graceful=graceful)
    except AlreadyFinal as exc:
        return f"already {exc.status}", False
    except TaskNotFound:
        return "not found", False
    except TaskError as exc:
        return f"not cancelled: {exc}", False
    if info.status == TaskStatus.CANCELLED:
        return "cancelled", True
    if graceful and info.status in LIVE:
        return "will stop after this turn", True
    return f"not cancelled: it is {_status_now(task_id)}", False


def retry(task_id: str) -> tuple[str, bool]:
    """Start a failed task again as a new attempt."""
    try:
        info = lifecycle.retry(task_id)
    except NotRetryable as exc:
        if exc.delegate:
            return "not retryable: a delegate task is driven by its caller", False
        return f"not retryable: it is {TaskStatus(exc.status).label}", False
    except RetryLimit as exc:
        return f"not retried: all {exc.limit} attempts used", False
    except TaskLimit as exc:
        return f"not retried: its parent already has {exc.limit} tasks running", False
    except RetryConflict:
        return "not retried: another writer claimed it first", False
    except LaunchFailed as exc:
        return f"not retried: {exc}", False
    except TaskNotFound:
        return "not found", False
    return f"retried (attempt {info.attempt})", True


def live_descendants(conversation_id: str) -> int:
    """Count the live tasks spawned below a conversation, at any depth."""
    levels = Task.objects.only("conversation_id", "status").levels_below([conversation_id])
    return sum(task.status in LIVE for level in levels for task in level)


def stop_tree(task: Task) -> tuple[str, bool, int]:
    """Stop a task and every live task below it; return the task's outcome and how many stopped."""
    before = live_descendants(task.conversation_id)
    outcome, ok = cancel(task.pk, graceful=False)
    try:
        lifecycle.stop_tree(task.conversation_id)
    except Exception:  # an ExceptionGroup of the children that could not be stopped
        logger.exception("admin.stop_tree_failed task=%s", task.pk)
        return f"{outcome}, but some descendants could not be stopped", False, 0
    stopped = before - live_descendants(task.conversation_id)
    # A finished task whose descendants were stopped still counts as a successful tree stop.
    return outcome, ok or stopped > 0, stopped


def resolve(action: PendingAction, resolution: dict) -> tuple[str, bool]:
    """Answer an approval or a question; say whether the task resumes."""
    try:
        task = lifecycle.resolve_as_person(action.pk, resolution)
    except ActionResolved as exc:  # settled, stale, or expired (its timeout applied now)
        return f"{errors.refusal(exc).message}.", False
    except TaskError as exc:  # deleted or moved meanwhile
        return f"Action {action.pk} was not answered: {exc}", False
    done = {"approved": "Approved", "denied": "Denied", "answered": "Answered"}
    text = f"{done.get(resolution['status'], 'Resolved')} {action.tool_name} ({action.pk})"
    if task is not None and task.status == TaskStatus.WAITING_FOR_INPUT:
        return f"{text}; the task still waits on another action.", True
    return f"{text}; the task resumes.", True
