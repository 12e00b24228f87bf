"""The django-q2 failures agenttasks patches (agenttasks/compat/django_q.py): each is reproduced
on django-q2 as it ships, then shown not to happen with the patch (docs/operating.md, "django-q2's
failures, and what agenttasks does about them").
"""

import multiprocessing
import os
import queue as stdlib_queue
import signal
import subprocess
import sys
import threading
import time

import pytest
from django.core.checks import run_checks
from django_q.cluster import Cluster
from django_q.queues import Queue

from agenttasks import lifecycle
from agenttasks.compat import django_q
from agenttasks.models import Task

from ..cluster import ROOT
from ..conftest import wait_for
from ..execution.test_in_flight import FAST_LEASES, alive, running, settled, slow_tasks

FORK = multiprocessing.get_context("fork")

# Processes of their own, timed by the clock: outside the parallel part of the suite.
pytestmark = pytest.mark.serial


def test_the_installed_django_q2_has_every_internal_the_patches_need():
    assert django_q.missing() == []
    assert not [m for m in run_checks() if m.id == "agenttasks.E006"]


def test_a_release_without_them_fails_the_start(monkeypatch):
    """A release that renames what a patch needs stops `qcluster` (a system check error)."""
    monkeypatch.delattr(Cluster, "sig_handler")
    (error,) = [m for m in run_checks() if m.id == "agenttasks.E006"]
    assert "Cluster.sig_handler" in error.msg and "1.11.1" in error.hint


# --- a worker killed while it waits for a job -------------------------------------------------


def _wait_for_a_job(jobs, get, ready) -> None:
    ready.set()
    get()


def _killed_while_waiting(jobs: Queue, get) -> None:
    """Start a reader that waits on `jobs` with `get`, and SIGKILL it while it waits."""
    ready = FORK.Event()
    reader = FORK.Process(target=_wait_for_a_job, args=(jobs, get, ready))
    reader.start()
    assert ready.wait(10)
    time.sleep(0.2)  # into the wait itself
    os.kill(reader.pid, signal.SIGKILL)
    reader.join(10)


def test_as_shipped_a_reader_killed_while_it_waits_takes_the_queue_with_it():
    jobs = Queue()
    _killed_while_waiting(jobs, jobs.get)
    jobs.put("a job")
    with pytest.raises(stdlib_queue.Empty):  # the job is there; nobody can read it again
        jobs.get(timeout=2)


def test_with_the_guard_the_next_reader_gets_the_job():
    jobs = Queue()
    guarded = django_q.guarded_get(jobs, os.getpid())
    _killed_while_waiting(jobs, guarded)
    jobs.put("a job")
    assert guarded() == "a job"


def _take_a_length(jobs: Queue) -> None:
    """Read a job's length from `jobs` and no more: what a reader killed mid-read leaves."""
    wait_for(lambda: jobs._reader.poll(0), message="the job in the pipe")
    assert len(os.read(jobs._reader.fileno(), 4)) == 4


def test_as_shipped_a_reader_killed_between_a_jobs_length_and_its_pickle_breaks_the_next():
    jobs = Queue()
    jobs.put("a job cut short")
    _take_a_length(jobs)
    jobs.put("the next job")
    with pytest.raises(EOFError):  # its pickle's first bytes, read as a length, are negative
        jobs.get(timeout=2)


def test_with_the_guard_the_next_reader_discards_what_is_left_and_gets_the_next_job(caplog):
    jobs = Queue(maxsize=1)
    guarded = django_q.guarded_get(jobs, os.getppid())  # read in a thread: our parent is its own
    jobs.put("a job cut short")
    _take_a_length(jobs)
    got: list = []
    reader = threading.Thread(target=lambda: got.append(guarded()), daemon=True)
    reader.start()
    wait_for(lambda: "queue.realigned" in caplog.text, timeout=10, message="the rest discarded")
    # The bound's one slot, which the job cut short held, came back with the discard.
    jobs.put("the next job", timeout=5)
    reader.join(10)
    assert got == ["the next job"]


@pytest.mark.django_db(transaction=True)
def test_a_cluster_whose_waiting_worker_was_killed_still_runs_jobs(start_cluster, user):
    cluster = start_cluster(workers=2, MAX_ACTIVE_TASKS_PER_USER=0)
    for round_ in range(3):  # every worker waits for a job: kill one, then another
        (pid, *_) = cluster.worker_pids()
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda p=pid: not alive(p), timeout=20, message="the worker gone")
        task = lifecycle.create(owner=user, agent_id="echo", input=f"after kill {round_}")
        wait_for(lambda t=task: settled([t]), timeout=20, message="a task after the kill")
        assert Task.objects.get(pk=task.id).status == "completed"


