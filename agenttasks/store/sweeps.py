"""The reaper's passes: orphans, stuck endings, dead conversation runs, requeues, lapsed actions.

Several reapers may run at once (one per worker process, on every node): each write re-checks
its predicate under the row locks, so two reapers never settle the same row twice. Each pass
takes its candidates from a QuerySet here (`orphans`, `stale_queued`, `lapsed_actions`,
`owed_wakeups`), which the reaper's dry run (`reaper.preview`) lists without writing.
"""

from collections.abc import Callable
from datetime import datetime, timedelta

from django.db import connection, models, transaction
from django.db.models import F, Q
from django.utils import timezone

from ..broker.listen import LISTENER_PREFIX
from ..conf import app_settings
from ..models import PendingAction, Run, Task, Wakeup, WorkerProcess
from ..models.run import RunQuerySet
from ..states import RUN_ENDED, ActionStatus, RunStatus, StopReason, TaskStatus, WakeupState
from ..types import Ending, RunOutcome
from .endings import ORPHAN_TEXT, end, finalize_locked
from .locking import Log, hold_task, lock_open_action, lock_task, retried, run_finished
from .rows import resolve_action
from .steering import leave_untaken

BATCH = 500
# The leases a run of a demonstrably alive worker process may stay silent before the reaper
# fails it anyway: a starved process's heartbeat is late, not gone (docs/operating.md).
LIVE_GRACE = 3


def lease_cutoff() -> datetime:
    """Return the heartbeat time before which a running run is presumed dead."""
    return timezone.now() - timedelta(seconds=app_settings.LEASE_TIMEOUT)


def live_workers(cutoff: datetime) -> list[str]:
    """Return the worker processes that are demonstrably alive.

    On PostgreSQL: a process whose row was rewritten within LIVE_GRACE leases and whose listener
    is connected (its session is named for it; a killed process's session ends with it), so a
    process that CPU starvation keeps from beating is still seen. Elsewhere: a process whose
    row was rewritten since `cutoff`.
    """
    if connection.vendor != "postgresql":
        return list(WorkerProcess.objects.filter(seen_at__gte=cutoff).values_list("pk", flat=True))
    since = timezone.now() - timedelta(seconds=LIVE_GRACE * app_settings.LEASE_TIMEOUT)
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT w.id FROM {WorkerProcess._meta.db_table} w WHERE w.seen_at >= %s "
            "AND EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.datname = current_database() "
            "AND a.application_name = left(%s || w.id, 63))",
            [since, LISTENER_PREFIX],
        )
        return [row[0] for row in cursor.fetchall()]


def silent_runs(cutoff: datetime) -> RunQuerySet:
    """Return the running runs presumed dead: silent since `cutoff` (their lease expired), and
    held by a process that is not demonstrably alive, or silent for LIVE_GRACE leases."""
    expired = Run.objects.lease_expired(cutoff)
    alive = live_workers(cutoff)
    if not alive:
        return expired
    hard = timezone.now() - timedelta(seconds=LIVE_GRACE * app_settings.LEASE_TIMEOUT)
    heard_lately = Q(heartbeat_at__gte=hard) | Q(heartbeat_at__isnull=True, started_at__gte=hard)
    return expired.exclude(Q(worker__in=alive) & heard_lately)


def orphans(cutoff: datetime) -> models.QuerySet[Task]:
    """Return the running tasks whose run is presumed dead (`silent_runs`)."""
    # The silent runs first (usually none), then their tasks by run: as one statement, the
    # planner could scan every running run again for each running task (seen: 0.7 s a sweep
    # with 500 tasks running, on statistics taken while few ran).
    run_ids = list(silent_runs(cutoff).values_list("pk", flat=True))
    if not run_ids:
        return Task.objects.none()
    return Task.objects.visible().filter(status=TaskStatus.RUNNING, run_id__in=run_ids)


def fail_orphans(retried_instead: Callable[[str, str, datetime], bool] | None = None) -> list[Task]:
    """Fail every running task whose run's lease expired, with its debt and events.

    `retried_instead(task_id, run_id, cutoff)`, when given, may queue an orphan's next attempt
    instead (its agent's retry policy: a lost worker is a failure that may pass); it says
    whether it did.
    """
    cutoff = lease_cutoff()
    candidates = orphans(cutoff).values_list("pk", "run_id")[:BATCH]
    failed = []
    text = ORPHAN_TEXT
    for task_id, run_id in list(candidates):
        if retried_instead is not None and retried_instead(task_id, run_id, cutoff):
            continue
        orphan = RunOutcome(None, TaskStatus.FAILED, error=text, append_message=False)
        ending = Ending(
            TaskStatus.FAILED, summary=text, error=text, reason=StopReason.LEASE_EXPIRED
        )
        ended = end(task_id, run_id, ending, outcome=orphan, lease_cutoff=cutoff)
        if ended.task is not None:
            failed.append(ended.task)
    return failed


def stuck_endings() -> list[tuple[Task, RunOutcome]]:
    """Return tasks still naming a run whose ending was recorded by a worker that then died."""
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


