"""Hand runs to worker processes, and enqueue work on django-q2 after commit; the only module
that imports django_q.

On PostgreSQL, while worker processes are alive, a new queued run needs no django-q2 job: its
transaction notifies `agenttasks_runs` (delivered at commit), and every worker process listens
there and claims runs while it has free slots (`worker.RunPool`), so django-q2's cost of a job
(the pusher's dequeue, the worker's execution, the monitor's acknowledgement) is not paid per run
(docs/architecture.md#handing-runs-to-workers). Otherwise, and for every other job, a job carries
ids only. Tests swap the backend for a `RecordingQueue` to drive endings by hand.
"""

import functools
import hashlib
import logging
import sys
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager
from datetime import timedelta

from django.db import DEFAULT_DB_ALIAS, connection, transaction
from django.db.models import Q
from django.db.models.signals import pre_save
from django.utils import timezone
from django.utils.module_loading import import_string
from django_q.brokers import Broker, get_broker
from django_q.brokers.orm import ORM
from django_q.conf import Conf
from django_q.exceptions import TimeoutException
from django_q.models import Failure, OrmQ, Schedule
from django_q.signals import post_execute_in_worker, post_spawn, pre_execute
from django_q.signing import SignedPackage
from django_q.tasks import async_task
from django_q.worker import rss_check

from ..conf import app_settings
from ..models import WorkerProcess

logger = logging.getLogger(__name__)

EXECUTE_RUN = "agenttasks.execution.worker.execute_run"
# The ORM broker's table, which the create's SQL function writes a run's job into.
ORMQ_TABLE = OrmQ._meta.db_table


class DjangoQBackend:
    """Send jobs to the django-q2 broker."""

    def enqueue(self, func: str, *args) -> None:
        async_task(func, *args)

    def job_row(self, func: str, *args) -> dict | None:
        """Return the broker row of a job when the broker is this database's ORM, else None.

        The caller writes the row in its own transaction, so the job commits with what it runs.
        """
        broker = _database_broker()
        if broker is None:
            return None
        capture = CapturingBroker(broker.list_key)
        async_task(func, *args, broker=capture)  # django-q2 builds and signs the package
        return {"key": broker.list_key, "payload": capture.payload, "lock": timezone.now()}

    def queued_runs(self, handed_within: float) -> set[str] | None:
        """Run ids with a job outstanding in the broker's table (ORM broker here), else None."""
        jobs = self.queued_jobs({EXECUTE_RUN}, handed_within)
        return None if jobs is None else {args[0] for _, args in jobs if args}

    def queued_jobs(self, funcs: set[str], handed_within: float) -> set[tuple] | None:
        """The jobs of `funcs` outstanding in the broker's table, as (func, args) pairs (ORM
        broker here), else None.

        A job stays in django-q2's table until a worker acknowledges it. It is outstanding while
        it waits there, or when a cluster took it less than `handed_within` seconds ago (its
        lock then reads `retry` seconds after that). A job taken longer ago whose work was never
        done was lost with the worker that took it (killed before it started): django-q2 would
        deliver it again only after `retry`, so it does not count.
        """
        broker = _database_broker()
        if broker is None:
            return None
        now = timezone.now()
        taken_since = now + timedelta(seconds=(Conf.RETRY or 0) - handed_within)
        held = set()
        payloads = (
            OrmQ.objects.using(DEFAULT_DB_ALIAS)
            .filter(key=broker.list_key)
            .filter(Q(lock__lte=now) | Q(lock__gt=taken_since))
            .values_list("payload", flat=True)
        )
        for payload in payloads.iterator(chunk_size=2000):
            try:
                package = SignedPackage.loads(payload)
            except Exception:  # a job another site signed, or not a package at all
                continue
            if package.get("func") in funcs:
                held.add((package["func"], job_args(package.get("args") or ())))
        return held


def job_args(args) -> tuple:
    """A job's arguments as plain values: a status enqueued as a TaskStatus member reads as its
    string, so a job compares equal to the one a Delivery row names."""
    return tuple(str.__str__(a) if isinstance(a, str) else a for a in args)


