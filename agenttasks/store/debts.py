"""Wake-up debt: every change of a wake-up's state (docs/lifecycle.md#wake-up-debt-and-notifications).

An ending that owes its result to a parent conversation writes a `pending` wake-up in its own
transaction (on PostgreSQL inside `agenttasks_end_v2`). A wake-up leaves `pending` once, by a
compare-and-set on `pending` (states.WAKEUP_TRANSITIONS): `delivered` when a wake-up run carried
it, `consumed` when the model pulled the result in its turn, `dropped` when its task runs again or
when what a cancelled task's children owed it is moot. Settling never touches the task row.
"""

from collections.abc import Iterable
from datetime import datetime

from django.utils import timezone

from ..models import Task, Wakeup
from ..states import TaskKind, WakeupState


def owes_wakeup(task: Task) -> bool:
    """Say whether an ending of this task owes its result to a parent conversation."""
    return bool(task.parent_conversation_id) and task.kind != TaskKind.DELEGATE


def write_debt(task: Task, run_id: str, status: str) -> None:
    """Record the result this ending owes the parent conversation (a pending wake-up)."""
    assert task.parent_conversation_id is not None  # owes_wakeup said so
    truncated = len(task.result.encode("utf-8")) > len(task.summary.encode("utf-8"))
    Wakeup.objects.create(
        conversation_id=task.parent_conversation_id,
        task_id=task.id,
        run_id=run_id,
        status=status,
        label=task.label,
        summary=task.summary,
        truncated=truncated,
    )


def drop_debt(task: Task, now: datetime) -> None:
    """Drop what the task still owes: it is running again, and its next ending owes afresh."""
    Wakeup.objects.filter(task_id=task.id, state=WakeupState.PENDING).update(
        state=WakeupState.DROPPED, settled_at=now
    )


def drop_wakeups(wakeups: Iterable[Wakeup]) -> int:
    """Drop these wake-ups where they are still pending; return how many were."""
    return Wakeup.objects.filter(pk__in=[w.pk for w in wakeups], state=WakeupState.PENDING).update(
        state=WakeupState.DROPPED, settled_at=timezone.now()
    )


def consume_wakeup(task_id: str, run_id: str) -> bool:
    """Mark the pending result of that run as pulled in-turn by the model; True if it was owed."""
    return bool(
        Wakeup.objects.filter(task_id=task_id, run_id=run_id, state=WakeupState.PENDING).update(
            state=WakeupState.CONSUMED, settled_at=timezone.now()
        )
    )


def mark_delivered(wakeups: Iterable[Wakeup], delivered_run_id: str) -> int:
    """Mark wake-ups delivered by a wake-up run, each only if still pending for its own run."""
    now = timezone.now()
    count = 0
    for wakeup in wakeups:
        count += Wakeup.objects.filter(
            pk=wakeup.pk, run_id=wakeup.run_id, state=WakeupState.PENDING
        ).update(state=WakeupState.DELIVERED, delivered_run_id=delivered_run_id, settled_at=now)
    return count
