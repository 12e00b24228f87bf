"""Wake-up debt: settling results owed to a parent conversation (never touching the task row)."""

from django.utils import timezone

from .models import Wakeup
from .states import WakeupState


def consume(task_id: str, run_id: str) -> bool:
    """Mark the pending result of that run as pulled in-turn by the model; True if it was owed."""
    return bool(
        Wakeup.objects.filter(task_id=task_id, run_id=run_id, state=WakeupState.PENDING).update(
            state=WakeupState.CONSUMED, settled_at=timezone.now()
        )
    )


def mark_delivered(wakeups, delivered_run_id: str) -> int:
    """Mark wake-ups delivered by a wake-up run, each only if still pending for its own run."""
    now = timezone.now()
    count = 0
    for wakeup in wakeups:
        count += Wakeup.objects.filter(
            pk=wakeup.pk, run_id=wakeup.run_id, state=WakeupState.PENDING
        ).update(state=WakeupState.DELIVERED, delivered_run_id=delivered_run_id, settled_at=now)
    return count
