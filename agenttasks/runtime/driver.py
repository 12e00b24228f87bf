"""Drive a claimed run: heartbeat it, execute its agent's runtime, hand over its ending.

A worker process's slots (`worker.RunPool`, a thread per run) and the `task` tool (a delegate
child, inline in its caller's thread) both run a claimed run through here. No transaction or row
lock is held while the agent works; an exception becomes a failed run, never a lost one.
"""

import logging
import os
import threading
import time
from typing import Any

from django.db import connection

from .. import lifecycle, registry, store, tracing
from ..broker import queue
from ..broker.listen import HOST as HOST  # the worker's node, as the worker has read it here
from ..broker.listen import hub, process_name, stop_key, task_key
from ..conf import app_settings
from ..exceptions import RunNotFound, TaskNotFound
from ..models import Run, Wakeup
from ..operations import metrics
from ..states import OutcomeStatus, StopRequest
from ..store import faults
from ..types import RunOutcome
from . import callable as callable_runtime
from . import chat, deadlines
from .base import RunContext, RunStopped, StopFlag

# The run's log lines (worker.*) kept the logger they had before the driver left worker.py.
logger = logging.getLogger("agenttasks.execution.worker")


def worker_identity() -> str:
    """Name the claiming process: host and pid (every run it holds is beaten by its heartbeat)."""
    return process_name()


class Heartbeat:
    """The heartbeat of one run: its stop request, its deadline, and its lease kept fresh.

    `start()` hands it to this process's heartbeat thread, which beats every run it holds in
    one statement every HEARTBEAT_INTERVAL, and reads a run's stop request at once when its
    run is told to stop or its task settles (a stop finalizes the task, which this process hears
    in-process or through PostgreSQL notifications). One thread per process, not one per run.
    """

    def __init__(self, run: Run, worker: str, flag: StopFlag, timeout: float):
        self.run = run
        self.run_id = run.id
        self.task_id = run.task_id
        self.worker = worker
        self.flag = flag
        self.timeout = timeout
        self.deadline = time.monotonic() + timeout
        self.mark: _Mark | None = None  # set while the heartbeat thread tracks it

    def start(self) -> None:
        beater().track(self)

    def stop(self) -> None:
        beater().untrack(self)

    def expire(self) -> None:
        """Stop the run at its deadline: it and its task fail, and the runtime stops now."""
        self.flag.timed_out = self.flag.timed_out or deadlines.timeout_text(self.timeout)
        self.flag.set("now")
        try:
            lifecycle.end_at_deadline(self.run, self.flag.timed_out)
        except Exception:
            logger.warning("heartbeat.expire_failed run=%s", self.run_id, exc_info=True)
        finally:
            connection.close()


class _Mark:
    """What the hub sets when a run's stop or task key is published: read that run at once."""

    def __init__(self, beater: "_Beater", run_id: str):
        self.beater = beater
        self.run_id = run_id

    def set(self) -> None:
        self.beater.touch(self.run_id)


