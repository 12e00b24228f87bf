"""The reaper's passes: orphans, stuck endings, dead conversation runs, requeues, lapsed actions.

Several reapers may run at once (one per worker process, on every node): each write re-checks
its predicate under the row locks, so two reapers never settle the same row twice.
"""

from datetime import datetime, timedelta

from django.db import models, transaction
from django.db.models import Q
from django.utils import timezone

from ..conf import app_settings
from ..models import PendingAction, Run, Task, Wakeup
from ..states import RUN_ENDED, ActionStatus, RunStatus, TaskStatus, WakeupState
from ..types import Ending, RunOutcome
from .endings import ORPHAN_TEXT, end, finalize_locked
from .locking import Log, hold_task, lock_open_action, lock_task, run_finished
from .rows import resolve_action

BATCH = 500


def lease_cutoff() -> datetime:
    """The heartbeat time before which a running run is presumed dead."""
    return timezone.now() - timedelta(seconds=app_settings.LEASE_TIMEOUT)


def fail_orphans() -> list[Task]:
    """Fail every running task whose run's lease expired, with its debt and events."""
    cutoff = lease_cutoff()
    candidates = (
        Task.objects.visible()
        .filter(status=TaskStatus.RUNNING, run__in=Run.objects.lease_expired(cutoff))
        .values_list("pk", "run_id")[:BATCH]
    )
    orphan = RunOutcome(None, TaskStatus.FAILED, error=ORPHAN_TEXT, append_message=False)
    ending = Ending(
        TaskStatus.FAILED, summary=ORPHAN_TEXT, error=ORPHAN_TEXT, reason="lease expired"
    )
    failed = []
    for task_id, run_id in list(candidates):
        ended = end(task_id, run_id, ending, outcome=orphan, lease_cutoff=cutoff)
        if ended.task is not None:
            failed.append(ended.task)
    return failed


def stuck_endings() -> list[tuple[Task, RunOutcome]]:
    """Tasks still naming a run whose ending was recorded by a worker that then died."""
    tasks = (
        Task.objects.visible()
        .select_related("run")
        .filter(
            status__in=(TaskStatus.PENDING, TaskStatus.RUNNING),
            run__status__in=RUN_ENDED,
            run__heartbeat_at__lt=lease_cutoff(),
        )[:BATCH]
    )
    return [
        (
            task,
            RunOutcome(
                run_id=task.run_id,
                status=task.run.status,
                text=task.run.output,
                error=task.run.error,
                graceful_stop=task.run.graceful_stop,
                append_message=False,
            ),
        )
        for task in tasks
    ]


def fail_dead_conversation_runs() -> list[str]:
    """Fail runs without a task whose lease expired; return their conversations."""
    cutoff = lease_cutoff()
    now = timezone.now()
    ended = []
    for run_id in Run.objects.taskless().lease_expired(cutoff).values_list("pk", flat=True)[:BATCH]:
        with transaction.atomic():
            run = (
                Run.objects.select_related("conversation")
                .select_for_update(no_key=True, skip_locked=True, of=("conversation", "self"))
                .lease_expired(cutoff)
                .filter(pk=run_id)
                .first()
            )
            if run is None:
                continue
            log = Log()
            log.hold(run.conversation)
            run.status, run.ended_at, run.error = RunStatus.FAILED, now, ORPHAN_TEXT
            run.save(update_fields=["status", "ended_at", "error"])
            run_finished(log, run)
            log.flush()
            ended.append(run.conversation_id)
    return ended


def requeue_stale() -> list[str]:
    """Move the queued_at of runs queued longer than REQUEUE_AFTER; return them to enqueue again."""
    now = timezone.now()
    cutoff = now - timedelta(seconds=app_settings.REQUEUE_AFTER)
    stale = Run.objects.filter(status=RunStatus.QUEUED, queued_at__lt=cutoff).filter(
        Q(task__isnull=True) | Q(task__run_id=models.F("id"))
    )
    run_ids = list(stale.values_list("pk", flat=True)[:1000])
    # Moving queued_at under the same predicate lets only one reaper re-enqueue each run.
    return [
        run_id
        for run_id in run_ids
        if Run.objects.filter(pk=run_id, status=RunStatus.QUEUED, queued_at__lt=cutoff).update(
            queued_at=now
        )
    ]


def conversations_owed() -> list[str]:
    """Conversations that have pending wake-ups."""
    return list(
        Wakeup.objects.filter(state=WakeupState.PENDING)
        .values_list("conversation_id", flat=True)
        .distinct()[:1000]
    )


def expired_actions(action_ids: list[str] | None = None) -> list[PendingAction]:
    """Open actions past their deadline (optionally only those ids)."""
    actions = PendingAction.objects.open().filter(deadline__lt=timezone.now())
    if action_ids is not None:
        actions = actions.filter(pk__in=action_ids)
    return list(actions.order_by("deadline")[:BATCH])


def expire_and_cancel(task_id: str, run_id: str, action_id: str) -> Task | None:
    """Apply `on_timeout: cancel`: the action expires and the task ends cancelled on its run."""
    now = timezone.now()
    reason = "timed out waiting for input"
    with transaction.atomic():
        task = lock_task(task_id)
        action = lock_open_action(action_id)
        if action is None:
            return None
        log = Log()
        hold_task(log, task)
        resolve_action(log, action, {"status": ActionStatus.EXPIRED}, now)
        won = finalize_locked(
            log, task, run_id, Ending(TaskStatus.CANCELLED, summary=reason, reason=reason), now
        )
        log.flush()
        return won
