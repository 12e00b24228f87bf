"""The django-q2 internals agenttasks depends on, each with the failure its patch prevents.

Four of django-q2's failures strike a worker process that holds many runs in flight, so they are
patched here, and nowhere else does agenttasks touch django-q2's internals. docs/operating.md
("django-q2's failures, and what agenttasks does about them") writes each one up as a report to
upstream would:

- a worker killed while it waits for a job keeps the task queue's lock, and one killed while it
  reads a job leaves the queue's next reader half a job: `guard_task_queue`;
- a worker killed while it holds its timer's lock stops the guard for good: `guard_worker_timers`;
- a SIGTERM to the whole process group hangs the cluster's stop: `bound_cluster_stop`.

They were verified against django-q2 1.10.0 and 1.11.1 (pyproject.toml pins `>=1.10,<1.12`).
`missing()` names every internal they need that the installed django-q2 lacks, and the system
check `agenttasks.E006` fails `qcluster`'s start on it (agenttasks/checks.py): a release that
renames one cannot turn a guard off in silence.
"""

import contextlib
import fcntl
import glob
import logging
import multiprocessing
import os
import struct
import tempfile
import threading
from collections.abc import Callable
from typing import Any

from django_q import cluster as django_q_cluster
from django_q import scheduler as django_q_scheduler
from django_q.cluster import Cluster
from django_q.queues import Queue

logger = logging.getLogger(__name__)

VERIFIED = ("1.10.0", "1.11.1")
ORPHAN_CHECK = 1.0  # seconds between a waiting worker's looks at whether its sentinel lives
LOCK_PATIENCE = 5.0  # seconds a worker's timer lock is waited for before going on without it
STOP_MARGIN = 15  # seconds a cluster's stop may take beyond SHUTDOWN_GRACE before it is ended
STOP_ACK_WAIT = 2.0  # seconds a live sentinel needs to take the stop event
READ_PATIENCE = 5.0  # seconds the rest of a job whose start was read may take to arrive
QUEUE_INTERNALS = ("_reader", "_sem")
PICKLE_START = b"\x80"  # the PROTO opcode every pickle of protocol 2 or later begins with
LOCK_FILES = "agenttasks-queue-{sentinel}.lock"


def missing() -> list[str]:
    """Name the internals the patches need that the installed django-q2 (or Python) lacks."""
    gone = []
    if not callable(getattr(django_q_cluster, "Value", None)):
        gone.append("django_q.cluster.Value (the workers' timers)")
    for name in ("stop", "sig_handler"):
        if not callable(getattr(Cluster, name, None)):
            gone.append(f"django_q.cluster.Cluster.{name}")
    if not callable(getattr(django_q_scheduler, "scheduler", None)):
        gone.append("django_q.scheduler.scheduler (the schedules' clock)")
    if not hasattr(multiprocessing.Process(), "_args"):
        gone.append("multiprocessing.Process._args (a worker's task queue)")
    probe = Queue()
    try:
        gone += [f"django_q.queues.Queue.{n}" for n in QUEUE_INTERNALS if not hasattr(probe, n)]
    finally:
        probe.close()
        probe.join_thread()
    return gone


def fire_due_schedules(broker: Any) -> None:
    """Run django-q2's scheduler once: enqueue the job of every schedule row that is due.

    Its cluster runs it every 30 s, a cadence fixed in its guard; agenttasks' schedules tick to
    the second, so each worker process's clock (execution/clock.py) runs it more often. It locks
    the due rows and moves them on in one transaction, so two callers never fire one row twice.
    """
    django_q_scheduler.scheduler(broker=broker)