class _Beater(threading.Thread):
    """This process's heartbeat thread."""

    def __init__(self):
        super().__init__(name="agenttasks-heartbeat", daemon=True)
        self.pid = os.getpid()
        self.wake = threading.Event()
        self._lock = threading.Lock()
        self._beats: dict[str, Heartbeat] = {}
        self._touched: set[str] = set()
        self._reporters: list = []
        self._leases = store.Leases()
        self._wake_at = 0.0  # when the thread wakes next (monotonic)
        self._beat_at = 0.0  # when the next beat is due (monotonic)

    def report(self, reporter) -> None:
        """Call `reporter(leases)` at every beat (the worker process's slots), the first now."""
        with self._lock:
            self._reporters.append(reporter)
            self._beat_at = 0.0  # a new process says at once that it is there to take runs
        self.wake.set()

    def track(self, heartbeat: Heartbeat) -> None:
        mark = heartbeat.mark = _Mark(self, heartbeat.run_id)
        with self._lock:
            self._beats[heartbeat.run_id] = heartbeat
            sooner = heartbeat.deadline < self._wake_at
        if sooner:  # a deadline before the next beat: plan the wait again
            self.wake.set()
        # A stop written by any process: PostgreSQL notifies it. Elsewhere, a task settled by
        # this process (published in process: an immediate stop finalizes the task).
        hub.add(stop_key(heartbeat.run_id), mark)
        if heartbeat.task_id and connection.vendor != "postgresql":
            hub.add(task_key(heartbeat.task_id), mark, listen=False)

    def untrack(self, heartbeat: Heartbeat) -> None:
        with self._lock:
            if self._beats.get(heartbeat.run_id) is heartbeat:
                del self._beats[heartbeat.run_id]
                self._touched.discard(heartbeat.run_id)
        if heartbeat.mark is not None:
            hub.discard(stop_key(heartbeat.run_id), heartbeat.mark)
            if heartbeat.task_id:
                hub.discard(task_key(heartbeat.task_id), heartbeat.mark)

    def touch(self, run_id: str) -> None:
        """Read this run's stop request at once."""
        with self._lock:
            self._touched.add(run_id)
        self.wake.set()

    def run(self) -> None:
        while True:
            self.wake.wait(self._next_wait())
            self.wake.clear()
            try:
                self._pass()
            except Exception:
                logger.warning("heartbeat.failed", exc_info=True)
                self._leases.close()
            if not self._beats:
                # An idle process must not pin a database (e.g. a test database at drop).
                self._leases.close()

    def _pass(self) -> None:
        now = time.monotonic()
        with self._lock:
            beats = dict(self._beats)
            touched, self._touched = self._touched, set()
            reporters = list(self._reporters)
        for heartbeat in beats.values():
            if now >= heartbeat.deadline and not heartbeat.flag.timed_out:
                heartbeat.flag.timed_out = deadlines.timeout_text(heartbeat.timeout)
                # Its ending takes a pooled connection, which may be a while: never the beats'.
                threading.Thread(target=heartbeat.expire, name="agenttasks-deadline").start()
        if now >= self._beat_at:
            self._beat_at = now + app_settings.HEARTBEAT_INTERVAL
            self._read(beats, refresh=True)
            for reporter in reporters:
                reporter(self._leases)
        elif touched:
            self._read({k: v for k, v in beats.items() if k in touched}, refresh=False)

    def _read(self, beats: dict[str, Heartbeat], *, refresh: bool) -> None:
        """Read the stop requests of `beats` (refreshing their leases) in one statement."""
        if not beats:
            return
        # Refreshed until on_run_finished returns (also after the ending is recorded), so the
        # reaper can tell a worker still applying an ending from one that died doing so.
        by_worker: dict[str, list[str]] = {}
        for run_id, heartbeat in beats.items():
            by_worker.setdefault(heartbeat.worker, []).append(run_id)
        for worker, run_ids in by_worker.items():
            current = self._leases.beat(run_ids, worker, refresh=refresh)
            for run_id in run_ids:
                # A run that is gone, or no longer this worker's, reads as an immediate stop.
                beats[run_id].flag.set(current.get(run_id, StopRequest.NOW))

    def _next_wait(self) -> float:
        """Until the next beat, or sooner when a run's deadline comes first."""
        now = time.monotonic()
        with self._lock:
            waits = [b.deadline - now for b in self._beats.values() if not b.flag.timed_out]
        wait = max(0.0, min([self._beat_at - now, *waits]))
        self._wake_at = now + wait
        return wait


_beater_instance: _Beater | None = None
_beater_lock = threading.Lock()


def beater() -> _Beater:
    """Return this process's heartbeat thread, starting it (again after a fork) when needed."""
    global _beater_instance
    with _beater_lock:
        current = _beater_instance
        if current is None or current.pid != os.getpid() or not current.is_alive():
            current = _beater_instance = _Beater()
            current.start()
        return current


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
        # Its ending is in its span too: a wake-up or retry it records links back to it.
        with tracing.run_span(run, trace_causes) as traced:
            outcome = _execute(run, flag, **context)
            seconds = time.monotonic() - begun
            tracing.ended(traced, outcome)
            try:
                faults.reconnecting(
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
        # A lost connection may pass (the agent's retry policy tries again); a database's own
        # text stays in the log.
        return RunOutcome(
            run.id,
            OutcomeStatus.FAILED,
            error=faults.told(exc),
            retryable=faults.lost_connection(exc),
        )
    except SystemExit as exc:
        if not queue.is_worker_timeout(exc):
            raise
        # django-q2's timeout struck before the agent's deadline (a system check warns).
        logger.error("worker.killed_by_timeout run=%s", run.id)
        return RunOutcome(run.id, OutcomeStatus.FAILED, error=deadlines.killed_text())


def trace_causes(run: Run, parent: Any) -> list[Any]:
    """Return the span contexts a run's span links to: the run before it in its task (or its
    conversation), the span that recorded it when that is not its parent (a retry's or a
    comment's request, the run that woke it), and, for a wake-up, the children's runs."""
    if run.trigger == "initial":
        return []
    causes = []
    earlier = Run.objects.filter(created_at__lt=run.created_at).exclude(pk=run.pk)
    earlier = (
        earlier.filter(task_id=run.task_id)
        if run.task_id
        else earlier.filter(conversation_id=run.conversation_id)
    )
    before = earlier.order_by("-created_at").values_list("id", "traceparent", "task__traceparent")
    previous = before.first()
    if previous is not None:
        causes.append(tracing.run_context(previous[0], previous[2] or previous[1]))
    recorded = tracing.parse(run.traceparent)
    if recorded is not None and (parent is None or recorded.span_id != parent.span_id):
        causes.append(recorded)
    if run.trigger == "wakeup":
        reported = Wakeup.objects.filter(delivered_run_id=run.id)
        for child_run, child_traceparent in reported.values_list("run_id", "task__traceparent"):
            causes.append(tracing.run_context(child_run, child_traceparent))
    return [c for c in causes if c is not None]
