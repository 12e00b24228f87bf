"""Claims: a worker moves queued runs (and their tasks) to running, one or several at once.

Each claim is the transition table's `pending` → `running` for the run the task names, on a live
conversation, re-checked on the locked rows (see `store.locking` for the lock order). On
PostgreSQL a claim is one statement (`store.postgres`); SQLite takes the same runs in one
IMMEDIATE transaction.
"""

from collections import Counter
from collections.abc import Sequence
from datetime import datetime

from django.db import transaction
from django.db.models import Count, F, Min
from django.utils import timezone

from ..conf import app_settings
from ..exceptions import RunNotFound
from ..models import Run, Task
from ..states import RunStatus, RunTrigger, TaskKind, TaskStatus, trigger_name
from ..types import Claimed
from . import postgres
from .locking import Log, hold_task, lock_run, lock_task_of_run, retried, task_status
from .rows import save_task, set_status


@retried
def claim(run_id: str, worker: str = "") -> Run | None:
    """Move a queued run (and its task) to running; None if it is no longer the one to run.

    It does not look at a delayed start (`not_before`): the worker's claims of several runs
    leave a run until it is due, and `execution.worker.execute_run` does the same.
    The run comes back with its task and conversation (`run.task`, `run.conversation`).
    """
    now = timezone.now()
    if postgres.enabled():
        return postgres.claim(run_id, worker, now)
    with transaction.atomic():
        return _claim_locked(run_id, worker, now, delegates=True)


@retried
def claim_many(
    worker: str,
    limit: int,
    first: Sequence[str] = (),
    agent_room: dict[str, int] | None = None,
) -> Claimed:
    """Claim up to `limit` due queued runs in one statement: those named in `first`, then the
    others in fair order (`fair_order`), leaving queued the task runs of an owner who has
    MAX_RUNNING_PER_USER of them running, and the runs of an agent beyond its `agent_room`
    (how many more its model endpoint's line of turns takes).

    Concurrent claimers pass over each other's rows (SKIP LOCKED on PostgreSQL) and never claim
    one run twice; delegate children are claimed only when named (their callers execute them
    inline). A run whose `not_before` has not come stays queued; `Claimed.next_at` says when
    the next one is due. Each run comes back as `claim` returns it.
    """
    if limit <= 0:
        return Claimed([])
    now = timezone.now()
    per_owner = app_settings.MAX_RUNNING_PER_USER
    if postgres.enabled():
        return postgres.claim_many(worker, limit, now, list(first), per_owner, agent_room or {})
    # SQLite: the transaction holds the database's write lock from BEGIN (IMMEDIATE).
    claimed: list[Run] = []
    with transaction.atomic():
        seen = set(Run.objects.not_due(now).filter(pk__in=first).values_list("pk", flat=True))
        for run_id in first:
            if len(claimed) >= limit:
                break
            if run_id not in seen:
                seen.add(run_id)
                _claim_into(claimed, run_id, worker, now, delegates=True)
        running = _running_by_owner() if per_owner else Counter()
        room = Counter(agent_room or {})
        room.subtract(run.agent for run in claimed)
        for run_id, agent, owner, of_task in fair_order(now, exclude=seen):
            if len(claimed) >= limit:
                break
            held_back = per_owner and of_task and owner is not None
            if (held_back and running[owner] >= per_owner) or (
                agent_room and agent in agent_room and room[agent] <= 0
            ):
                continue
            if _claim_into(claimed, run_id, worker, now, delegates=False):
                running[owner] += of_task
                room[agent] -= 1
        next_at = Run.objects.not_due(now).aggregate(at=Min("not_before"))["at"]
    return Claimed(claimed, next_at=next_at)


def fair_order(now: datetime, exclude: set[str]) -> list[tuple[str, str, int | None, bool]]:
    """Order the due queued runs as claims take them (agenttasks_claim_runs_v8 on PostgreSQL):
    (run id, agent, owner id, whether it is a task's run).

    Wake-up runs first (they finish what has begun); then owner by owner: every owner's best
    run, then every owner's second, and so on, where an owner's runs go by priority, then age;
    runs of the same rank go by priority, then age. A run carries its owner and priority.
    """
    rows = (
        Run.objects.due(now)
        .exclude(pk__in=exclude)
        .order_by("-priority", "queued_at", "id")
        .values_list("pk", "trigger", "priority", "owner_id", "queued_at", "task_id", "agent")
    )
    shares: Counter[tuple[bool, int | None]] = Counter()
    keyed = []
    for run_id, trigger, priority, owner, queued_at, task_id, agent in rows:
        wakeup = trigger == RunTrigger.WAKEUP
        shares[wakeup, owner] += 1
        rank = (not wakeup, shares[wakeup, owner], -priority, queued_at, run_id)
        keyed.append((rank, (run_id, agent, owner, task_id is not None)))
    return [run for _, run in sorted(keyed, key=lambda pair: pair[0])]


def _running_by_owner() -> Counter[int | None]:
    """Count the running runs of tasks by their conversation's owner."""
    rows = (
        Run.objects.filter(status=RunStatus.RUNNING, task__isnull=False)
        .values_list("owner_id")
        .annotate(n=Count("pk"))
    )
    return Counter(dict(rows))


def _claim_into(claimed: list[Run], run_id: str, worker: str, now: datetime, **kw: bool) -> bool:
    try:
        run = _claim_locked(run_id, worker, now, **kw)
    except RunNotFound:
        return False
    if run is not None:
        claimed.append(run)
    return run is not None


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


def set_priority(task_id: str, priority: int) -> bool:
    """Set a task's priority, and its unfinished runs' (the claims order the queued runs by the
    run's copy); False when there is no such task."""
    now = timezone.now()
    with transaction.atomic():
        updated = Task.objects.filter(pk=task_id).update(
            priority=priority, updated_at=now, version=F("version") + 1
        )
        Run.objects.unfinished().filter(task_id=task_id).update(priority=priority)
    return updated == 1
