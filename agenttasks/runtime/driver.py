"""Drive a claimed run: heartbeat it, execute its agent's runtime, hand over its ending.

The worker (a django-q2 job) and the `task` tool (a delegate child, inline in its caller's
thread) both run a claimed run through here. No transaction or row lock is held while the agent
works; an exception becomes a failed run, never a lost one.
"""

import logging
import math
import os
import socket
import threading
import time

from django.db import InterfaceError, OperationalError, connection
from django.utils import timezone

from .. import deadlines, lifecycle, metrics, queue, registry, store
from ..conf import app_settings
from ..exceptions import RunNotFound, TaskNotFound
from ..listen import hub, stop_key, task_key
from ..models import Run
from ..states import OutcomeStatus
from ..types import RunOutcome
from . import callable as callable_runtime
from . import chat
from .base import RunContext, RunStopped, StopFlag

# The run's log lines (worker.*) kept the logger they had before the driver left worker.py.
logger = logging.getLogger("agenttasks.worker")

RECONNECT_WINDOW = 60.0


HOST = socket.gethostname()


def worker_identity() -> str:
    """Name the claiming process: host, pid and thread."""
    return f"{HOST}:{os.getpid()}:{threading.get_ident()}"


class Heartbeat:
    """The heartbeat of one run: refresh `heartbeat_at` and read the stop request.

    `start()` hands it to this process's heartbeat thread, which beats every run it holds every
    HEARTBEAT_INTERVAL, and at once when one of their tasks settles (a stop finalizes the task,
    which this process hears in-process or through PostgreSQL notifications). One thread per
    process, not one per run: starting and joining a thread per run cost more than the run.
    """

    def __init__(self, run: Run, worker: str, flag: StopFlag, timeout: float):
        self.run = run
        self.run_id = run.id
        self.task_id = run.task_id
        self.worker = worker
        self.flag = flag
        self.timeout = timeout
        self.deadline = time.monotonic() + timeout
        killed_after = deadlines.q_timeout()
        # When django-q2's own timeout comes (a worker it kills says nothing more).
        self.kill_at = time.monotonic() + killed_after if killed_after else math.inf

    def start(self) -> None:
        _beater().track(self)

    def stop(self) -> None:
        _beater().untrack(self)

    def beat(self) -> None:
        # Refreshed until on_run_finished returns (also after the ending is recorded), so the
        # reaper can tell a worker still applying an ending from one that died doing so.
        row = Run.objects.filter(pk=self.run_id, worker=self.worker)
        row.update(heartbeat_at=timezone.now())
        current = row.values_list("stop_request", flat=True).first()
        # A run that is gone, or no longer this worker's, reads as an immediate stop.
        self.flag.set("now" if current is None else current)

    def expire(self) -> None:
        """Stop the run at its deadline: it and its task fail, and the runtime stops now."""
        self.flag.timed_out = deadlines.timeout_text(self.timeout)
        self.flag.set("now")
        deadlines.fail(self.run, self.flag.timed_out)


class _Beater(threading.Thread):
    """This process's heartbeat thread."""

    def __init__(self):
        super().__init__(name="agenttasks-heartbeat", daemon=True)
        self.pid = os.getpid()
        self.wake = threading.Event()
        self._lock = threading.Lock()
        self._beats: dict[int, Heartbeat] = {}
        self._wake_at = 0.0  # when the thread wakes next (monotonic)

    def track(self, heartbeat: Heartbeat) -> None:
        with self._lock:
            self._beats[id(heartbeat)] = heartbeat
            sooner = min(heartbeat.deadline, heartbeat.kill_at) < self._wake_at
        if sooner:  # a deadline before the next beat: plan the wait again
            self.wake.set()
        # A stop written by any process (the database notifies it), and a task settled by this
        # one (published in process: an immediate stop finalizes the task).
        hub.add(stop_key(heartbeat.run_id), self.wake)
        if heartbeat.task_id:
            hub.add(task_key(heartbeat.task_id), self.wake, listen=False)

    def untrack(self, heartbeat: Heartbeat) -> None:
        with self._lock:
            self._beats.pop(id(heartbeat), None)
        hub.discard(stop_key(heartbeat.run_id), self.wake)
        if heartbeat.task_id:
            hub.discard(task_key(heartbeat.task_id), self.wake)

    def run(self) -> None:
        while True:
            self.wake.wait(self._next_wait())
            self.wake.clear()
            with self._lock:
                beats = list(self._beats.values())
            now = time.monotonic()
            for heartbeat in beats:
                try:
                    if now >= heartbeat.deadline and not heartbeat.flag.timed_out:
                        heartbeat.expire()
                    if now >= heartbeat.kill_at:
                        heartbeat.kill_at = math.inf
                        deadlines.last_words(heartbeat.run_id, heartbeat.worker)
                    heartbeat.beat()
                except Exception:
                    logger.warning("heartbeat.failed run=%s", heartbeat.run_id, exc_info=True)
                    connection.close()
            if not beats:
                # Nothing to beat: hold no database session (CONN_MAX_AGE would keep it open,
                # and an idle process must not pin a database, e.g. a test database at drop).
                connection.close()

    def _next_wait(self) -> float:
        """Until the next beat, or sooner when a run's deadline comes first."""
        wait = app_settings.HEARTBEAT_INTERVAL
        with self._lock:
            deadlines_left = [
                b.deadline - time.monotonic() for b in self._beats.values() if not b.flag.timed_out
            ] + [b.kill_at - time.monotonic() for b in self._beats.values()]
        wait = max(0.0, min([wait, *deadlines_left]))
        self._wake_at = time.monotonic() + wait
        return wait