def guard_task_queue() -> None:
    """Make this worker read its jobs under a lock that a killed worker cannot keep.

    django-q2's workers read their jobs from one multiprocessing queue, whose `get()` holds a lock
    shared by every worker while it waits for data. A worker killed while it waits (SIGKILL, the
    OOM killer) takes the lock with it, and no worker of the cluster gets a job again; a worker
    that holds runs in its slots waits for jobs nearly all the time. So here a worker waits for
    data holding nothing, and reads a job that has arrived under a POSIX record lock on a file its
    sibling workers share, which the kernel releases when its holder dies. A worker whose sentinel
    died stops (ORPHAN_CHECK) instead of waiting for good.

    A job is a length and then its pickle, read in two reads: a worker killed between them leaves
    the next reader a pickle where it expects a length. That reader discards what the queue holds
    and waits for the next job (`realign`); the broker and the reaper bring the lost jobs back.
    """
    process = multiprocessing.current_process()
    task_queue: Any = (getattr(process, "_args", None) or (None,))[0]
    if not all(hasattr(task_queue, name) for name in QUEUE_INTERNALS):
        # The system check refuses to start such a cluster; a worker is no place to go on unguarded.
        raise RuntimeError("django-q2's task queue is not the one agenttasks was verified with")
    remove_stale_lock_files()
    task_queue.get = guarded_get(task_queue, os.getppid())


def guarded_get(task_queue: Any, sentinel: int) -> Callable[..., Any]:
    """Return a `get` of `task_queue` that holds no lock while it waits (see guard_task_queue)."""
    # One file per sentinel: its workers, the first ones and those it starts later, share it.
    path = os.path.join(tempfile.gettempdir(), LOCK_FILES.format(sentinel=sentinel))
    lock = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    loads = multiprocessing.reduction.ForkingPickler.loads

    def get(block=True, timeout=None):
        while True:
            # Until a job arrives, holding nothing. A worker whose sentinel is gone gets no job
            # again and no stop either (a sentinel that dies mid-stop may just have started it):
            # it stops as django-q2 would stop it, finishing the runs it holds.
            while not task_queue._reader.poll(ORPHAN_CHECK):
                if os.getppid() != sentinel:
                    logger.warning("queue.sentinel_gone pid=%d: the worker stops", os.getpid())
                    return "STOP"
            fcntl.lockf(lock, fcntl.LOCK_EX)
            try:
                if not task_queue._reader.poll(0):
                    continue  # another worker took it
                # The slot goes back before the read: a worker killed in between then leaves the
                # bounded queue one job too many, not one slot short for good.
                give_back_slot(task_queue)
                data = read_job(task_queue._reader)
                if data is None:
                    realign(task_queue)
                    continue
            finally:
                fcntl.lockf(lock, fcntl.LOCK_UN)
            return loads(data)

    return get


def read_job(reader: Any) -> bytes | None:
    """Read one job's pickle from the queue's pipe, or None if the pipe does not start with one."""
    header = _read_exactly(reader, 4)
    size = struct.unpack("!i", header)[0] if header is not None else 0
    if size <= 0:
        return None  # a pickle's first bytes read as a length are negative (PICKLE_START)
    data = _read_exactly(reader, size)
    return data if data is not None and data.startswith(PICKLE_START) else None


def _read_exactly(reader: Any, size: int) -> bytes | None:
    chunks, remaining = [], size
    while remaining:
        if not reader.poll(READ_PATIENCE):
            return None
        chunk = os.read(reader.fileno(), remaining)
        if not chunk:
            return None
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def realign(task_queue: Any) -> None:
    """Discard what the queue's pipe holds, so that the next job read starts at its length."""
    discarded = 0
    while task_queue._reader.poll(0.1):  # a job being written when the reader looked comes whole
        discarded += len(os.read(task_queue._reader.fileno(), 65536))
    # The queue counted each discarded job against its bound: all of them go back.
    while give_back_slot(task_queue):
        pass
    logger.warning(
        "queue.realigned discarded=%d bytes: a reader died in the middle of a job", discarded
    )


def give_back_slot(task_queue: Any) -> bool:
    """Release one of the bounded queue's slots; False when all were free already (a reader
    killed after its release and before its read leaves one over)."""
    try:
        task_queue._sem.release()
    except ValueError:
        return False
    return True