@functools.cache
def _database_broker():
    """django-q2's ORM broker when it uses the database agenttasks writes to, else None."""
    broker = get_broker()
    return broker if isinstance(broker, ORM) and Conf.ORM == DEFAULT_DB_ALIAS else None


class CapturingBroker(Broker):
    """A broker that keeps the package it is given instead of sending it."""

    payload = ""

    def enqueue(self, task):
        self.payload = task
        return "in-transaction"


def insert_job(job: dict) -> None:
    """Write a job row from `job_row` (inside the caller's transaction)."""
    OrmQ.objects.using(DEFAULT_DB_ALIAS).create(**job)


def job_row(run_id: str) -> dict | None:
    """Return the broker row of a run's job, to be written with the run (None: enqueue after
    commit)."""
    row = getattr(_backend, "job_row", None)
    return row(EXECUTE_RUN, run_id) if row is not None else None


class RecordingQueue:
    """Record enqueued run ids instead of executing them (a test double).

    Other jobs (wake-up delivery, callbacks) run at once in the caller's thread unless
    `run_jobs` is False. `fail_with` makes run enqueues raise (a launch failure);
    `before_enqueue(run_id)` runs inside the launch, before recording, to stage races.
    """

    def __init__(self, *, run_jobs: bool = True):
        self.run_ids: list[str] = []
        self.jobs: list[tuple[str, tuple]] = []
        self.run_jobs = run_jobs
        self.fail_with: BaseException | None = None
        self.before_enqueue: Callable[[str], None] | None = None
        self._lock = threading.Lock()

    def enqueue(self, func: str, *args) -> None:
        if func == EXECUTE_RUN:
            if self.before_enqueue is not None:
                self.before_enqueue(args[0])
            if self.fail_with is not None:
                raise self.fail_with
            with self._lock:
                self.run_ids.append(args[0])
        else:
            with self._lock:
                self.jobs.append((func, args))
            if self.run_jobs:
                import_string(func)(*args)


_backend = DjangoQBackend()


def get_backend():
    """Return the active queue backend."""
    return _backend


@contextmanager
def use_backend(backend):
    """Route every enqueue to `backend` for the duration of the block."""
    global _backend
    previous, _backend = _backend, backend
    try:
        yield backend
    finally:
        _backend = previous


def queued_runs(handed_within: float) -> set[str] | None:
    """Run ids whose job is still outstanding in the broker, or None when it cannot tell."""
    probe = getattr(_backend, "queued_runs", None)
    return probe(handed_within) if probe is not None else None


def queued_jobs(funcs: set[str], handed_within: float) -> set[tuple] | None:
    """The (func, args) of the jobs of `funcs` still outstanding in the broker, or None when it
    cannot tell."""
    probe = getattr(_backend, "queued_jobs", None)
    return probe(funcs, handed_within) if probe is not None else None


def is_worker_timeout(exc: BaseException) -> bool:
    """Say whether `exc` is django-q2 stopping a job at its `timeout`."""
    return isinstance(exc, TimeoutException)


def enqueue_run(run_id: str) -> None:
    """Enqueue the execution of a run now (callers use `launch_on_commit`)."""
    _backend.enqueue(EXECUTE_RUN, run_id)


RUNS_CHANNEL = "agenttasks_runs"
# What a commit that enqueues django-q2 jobs notifies (agenttasks.broker.orm.ListeningORM).
JOBS_CHANNEL = "agenttasks_jobs"
_listening = (0.0, False)  # (monotonic time it was read, whether worker processes listen)
_listening_lock = threading.Lock()
LISTENING_TTL = 1.0  # seconds a web process trusts what it read


def workers_listen() -> bool:
    """Say whether worker processes listen for new runs: PostgreSQL, with one alive (read once a
    second).

    A worker process is alive while its heartbeat rewrote its row within LEASE_TIMEOUT
    (WorkerProcess); a stopping one removes its row before it stops claiming. A test's default
    queue double (RecordingQueue) wants every run as a job, and gets it.
    """
    global _listening
    if not isinstance(_backend, DjangoQBackend) or connection.vendor != "postgresql":
        return False
    now = time.monotonic()
    with _listening_lock:
        read_at, value = _listening
        if now - read_at < LISTENING_TTL:
            return value
    cutoff = timezone.now() - timedelta(seconds=app_settings.LEASE_TIMEOUT)
    value = WorkerProcess.objects.filter(seen_at__gte=cutoff).exists()
    with _listening_lock:
        _listening = (now, value)
    return value


