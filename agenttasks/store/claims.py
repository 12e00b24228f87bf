"""Claims: a worker moves queued runs (and their tasks) to running, one or several at once.

Each claim is the transition table's `pending` → `running` for the run the task names, on a live
conversation, re-checked on the locked rows (see `store.locking` for the lock order). On
PostgreSQL a claim is one statement (`store.postgres`); SQLite takes the same runs in one
IMMEDIATE transaction.
"""

from collections.abc import Sequence
from datetime import datetime

from django.db import transaction
from django.utils import timezone

from ..exceptions import RunNotFound
from ..models import Run
from ..states import RunStatus, TaskKind, TaskStatus, trigger_name
from ..types import Claimed
from . import postgres
from .locking import Log, hold_task, lock_run, lock_task_of_run, retried, task_status
from .rows import save_task, set_status


@retried
def claim(run_id: str, worker: str = "") -> Run | None:
    """Move a queued run (and its task) to running; None if it is no longer the one to run.

    The run comes back with its task and conversation (`run.task`, `run.conversation`).
    """
    now = timezone.now()
    if postgres.enabled():
        return postgres.claim(run_id, worker, now)
    with transaction.atomic():
        return _claim_locked(run_id, worker, now, delegates=True)


@retried
def claim_many(worker: str, limit: int, first: Sequence[str] = ()) -> Claimed:
    """Claim up to `limit` queued runs in one statement: those named in `first`, then the oldest.

    Concurrent claimers pass over each other's rows (SKIP LOCKED on PostgreSQL) and never claim
    one run twice; delegate children are claimed only when named (their callers execute them
    inline). Each run comes back as `claim` returns it.
    """
    if limit <= 0:
        return Claimed([])
    now = timezone.now()
    if postgres.enabled():
        return postgres.claim_many(worker, limit, now, list(first))
    # SQLite: the transaction holds the database's write lock from BEGIN (IMMEDIATE).
    claimed: list[Run] = []
    with transaction.atomic():
        seen: set[str] = set()
        for run_id in first:
            if len(claimed) >= limit:
                break
            if run_id not in seen:
                seen.add(run_id)
                _claim_into(claimed, run_id, worker, now, delegates=True)
        oldest = (
            Run.objects.filter(status=RunStatus.QUEUED)
            .exclude(pk__in=seen)
            .order_by("queued_at", "id")
            .values_list("pk", flat=True)
        )
        for run_id in oldest.iterator(chunk_size=limit + 8):
            if len(claimed) >= limit:
                break
            _claim_into(claimed, run_id, worker, now, delegates=False)
    return Claimed(claimed)


def _claim_into(claimed: list[Run], run_id: str, worker: str, now: datetime, **kw: bool) -> None:
    try:
        run = _claim_locked(run_id, worker, now, **kw)
    except RunNotFound:
        return
    if run is not None:
        claimed.append(run)


def _claim_locked(run_id: str, worker: str, now: datetime, *, delegates: bool) -> Run | None:
    task = lock_task_of_run(run_id)
    if task is None:
        return _claim_taskless(run_id, worker, now)
    run = task.run
    if (
        (task.kind == TaskKind.DELEGATE and not delegates)
        or run.status != RunStatus.QUEUED
        or task.status != TaskStatus.PENDING
        or task.conversation.deleting_at is not None
    ):
        return None
    log = Log()
    hold_task(log, task)
    _start(log, run, worker, now, trigger_name(run.trigger), task_id=task.id)
    set_status(task, TaskStatus.RUNNING)
    task.started_at = task.started_at or now
    save_task(task, ["status", "started_at"], now)
    task_status(log, task, TaskStatus.PENDING)
    log.flush()
    run.task = task
    return run


def _claim_taskless(run_id: str, worker: str, now: datetime) -> Run | None:
    run = lock_run(run_id)
    if run.status != RunStatus.QUEUED:
        return None
    if run.task_id is not None or run.conversation.deleting_at is not None:
        # Housekeeping: a queued run its task left (or on a dying conversation) never runs.
        run.status, run.ended_at, run.error = RunStatus.CANCELLED, now, ""
        run.save(update_fields=["status", "ended_at", "error"])
        return None
    log = Log()
    log.hold(run.conversation)
    _start(log, run, worker, now, run.trigger)
    log.flush()
    return run


def _start(log: Log, run: Run, worker: str, now: datetime, trigger: str, task_id: str = "") -> None:
    """Mark a locked queued run running for `worker` (run.started on its first start)."""
    if run.started_at is None:
        data = {"trigger": trigger, "attempt": run.attempt} if task_id else {"trigger": trigger}
        log.add(run.conversation_id, "run.started", data, run_id=run.id, task_id=task_id)
    run.status, run.worker, run.heartbeat_at = RunStatus.RUNNING, worker, now
    run.started_at = run.started_at or now
    run.save(update_fields=["status", "worker", "heartbeat_at", "started_at"])