_beater_instance: _Beater | None = None
_beater_lock = threading.Lock()


def _beater() -> _Beater:
    """Return this process's heartbeat thread, starting it (again after a fork) when needed."""
    global _beater_instance
    with _beater_lock:
        current = _beater_instance
        if current is None or current.pid != os.getpid() or not current.is_alive():
            current = _beater_instance = _Beater()
            current.start()
        return current


def reconnecting(write, *, window: float = RECONNECT_WINDOW):
    """Call `write`, retrying while the database is unreachable (a restart) for up to `window` s.

    Each store operation is one transaction, so a retry repeats a whole compare-and-set: one that
    committed before the connection broke simply loses the second time.
    """
    deadline = time.monotonic() + window
    delay = 0.2
    while True:
        try:
            return write()
        except (OperationalError, InterfaceError):
            if connection.in_atomic_block or time.monotonic() > deadline:
                raise
            logger.warning("worker.database_unavailable retry_in=%.1fs", delay, exc_info=True)
            connection.close()
            time.sleep(delay)
            delay = min(delay * 2, 3.0)


def execute_inline(run_id: str, *, depth: int, callers: list) -> bool:
    """Claim a delegate child's queued run and execute it in the calling thread.

    The `task` tool's way to run a child: claimed, heartbeated and finished like a queued run,
    but never enqueued, with its callers' budget windows and stop flags linked into its context.
    Returns False when the run was not claimed (another thread or worker has it, or it moved).
    """
    worker = worker_identity()
    try:
        run = store.claim(run_id, worker)
    except RunNotFound:
        return False
    if not run:
        return False
    drive(run, worker, depth=depth, callers=callers)
    return True


def drive(run: Run, worker: str, **context) -> None:
    """Heartbeat a claimed run while its runtime executes, then hand over its ending."""
    flag = StopFlag()
    flag.set(run.stop_request)
    heartbeat = Heartbeat(run, worker, flag, deadlines.timeout_of(run.agent))
    heartbeat.start()
    begun = time.monotonic()
    try:
        outcome = _execute(run, flag, **context)
        seconds = time.monotonic() - begun
        try:
            reconnecting(
                lambda: lifecycle.on_run_finished(run.conversation_id, outcome, task=run.task)
            )
        except (TaskNotFound, RunNotFound):
            logger.info("worker.tree_deleted run=%s", run.id)
        metrics.record_run(run, outcome.status, seconds, outcome.usage)
    finally:
        heartbeat.stop()


def _execute(run: Run, flag: StopFlag, **context) -> RunOutcome:
    """Run the agent's runtime outside any transaction and turn every ending into an outcome."""
    outcome = _run_runtime(run, flag, **context)
    if flag.timed_out and outcome.status in (OutcomeStatus.CANCELLED, OutcomeStatus.FAILED):
        # Stopped at its deadline: the heartbeat has ended it already, with this error.
        return RunOutcome(run.id, OutcomeStatus.FAILED, error=flag.timed_out, append_message=False)
    return outcome


def _run_runtime(run: Run, flag: StopFlag, **context) -> RunOutcome:
    try:
        agent = registry.get(run.agent)
        # The claim read the run with its task and conversation; the store re-reads the stop
        # request when it records the ending, so nothing is read again here.
        conversation = run.task.conversation if run.task is not None else run.conversation
        ctx = RunContext(
            run=run,
            conversation=conversation,
            task=run.task,
            agent=agent,
            stop=flag,
            execute_inline=execute_inline,
            **context,
        )
        execute = callable_runtime.execute if agent.runtime == "callable" else chat.execute
        return execute(ctx)
    except RunStopped:
        return RunOutcome(run.id, OutcomeStatus.CANCELLED)
    except registry.UnknownAgent as exc:
        return RunOutcome(
            run.id, OutcomeStatus.FAILED, error=f"Agent not found: {run.agent} ({exc})"
        )
    except Exception as exc:
        logger.exception("worker.run_raised run=%s", run.id)
        return RunOutcome(run.id, OutcomeStatus.FAILED, error=str(exc) or type(exc).__name__)
    except SystemExit as exc:
        if not queue.is_worker_timeout(exc):
            raise
        # django-q2's timeout struck before the agent's deadline (a system check warns).
        logger.error("worker.killed_by_timeout run=%s", run.id)
        return RunOutcome(run.id, OutcomeStatus.FAILED, error=deadlines.killed_text())