def forget_listeners() -> None:
    """Read whether worker processes listen afresh at the next launch (tests, after a cluster)."""
    global _listening
    with _listening_lock:
        _listening = (0.0, False)


def notify_workers() -> None:
    """Tell the listening worker processes a run is queued (at the current transaction's commit)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_notify(%s, '')", [RUNS_CHANNEL])


def launch_on_commit(run_id: str) -> None:
    """Hand a queued run to the workers once the current transaction commits (at once outside one).

    Listening workers are notified in the transaction itself (PostgreSQL delivers at commit);
    otherwise the run's job is enqueued. Outside a transaction an enqueue failure reaches the
    caller (a launch failure). Inside an outer block the enqueue runs at that block's commit,
    after the run is durable: a failure there is logged, and the reaper enqueues the queued run
    again after REQUEUE_AFTER.
    """
    if workers_listen():
        notify_workers()
        return
    if not transaction.get_connection().in_atomic_block:
        enqueue_run(run_id)
        return

    def send():
        try:
            enqueue_run(run_id)
        except Exception:
            logger.exception("queue.enqueue_failed run=%s (the reaper will requeue it)", run_id)

    transaction.on_commit(send)


def enqueue_job(func: str, *args) -> None:
    """Enqueue any other job (callbacks, wake-up delivery) after commit, logging failures.

    What these jobs deliver is recorded in the database first (deliveries owed, wake-up debt),
    so the reaper sends again what a failed enqueue left owed.
    """

    def send():
        try:
            _backend.enqueue(func, *args)
        except Exception:
            logger.exception("enqueue failed func=%s args=%s", func, args)

    transaction.on_commit(send)


def enqueue_now(func: str, *args) -> None:
    """Enqueue any other job now; a failure reaches the caller."""
    _backend.enqueue(func, *args)


def install_schedule(name: str, func: str, minutes: int = 1, *, daily: bool = False) -> None:
    """Make sure exactly one repeating django-q2 schedule named `name` runs `func`.

    It repeats every `minutes`, or once a day with `daily`.
    """
    try:
        with transaction.atomic():
            # Every worker of every cluster calls this as it starts, all at the same moment.
            _lock_schedules(name)
            rows = list(
                Schedule.objects.filter(name=name).order_by("id").values_list("id", flat=True)
            )
            if not rows:
                Schedule.objects.create(
                    name=name,
                    func=func,
                    schedule_type=Schedule.DAILY if daily else Schedule.MINUTES,
                    minutes=None if daily else minutes,
                    repeats=-1,
                )
            elif len(rows) > 1:  # left by versions that raced here
                Schedule.objects.filter(pk__in=rows[1:]).delete()
    except Exception:
        logger.exception("queue.schedule_failed name=%s", name)
        return
    logger.debug("queue.schedule_ready name=%s removed=%d", name, max(len(rows) - 1, 0))


def arm_schedule(name: str, func: str, args: tuple, at, q_id: int | None = None) -> int:
    """Arm a django-q2 row that runs `func(*args, due=<its due time>)` once at `at`; return its id.

    The row is of type ONCE with one repeat: when django-q2's scheduler fires it, it disarms it
    (repeats 0) and saves it, and the receiver of `on_schedule_fired` re-arms it for the tick
    after in that same transaction. Re-arming an existing row (`q_id`) moves its time.
    """
    fields = {"next_run": at, "repeats": 1}
    if q_id is not None and Schedule.objects.filter(pk=q_id).update(**fields):
        return q_id
    row = Schedule.objects.create(
        name=name,
        func=func,
        args=repr(tuple(args)),
        schedule_type=Schedule.ONCE,
        intended_date_kwarg="due",
        **fields,
    )
    return row.pk


def schedules_due() -> bool:
    """Say whether a django-q2 schedule row is due (cheaper than running the scheduler)."""
    return Schedule.objects.filter(next_run__lte=timezone.now()).exclude(repeats=0).exists()


def broker() -> Broker:
    """Return django-q2's broker for this process (one, kept)."""
    return _broker()


