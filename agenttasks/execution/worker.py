"""Execute runs on django-q2 workers: a worker process holds many runs in flight, one per slot.

A run mostly waits on its model, its tools or its children, so a worker process gives each
claimed run a slot (a thread of its own) instead of its whole self (docs/architecture.md#in-flight-runs).
On PostgreSQL the process listens on `agenttasks_runs`: a new queued run is a notification (no
django-q2 job, `queue.launch_on_commit`), which wakes this process's claimer. Elsewhere, and
while no worker process is alive, the job queue.py enqueues for a run (`execute_run`) wakes the
claimer and returns at once. The claimer claims queued runs, a job's first and then the oldest,
several in one statement, while the process has free slots, and again whenever a slot frees
while runs are still queued. So a backlog is drained by the processes that hold runs, not by one
job per run, and the queued runs wait in the database. A second delivery of a run is harmless:
the claim is a compare-and-set.

Outside a worker process (a test, django-q2's sync mode) `execute_run` claims its run and
executes it in the calling thread.
"""

import logging
import os
import signal
import threading
import time
from collections import Counter
from datetime import timedelta
from multiprocessing import util as multiprocessing_util

from django.db import connection
from django.utils import timezone

from .. import registry, store
from ..broker import deltas, queue
from ..broker.listen import hub
from ..compat import django_q
from ..conf import app_settings
from ..delivery import lanes
from ..exceptions import RunNotFound
from ..flow import budgets
from ..models import Run, WorkerProcess
from ..operations import metrics
from ..runtime.base import release_connection
from ..runtime.driver import HOST, beater, drive, worker_identity
from ..store import faults
from ..types import Claimed

logger = logging.getLogger(__name__)

SQLITE_SLOTS = 4  # one writer: a few runs in flight per process keep it from queueing up
POSTGRES_SLOTS = 100
CLAIM_RETRY = 1.0  # seconds before a claim that failed is tried again
PASSED_RETRY = (0.02, 1.0)  # after passing over held runs: first retry, and the longest wait
# The least time between two claims of a process: in a burst one claim takes the runs of many
# notifications. A claim's fixed part (its looks at the queue, its answer) costs about as much as
# two runs' writes; at 20 ms apart a burst of echo tasks was claimed about 2.4 runs a claim.
CLAIM_GATHER = 0.05
LINE_RECHECK = timedelta(seconds=0.2)  # claim again after runs were left for their agent's line
LINE_SHARE = 4  # the claims keep each endpoint's line of turns at PARK_AFTER / LINE_SHARE


def execute_run(run_id: str) -> None:
    """Hand a queued run to this worker process's slots (the django-q2 job queue.py enqueues).

    In a worker process this returns at once; elsewhere the run executes in this thread.
    """
    pool = _pool
    if pool is not None and pool.pid == os.getpid():
        pool.offer(run_id)
        return
    if Run.objects.not_due(timezone.now()).filter(pk=run_id).exists():
        logger.info("worker.not_due run=%s", run_id)  # the reaper enqueues it again once due
        return
    worker = worker_identity()
    try:
        run = faults.reconnecting(lambda: store.claim(run_id, worker))
    except RunNotFound:
        logger.info("worker.run_gone run=%s", run_id)
        return
    if not run:
        logger.debug("worker.not_claimed run=%s", run_id)
        return
    drive(run, worker)


def agent_room() -> dict[str, int]:
    """How many more runs of each chat agent a claim may take, from how full its endpoint's
    line of turns was when this process last reserved one (docs/operating.md#meeting-your-providers-limits).

    The claims keep each line about PARK_AFTER / LINE_SHARE long: the runs beyond stay queued,
    in fair order, rather than being claimed to wait (or park) behind it.
    """
    within = app_settings.PARK_AFTER / LINE_SHARE
    chat = [agent for agent in registry.agents() if agent.runtime == "chat"]
    lines = budgets.room(within, {agent.endpoint for agent in chat}) if within else {}
    return {agent.id: lines[agent.endpoint] for agent in chat if agent.endpoint in lines}


def _after(seconds: float, call, *args) -> None:
    """Call `call(*args)` in `seconds` on a daemon timer: a look to come never holds a stopping
    process."""
    timer = threading.Timer(seconds, call, args=args)
    timer.daemon = True
    timer.start()


def slots_per_process() -> int:
    """WORKER_SLOTS, or the default of the database: 100 on PostgreSQL, 4 on SQLite."""
    configured = app_settings.WORKER_SLOTS
    if configured:
        return int(configured)
    return POSTGRES_SLOTS if connection.vendor == "postgresql" else SQLITE_SLOTS


def shutdown_grace() -> float:
    """SHUTDOWN_GRACE: the seconds a stopping worker process gives its runs in flight."""
    return float(app_settings.SHUTDOWN_GRACE)