@pytest.mark.django_db(transaction=True)
def test_a_worker_whose_sentinel_died_finishes_its_runs_and_stops(start_cluster, user):
    """A worker left without its sentinel (killed, or dead mid-stop after starting a worker)
    gets no job and no stop again: it stopped nothing and served the database for good."""
    cluster = start_cluster(workers=1, SHUTDOWN_GRACE=20, MAX_ACTIVE_TASKS_PER_USER=0)
    (task,) = slow_tasks(user, 1, 2)
    wait_for(lambda: running([task]) == 1, timeout=20, message="the task running")
    (pid,) = cluster.started_worker_pids()
    with open(f"/proc/{pid}/stat") as stat:
        sentinel = int(stat.read().rsplit(")", 1)[1].split()[1])
    os.kill(sentinel, signal.SIGKILL)
    wait_for(lambda: not alive(pid), timeout=20, message="the orphaned worker gone")
    assert Task.objects.get(pk=task.id).status == "completed"
    assert "queue.sentinel_gone" in cluster.log()


def test_the_lock_files_of_gone_sentinels_are_removed(tmp_path, monkeypatch):
    monkeypatch.setattr(django_q.tempfile, "gettempdir", lambda: str(tmp_path))
    gone = FORK.Process(target=lambda: None)
    gone.start()
    gone.join()
    for pid in (gone.pid, os.getpid()):
        (tmp_path / django_q.LOCK_FILES.format(sentinel=pid)).touch()
    django_q.remove_stale_lock_files()
    assert [p.name for p in tmp_path.iterdir()] == [f"agenttasks-queue-{os.getpid()}.lock"]


# --- a worker killed while it holds its timer's lock ------------------------------------------


def _hold(lock, holding) -> None:
    lock.acquire()
    holding.set()
    time.sleep(60)


def _killed_holding(timer) -> None:
    holding = FORK.Event()
    holder = FORK.Process(target=_hold, args=(timer.get_lock(), holding))
    holder.start()
    assert holding.wait(10)
    os.kill(holder.pid, signal.SIGKILL)
    holder.join(10)


def test_as_shipped_a_timer_lock_whose_holder_was_killed_is_never_free_again():
    """django-q2's guard reads every timer under its lock, with no timeout: it waits forever."""
    timer = multiprocessing.Value("f", -1)
    _killed_holding(timer)
    assert not timer.get_lock().acquire(timeout=2)


def test_with_the_patient_lock_the_guard_goes_on(monkeypatch):
    monkeypatch.setattr(django_q, "LOCK_PATIENCE", 1.0)
    timer = django_q.patient_value("f", -1)
    _killed_holding(timer)
    begun = time.monotonic()
    with timer.get_lock():  # what the guard does
        value = timer.value
    assert value == -1 and time.monotonic() - begun < 5


# --- a SIGTERM to the whole process group -----------------------------------------------------


def _ready(process: subprocess.Popen, marker: str, timeout: float) -> list[str]:
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        lines.append(line)
        if marker in line:
            return lines
    raise AssertionError("the cluster did not start:\n" + "".join(lines))


def _waiting(pid: int) -> bool:
    with open(f"/proc/{pid}/wchan") as wchan:
        return wchan.read().startswith("futex")


def test_as_shipped_a_sentinel_killed_by_the_stop_signal_hangs_the_stop(tmp_path):
    """A SIGTERM to the whole group reaches the sentinel and the main process at once; when the
    main process starts the stop before the sentinel has died, it waits forever for the dead
    sentinel to take the stop event. Made deterministic: the sentinel is held still while the
    main process starts the stop, then dies of the same signal."""
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.compat.bare_settings",
        "BARE_DATABASE": str(tmp_path / "bare.sqlite3"),
    }
    subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, env=env, check=True)
    cluster = subprocess.Popen(
        [sys.executable, "manage.py", "qcluster"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        _ready(cluster, "running", 30)
        (sentinel,) = map(
            int, open(f"/proc/{cluster.pid}/task/{cluster.pid}/children").read().split()
        )
        wait_for(lambda: _waiting(sentinel), timeout=10, message="the sentinel waiting")
        os.kill(sentinel, signal.SIGSTOP)
        os.kill(cluster.pid, signal.SIGTERM)
        wait_for(lambda: _waiting(cluster.pid), timeout=10, message="the stop under way")
        os.kill(sentinel, signal.SIGTERM)
        os.kill(sentinel, signal.SIGCONT)
        wait_for(lambda: not alive(sentinel), timeout=10, message="the sentinel dead")
        with pytest.raises(subprocess.TimeoutExpired):  # it would wait forever
            cluster.wait(8)
    finally:
        os.killpg(cluster.pid, signal.SIGKILL)
        cluster.wait(10)


@pytest.mark.django_db(transaction=True)
def test_with_the_bound_a_sigterm_to_the_process_group_ends_the_cluster(start_cluster, user):
    """The runs cut short are left to their leases."""
    values = {**FAST_LEASES, "SHUTDOWN_GRACE": 2, "MAX_ACTIVE_TASKS_PER_USER": 0}
    cluster = start_cluster(workers=2, **values)
    slow = slow_tasks(user, 4, 60)
    wait_for(lambda: running(slow) == 4, timeout=20, message="all running")
    began = time.monotonic()
    os.killpg(cluster.process.pid, signal.SIGTERM)
    cluster.process.wait(2 + django_q.STOP_MARGIN + 10)
    # Well before the watchdog (2 + 15 s): the stop does not hang at all.
    assert time.monotonic() - began < 2 + 5, cluster.log()[-2000:]
    assert "queue.stop_overran" not in cluster.log()
    for task in slow:
        lifecycle.cancel(task.id)