@retried
def fail_dead_conversation_runs() -> list[str]:
    """Fail runs without a task whose lease expired; return their conversations."""
    cutoff = lease_cutoff()
    now = timezone.now()
    ended = []
    for run_id in silent_runs(cutoff).taskless().values_list("pk", flat=True)[:BATCH]:
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
            leave_untaken(log, run, now)  # what was steered to it runs after it
            run.save(update_fields=["status", "ended_at", "error", "steers_taken"])
            run_finished(log, run)
            log.flush()
            ended.append(run.conversation_id)
    return ended


# A run's job lost outside the database (another broker) is sent again after REQUEUE_AFTER, then
# after twice that, and so on, up to 2**MAX_DOUBLINGS times REQUEUE_AFTER.
MAX_DOUBLINGS = 6
REQUEUE_BATCH = 1000


def stale_queued(now: datetime) -> models.QuerySet[Run]:
    """Return current queued runs older than REQUEUE_AFTER that are due for a look by the reaper."""
    cutoff = now - timedelta(seconds=app_settings.REQUEUE_AFTER)
    return (
        Run.objects.due(cutoff)
        .filter(queued_at__lt=cutoff)
        .filter(Q(requeue_at__isnull=True) | Q(requeue_at__lte=now))
        .filter(Q(task__isnull=True) | Q(task__run_id=models.F("id")))
    )


def requeue_stale(queued_jobs: set[str] | None) -> list[str]:
    """Record a re-enqueue of each stale queued run that needs a job; return them to enqueue.

    `queued_jobs` holds the runs whose job is still in the broker's table (ORM broker): those
    get none, so a run never has two jobs waiting. Without it (another broker) a run is sent
    again with a backoff recorded on the run. The compare-and-set on `requeue_at` lets only one
    of several reapers re-enqueue a run.
    """
    now = timezone.now()
    after = timedelta(seconds=app_settings.REQUEUE_AFTER)
    due = stale_queued(now)
    # Least recently looked at first, so a backlog larger than a batch is covered in turn.
    order = (models.F("requeue_at").asc(nulls_first=True), "queued_at")
    candidates = list(due.order_by(*order).values_list("pk", "requeues")[:REQUEUE_BATCH])
    if queued_jobs is not None:
        waiting = [run_id for run_id, _ in candidates if run_id in queued_jobs]
        # Their jobs are still in the queue: look again after REQUEUE_AFTER.
        Run.objects.filter(pk__in=waiting, status=RunStatus.QUEUED).update(requeue_at=now + after)
        candidates = [(run_id, n) for run_id, n in candidates if run_id not in queued_jobs]
    sent = []
    for run_id, requeues in candidates:
        doublings = 0 if queued_jobs is not None else min(requeues + 1, MAX_DOUBLINGS)
        won = Run.objects.filter(pk=run_id, status=RunStatus.QUEUED, requeues=requeues).update(
            requeues=requeues + 1, requeue_at=now + after * 2**doublings
        )
        if won:
            sent.append(run_id)
    return sent


def owed_wakeups() -> models.QuerySet[Wakeup]:
    """Return the pending wake-ups of conversations that have an agent to wake.

    A conversation with no agent behind it (an MCP client's) is never woken: its owner pulls
    what it is owed (docs/lifecycle.md#wake-up-debt-and-notifications).
    """
    return Wakeup.objects.filter(state=WakeupState.PENDING).exclude(conversation__agent="")


def conversations_owed() -> list[str]:
    """Return the conversations a pass wakes: those with pending wake-ups and an agent, and
    those with a run waiting its turn, or a task's ended run with steered messages it never
    read, and none active (its release was lost to a crash)."""
    owed = set(owed_wakeups().values_list("conversation_id", flat=True).distinct()[:1000])
    waits = Q(status=RunStatus.WAITING) | Q(
        task__isnull=False, status__in=RUN_ENDED, steers__gt=F("steers_taken")
    )
    waiting = (
        Run.objects.filter(waits)
        .exclude(conversation_id__in=Run.objects.active().values("conversation_id"))
        .values_list("conversation_id", flat=True)
        .distinct()[:1000]
    )
    return sorted(owed.union(waiting))


def lapsed_actions(now: datetime) -> models.QuerySet[PendingAction]:
    """Return the open actions past their deadline, the earliest first."""
    return PendingAction.objects.open().filter(deadline__lt=now).order_by("deadline")


def expired_actions(action_ids: list[str] | None = None) -> list[PendingAction]:
    """Return the open actions past their deadline (optionally only those ids), a batch."""
    actions = lapsed_actions(timezone.now())
    if action_ids is not None:
        actions = actions.filter(pk__in=action_ids)
    return list(actions[:BATCH])


@retried
def expire_and_cancel(task_id: str, run_id: str, action_id: str) -> Task | None:
    """Apply `on_timeout: cancel`: the action expires and the task ends cancelled on its run."""
    now = timezone.now()
    reason = StopReason.INPUT_TIMED_OUT
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