class RunPool:
    """This worker process's slots: each executes one claimed run in a thread of its own."""

    def __init__(self, size: int):
        self.size = size
        self.pid = os.getpid()
        self.identity = worker_identity()
        self.started_at = timezone.now()
        self._lock = threading.Condition()
        self.held = 0  # slots taken: runs in flight, and claims under way
        self.jobs = 0  # django-q2 jobs this process started (its recycle count)
        self.timed_out = False  # django-q2 stopped a job of this process at its timeout
        self.first: list[str] = []  # the runs of jobs delivered since the last claim
        self.backlog = True  # runs may be queued that nobody here has tried to claim
        self.retiring = False
        self._wanted = threading.Event()
        self._passed_wait = PASSED_RETRY[0]
        self._next_look = None  # when a timer claims again for a delayed start
        threading.Thread(target=self._claim_loop, name="agenttasks-claimer", daemon=True).start()
        beater().report(self.report)
        self._wanted.set()  # claim what queued up while no process had a free slot

    # the jobs and the notifications ---------------------------------------------------------
    def wake(self, payload: str = "") -> None:
        """Claim queued runs while slots are free: a run was queued (`agenttasks_runs`)."""
        with self._lock:
            if self.retiring:
                return
            self.backlog = True
        self._wanted.set()

    def offer(self, run_id: str) -> None:
        """Take the job of a run: claim it (and more) when a slot is free, else later."""
        with self._lock:
            retiring = self.retiring
            if not retiring:
                self.backlog = True
                if len(self.first) < self.size:
                    self.first.append(run_id)
        if retiring:
            # This process claims nothing more: another one takes the run.
            queue.enqueue_run(run_id)
            return
        self._wanted.set()

    # claiming -------------------------------------------------------------------------------
    def _claim_loop(self) -> None:
        claimed_at = 0.0
        while True:
            self._wanted.wait()
            # In a burst of new runs, one claim takes the runs of many notifications: claims
            # follow each other CLAIM_GATHER apart at most (an idle process claims at once).
            time.sleep(max(0.0, claimed_at + CLAIM_GATHER - time.monotonic()))
            claimed_at = time.monotonic()
            self._wanted.clear()
            try:
                self._claim()
            except Exception:  # the claimer must outlive any one claim
                logger.exception("worker.claimer_failed")

    def _claim(self) -> None:
        """Claim runs for the free slots, in one statement."""
        room = agent_room()
        with self._lock:
            free = self.size - self.held
            if self.retiring or free <= 0 or not self.backlog:
                return
            first, self.first = self.first, []
            self.backlog = False  # a job delivered during the claim sets it again
            self.held += free
        claimed = Claimed([])
        try:
            claimed = faults.reconnecting(
                lambda: store.claim_many(self.identity, free, first, room)
            )
        except Exception:
            logger.exception("worker.claim_failed free=%d", free)
            with self._lock:
                self.backlog = True
                self.first.extend(first)
            _after(CLAIM_RETRY, self._wanted.set)
        finally:
            release_connection()
        runs = claimed.runs
        if runs:
            metrics.record_claims(runs, timezone.now())
            release_connection()
        taken = Counter(run.agent for run in runs)
        # An agent's runs may have been left queued for its endpoint's line: look again soon.
        lined_up = len(runs) < free and any(taken[a] >= n for a, n in room.items())
        with self._lock:
            self.held -= free - len(runs)
            if len(runs) == free or claimed.passed or lined_up:
                self.backlog = True  # all it asked for, or some were held: there may be more
            self._lock.notify_all()
        if claimed.next_at is not None:
            self._look_again_at(claimed.next_at)
        if lined_up:
            self._look_again_at(timezone.now() + LINE_RECHECK)
        if claimed.passed and len(runs) < free:
            # Held by a short transaction: try again soon, then less and less often.
            _after(self._passed_wait, self._wanted.set)
            self._passed_wait = min(self._passed_wait * 2, PASSED_RETRY[1])
        else:
            self._passed_wait = PASSED_RETRY[0]
        for run in runs:
            # A thread per run, ended with it: idle slots hold no stack (a pool of threads would
            # keep as many as the busiest moment needed).
            threading.Thread(target=self._execute, args=(run,), name="agenttasks-slot").start()

    def _look_again_at(self, when) -> None:
        """Claim again when the next delayed start is due (one timer: the earliest)."""
        with self._lock:
            if self._next_look is not None and self._next_look <= when:
                return
            self._next_look = when
        delay = max(0.0, (when - timezone.now()).total_seconds())
        _after(delay, self._due, when)

    def _due(self, when) -> None:
        with self._lock:
            if self._next_look == when:
                self._next_look = None
            self.backlog = True
        self._wanted.set()

    def _execute(self, run: Run) -> None:
        try:
            drive(run, self.identity)
        except BaseException:
            logger.exception("worker.slot_failed run=%s", run.id)
        finally:
            release_connection()
            # Under MAX_RUNNING_PER_USER a run's end may let its owner's next run go: look.
            held_back = bool(app_settings.MAX_RUNNING_PER_USER)
            with self._lock:
                self.held -= 1
                more = (self.backlog or held_back) and not self.retiring
                self._lock.notify_all()
            if more:
                self._wanted.set()

    # reporting ------------------------------------------------------------------------------
    def report(self, leases: store.Leases) -> None:
        """Record this process's slots and runs in flight (at each of the heartbeat's beats).

        The row also says that this process listens for new runs (`queue.workers_listen`), so a
        retiring process no longer writes it.
        """
        with self._lock:
            busy, retiring = self.held, self.retiring
        if not retiring:
            leases.report(self.identity, HOST, self.size, busy, self.started_at)

    # stopping -------------------------------------------------------------------------------
    def retire(self, grace: float | None) -> int:
        """Claim nothing more and wait for the runs in flight, then for the deliveries in
        flight, up to `grace` seconds in all (None: all).

        Returns how many runs and deliveries are still in flight; the leases recover those once
        this process is gone. The runs of jobs that reached this process unclaimed go back to
        the queue; the deliveries not started stay owed, and the reaper sends them.
        """
        with self._lock:
            self.retiring = True
            handed_back, self.first = self.first, []
        self._unregister()  # new runs get jobs again, or wait for another process
        for run_id in handed_back:
            try:
                queue.enqueue_run(run_id)
            except Exception:
                logger.exception("worker.hand_back_failed run=%s", run_id)
        with self._lock:
            deadline = None if grace is None else time.monotonic() + grace
            while self.held:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                self._lock.wait(left)
            left_over = self.held
        self._unregister()  # a beat may have written the row meanwhile
        delivering = lanes.active()
        if delivering is not None:
            # Closed after the runs: the lanes went on sending while the runs drained.
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            left_over += delivering.close(left)
        return left_over

    def _unregister(self) -> None:
        try:
            WorkerProcess.objects.filter(pk=self.identity).delete()
        except Exception:
            logger.warning("worker.unregister_failed", exc_info=True)
        finally:
            release_connection()

    def count_job(self, **kwargs) -> None:
        """Count a django-q2 job started here (connected to its pre_execute signal)."""
        self.jobs += 1

    def job_ended(self, *, timed_out: bool) -> None:
        self.timed_out = self.timed_out or timed_out


