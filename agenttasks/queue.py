"""Enqueue work on django-q2 after commit; the only module that imports django_q.

Jobs carry ids only. Tests swap the backend for a `RecordingQueue` to drive endings by hand.
"""

import hashlib
import logging
import threading
from collections.abc import Callable
from contextlib import contextmanager

from django.db import transaction
from django.utils.module_loading import import_string

logger = logging.getLogger(__name__)

EXECUTE_RUN = "agenttasks.worker.execute_run"


class DjangoQBackend:
    """Send jobs to the django-q2 broker."""

    def enqueue(self, func: str, *args) -> None:
        from django_q.tasks import async_task

        async_task(func, *args)


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


def enqueue_run(run_id: str) -> None:
    """Enqueue the execution of a run now (callers use `launch_on_commit`)."""
    _backend.enqueue(EXECUTE_RUN, run_id)


def launch_on_commit(run_id: str) -> None:
    """Enqueue a run once the current transaction commits (at once outside one).

    Outside a transaction an enqueue failure reaches the caller (a launch failure). Inside an
    outer block the enqueue runs at that block's commit, after the run is durable: a failure
    there is logged, and the reaper enqueues the queued run again after REQUEUE_AFTER.
    """
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
    """Enqueue any other job (callbacks, wake-up delivery) after commit, logging failures."""

    def send():
        try:
            _backend.enqueue(func, *args)
        except Exception:
            logger.exception("enqueue failed func=%s args=%s", func, args)

    transaction.on_commit(send)


def install_schedule(name: str, func: str, minutes: int = 1) -> None:
    """Make sure exactly one repeating django-q2 schedule named `name` runs `func`."""
    from django_q.models import Schedule

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
                    schedule_type=Schedule.MINUTES,
                    minutes=minutes,
                    repeats=-1,
                )
            elif len(rows) > 1:  # left by versions that raced here
                Schedule.objects.filter(pk__in=rows[1:]).delete()
    except Exception:
        logger.exception("queue.schedule_failed name=%s", name)
        return
    logger.debug("queue.schedule_ready name=%s removed=%d", name, max(len(rows) - 1, 0))


def _lock_schedules(name: str) -> None:
    """Serialize the installs of one schedule until the caller's transaction ends."""
    from django_q.models import Schedule

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
    from django_q.signals import post_spawn

    post_spawn.connect(receiver, dispatch_uid="agenttasks.worker_start", weak=False)