def remove_stale_lock_files() -> None:
    """Remove the lock files of sentinels that are gone (a cluster that was killed leaves one)."""
    for path in glob.glob(os.path.join(tempfile.gettempdir(), LOCK_FILES.format(sentinel="*"))):
        pid = os.path.basename(path).rsplit("-", 1)[-1].split(".", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            _remove_lock_file(int(pid))


def _remove_lock_file(sentinel: int) -> None:
    with contextlib.suppress(OSError):
        os.unlink(os.path.join(tempfile.gettempdir(), LOCK_FILES.format(sentinel=sentinel)))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # somebody else's process
    return True


class PatientLock:
    """A lock shared across processes whose wait gives up after LOCK_PATIENCE seconds.

    django-q2's guard reads each worker's timer under the timer's lock, and a worker holds that
    lock while it hands a finished job's result over. A worker SIGKILLed then (the OOM killer, an
    operator) keeps the lock forever, and the guard waited on it forever: no dead worker was
    replaced again. With this lock the guard goes on after a while, finds the worker dead, and
    replaces it. Nothing else takes a timer's lock for longer than an instant.
    """

    def __init__(self) -> None:
        self._lock = multiprocessing.RLock()

    def acquire(self, block: bool = True, timeout: float | None = None) -> bool:
        if block and timeout is None:
            timeout = LOCK_PATIENCE
        if self._lock.acquire(block, timeout):
            return True
        if block:
            logger.warning("queue.timer_lock_abandoned (its holder died holding it; going on)")
        return False

    def release(self) -> None:
        try:
            self._lock.release()
        except (AssertionError, ValueError):
            pass  # the wait gave up: this process never held it

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc_info) -> None:
        self.release()


def patient_value(typecode: str, *args):
    """Return a multiprocessing Value whose lock is a PatientLock (django-q2's workers' timers)."""
    return multiprocessing.Value(typecode, *args, lock=PatientLock())  # type: ignore[call-overload]


def guard_worker_timers() -> None:
    """Give the workers django-q2 starts from now on timers a dead worker cannot lock forever."""
    django_q_cluster.Value = patient_value


def bound_cluster_stop(grace: Callable[[], float]) -> None:
    """Make a SIGTERM to `qcluster` end its main process, and within a bound.

    django-q2's sentinel takes SIGTERM with the default action (it ignores Ctrl-C's SIGINT). A
    SIGTERM sent to the whole process group (systemd's default) kills the sentinel while it waits
    on the cluster's stop event, and django-q2's `Cluster.stop` then waits forever in
    `stop_event.set()` for the dead waiter to acknowledge it (a multiprocessing Condition counts
    it as a sleeper): the main process hung in futex_do_wait beside its zombie sentinel. So the
    event is set from a thread that is given STOP_ACK_WAIT seconds, and then the sentinel is
    reaped whether it took the event or died; a watchdog ends the process if the stop still
    takes longer than `grace()` + STOP_MARGIN seconds. The workers stop on their own SIGTERM
    (`execution.worker.start_pool`), giving their runs SHUTDOWN_GRACE.
    """
    if getattr(Cluster.stop, "bounded", False):
        return
    original = Cluster.sig_handler

    def stop(self) -> bool:
        # django-q2's Cluster.stop, with the event set where a dead sentinel cannot hang it.
        if not self.sentinel.is_alive():
            return False
        logger.info("queue.cluster_stopping name=%s", self.name)
        setter = threading.Thread(target=self.stop_event.set, name="agenttasks-stop", daemon=True)
        setter.start()
        setter.join(STOP_ACK_WAIT)
        self.sentinel.join()
        self.start_event = self.stop_event = None
        _remove_lock_file(self.sentinel.pid)
        return True

    def sig_handler(self, signum, frame):
        deadline = grace() + STOP_MARGIN
        threading.Thread(
            target=_end_after, args=(deadline,), name="agenttasks-stop-watchdog", daemon=True
        ).start()
        original(self, signum, frame)

    stop.bounded = True  # type: ignore[attr-defined]
    Cluster.stop = stop
    Cluster.sig_handler = sig_handler


def _end_after(seconds: float) -> None:
    threading.Event().wait(seconds)
    logger.warning("queue.stop_overran seconds=%g (ending the cluster's main process)", seconds)
    logging.shutdown()
    os._exit(1)
