"""Runs that start later: an automatic retry after its backoff, and a run parked for its limit.

Both are the transition table's `running` → `pending` on the locked task (see `store.locking`
for the lock order), bound to the run the worker executes: they lose when the task has moved
on, is ending, or was asked to stop. The run they leave queued carries a `not_before`, so
claims pass over it until then (docs/lifecycle.md#when-a-task-starts).
"""

from datetime import datetime

from django.db import transaction
from django.utils import timezone

from ..conf import app_settings
from ..models import Task
from ..states import RunStatus, RunTrigger, StopRequest, TaskStatus
from ..types import RunOutcome
from .endings import orphaned, record_end
from .locking import Log, hold_task, lock_task, retried, task_status, user_message
from .rows import move_to_new_run, new_run, save_task, set_status
from .tasks import RETRY_PROMPT


def _executing(task: Task, run_id: str) -> bool:
    """Say whether the locked task is running on `run_id`, which nobody asked to stop."""
    return (
        task.status == TaskStatus.RUNNING
        and task.run_id == run_id
        and task.run.status == RunStatus.RUNNING
        and task.run.stop_request == StopRequest.NONE
        and task.conversation.deleting_at is None
    )


@retried
def retry_later(
    task_id: str,
    run_id: str,
    new_run_id: str,
    outcome: RunOutcome,
    not_before: datetime,
    lease_cutoff: datetime | None = None,
) -> Task | None:
    """Record the run's failure and queue the task's next attempt to start at `not_before`.

    The failed run stays in the task's history; the task is pending on the new run, whose
    input says why the last attempt failed (as a retry's does). `lease_cutoff` makes it the
    reaper's: only a run silent since then is retried. None when the race was lost.
    """
    now = timezone.now()
    with transaction.atomic():
        task = lock_task(task_id)
        if not _executing(task, run_id):
            return None
        if lease_cutoff is not None and not orphaned(task, task.run, lease_cutoff):
            return None
        log = Log()
        hold_task(log, task)
        record_end(log, task.run, outcome, now)
        reason = outcome.error.strip()[: app_settings.SUMMARY_LIMIT]
        prompt = RETRY_PROMPT.format(reason=reason or "no reason was recorded")
        task.attempt = task.attempt_no() + 1
        run = new_run(task, new_run_id, RunTrigger.RETRY, prompt, now, not_before)
        move_to_new_run(task, run, now, "attempt")
        user_message(log, task.conversation_id, prompt, "retry", run_id=run.id, task_id=task.id)
        task_status(log, task, TaskStatus.RUNNING)
        log.flush()
        return task


@retried
def park(task_id: str, run_id: str, until: datetime, since: datetime) -> Task | None:
    """Queue a running run again to start at `until`, giving back its slot while it waits for
    its provider's limit, which it has waited for since `since`. None when the race was lost.
    """
    now = timezone.now()
    with transaction.atomic():
        task = lock_task(task_id)
        if not _executing(task, run_id):
            return None
        log = Log()
        hold_task(log, task)
        run = task.run
        run.status, run.worker, run.heartbeat_at = RunStatus.QUEUED, "", None
        run.not_before, run.limited_since = until, since
        run.requeues, run.requeue_at = 0, None
        run.save(
            update_fields=[
                "status",
                "worker",
                "heartbeat_at",
                "not_before",
                "limited_since",
                "requeues",
                "requeue_at",
            ]
        )
        set_status(task, TaskStatus.PENDING)
        save_task(task, ["status"], now)
        task_status(log, task, TaskStatus.RUNNING)
        log.flush()
        return task