@functools.cache
def _broker() -> Broker:
    return get_broker()


@functools.cache
def uses_redis() -> bool:
    """Say whether django-q2's broker is its Redis broker."""
    current = broker()
    # Imported with the broker's class when it is Redis's; importing it to ask would load the
    # redis package (about 7 MiB) into every process of a cluster on another broker.
    redis_broker = sys.modules.get("django_q.brokers.redis_broker")
    return redis_broker is not None and isinstance(current, redis_broker.Redis)


def disarm_schedule(q_id: int | None) -> None:
    """Stop a row armed by `arm_schedule` from firing (an update: no save signal)."""
    if q_id is not None:
        Schedule.objects.filter(pk=q_id).update(repeats=0)


def lock_schedule_row(q_id: int | None) -> None:
    """Lock a django-q2 schedule row as its scheduler does before firing it (lock order: this
    row, then the agenttasks schedule)."""
    if q_id is not None:
        list(Schedule.objects.select_for_update().filter(pk=q_id).values_list("pk", flat=True))


def delete_schedule_row(q_id: int | None) -> None:
    if q_id is not None:
        Schedule.objects.filter(pk=q_id).delete()


def on_schedule_fired(func: str, receiver) -> None:
    """Call `receiver(row)` when django-q2's scheduler has fired a row of `func` armed by
    `arm_schedule`, as it saves the row disarmed, inside the scheduler's transaction."""

    def fired(sender, instance, **kwargs):
        if instance.pk is not None and instance.func == func and instance.repeats == 0:
            receiver(instance)

    pre_save.connect(fired, sender=Schedule, weak=False, dispatch_uid=f"agenttasks.fired:{func}")


def old_failures(before, limit: int) -> list:
    """Return ids of django-q2's failure rows (failed jobs it kept) that stopped before `before`."""
    return list(
        Failure.objects.filter(stopped__lt=before)
        .order_by("stopped")
        .values_list("pk", flat=True)[:limit]
    )


def delete_failures(ids: list) -> int:
    """Delete those failure rows; return how many went."""
    return Failure.objects.filter(pk__in=ids).delete()[0]


def _lock_schedules(name: str) -> None:
    """Serialize the installs of one schedule until the caller's transaction ends."""
    connection = transaction.get_connection()
    if connection.vendor == "postgresql":
        digest = hashlib.sha256(f"agenttasks:schedule:{name}".encode()).digest()
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_advisory_xact_lock(%s)", [int.from_bytes(digest[:8], "big", signed=True)]
            )
    else:
        # A write takes SQLite's write lock even when it matches no row (IMMEDIATE transactions
        # already hold it; deferred ones would otherwise race between the read and the insert).
        Schedule.objects.filter(name=name, pk__lt=0).update(name=name)


def on_worker_start(receiver) -> None:
    """Call `receiver()` whenever a django-q2 worker process starts."""
    uid = f"agenttasks.worker_start:{receiver.__module__}.{receiver.__qualname__}"
    post_spawn.connect(receiver, dispatch_uid=uid, weak=False)


def on_job_start(receiver) -> None:
    """Call `receiver()` before each job this django-q2 worker process executes."""
    pre_execute.connect(receiver, dispatch_uid="agenttasks.job_start", weak=False)


def on_job_end(receiver) -> None:
    """Call `receiver(timed_out=…)` after each job this django-q2 worker process executes.

    `timed_out` says whether django-q2 stopped the job at its `timeout` (it then replaces the
    process).
    """

    def ended(sender, task=None, **kwargs):
        failed = not (task or {}).get("success", True)
        receiver(timed_out=failed and "TimeoutException" in str((task or {}).get("result")))

    post_execute_in_worker.connect(ended, dispatch_uid="agenttasks.job_end", weak=False)


def recycles_after(jobs: int) -> bool:
    """Say whether django-q2 retires a worker process after it started `jobs` jobs.

    It does after `recycle` jobs, or once the process outgrew `max_rss`.
    """
    return bool(Conf.RECYCLE and jobs >= Conf.RECYCLE) or bool(rss_check())