_pool: RunPool | None = None


def start_pool(**kwargs) -> None:
    """Give this django-q2 worker process its slots (connected to django-q2's worker start).

    django-q2 ends a worker process after `recycle` jobs, after a job overran `timeout` (its
    guard then replaces the process and sends it SIGTERM), and when the cluster stops (SIGTERM
    to qcluster). The runs a process holds belong to none of its jobs: a recycled process, and
    one whose job timed out, finish every run they hold before they exit; a stopping one gives
    them SHUTDOWN_GRACE seconds, and the leases recover what is left. A SIGTERM sent to the
    worker itself is a stop.
    """
    global _pool
    if _pool is not None and _pool.pid == os.getpid():
        return
    _pool = pool = RunPool(slots_per_process())
    lanes.start(int(app_settings.DELIVERY_LANES))
    if connection.vendor == "postgresql":
        deltas.watch_followers()
        # New runs come as notifications (no job each); on every (re)connection the process
        # claims what was queued while it was not listening.
        hub.listen_to(queue.RUNS_CHANNEL, pool.wake, on_listening=pool.wake)
    django_q.guard_task_queue()
    queue.on_job_start(pool.count_job)
    queue.on_job_end(pool.job_ended)
    # Runs as the worker's loop ends, before the process joins its threads and exits.
    multiprocessing_util.Finalize(pool, _at_exit, args=(pool,), exitpriority=100)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda signum, frame: _stop_soon(pool))
    logger.info("worker.slots pid=%d slots=%d", pool.pid, pool.size)


def _at_exit(pool: RunPool) -> None:
    replaced = pool.timed_out or queue.recycles_after(pool.jobs)
    left_over = pool.retire(None if replaced else shutdown_grace())
    if left_over:
        _exit_leaving(left_over)


def _stop_soon(pool: RunPool) -> None:
    """SIGTERM: stop claiming, give the runs their grace, then exit (in a thread: a handler
    must return). A process already on its way out (its loop has ended) goes on as it was."""
    if pool.retiring:
        return
    threading.Thread(target=_leave, args=(pool, shutdown_grace()), daemon=True).start()


def _leave(pool: RunPool, grace: float) -> None:
    _exit_leaving(pool.retire(grace))


def _exit_leaving(left_over: int) -> None:
    """End this process now, its slot and lane threads with it (the leases of those runs and
    deliveries recover them)."""
    if left_over:
        logger.warning(
            "worker.stopped_with_runs count=%d (runs and deliveries: their leases recover them)",
            left_over,
        )
    logging.shutdown()
    os._exit(0)
