"""Shared fixtures: the recording queue, users, the P/R harness of docs/lifecycle.md's scenarios, signals."""

import json
import os
import signal
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
from django.db import connection

from agenttasks import registry, signals
from agenttasks.broker import queue
from agenttasks.runtime.base import Reply

from .factories import ConversationFactory, RunFactory, UserFactory

# What runs where (docs/contributing: "The suite"). Every test runs once, on SQLite, unless it
# needs PostgreSQL (`postgres`); on PostgreSQL run those and the tests of what behaves otherwise
# there (`both`): the store's SQL path, the workers' notifications and claims, the endings' SQL and
# triggers, the deliveries and wake-ups they owe, metrics kept by triggers. The differential test
# (tests/store/test_differential.py) proves the two store paths give the same answers and rows,
# so the surfaces above the store run once. AGENTTASKS_EVERY_TEST=1 runs everything on both.
BOTH_FOLDERS = {"store", "execution", "chaos", "lifecycle", "delivery", "operations", "flow"}


def _flush_retried_on_deadlock():
    """Retry a test's closing flush that PostgreSQL chose as a deadlock's victim.

    TRUNCATE locks the tables one after another; a live server's stream that the client left
    (it notices at its next write) may still run one statement over two of them, in another
    order. The flush's locks are then released and it is tried again, as the other side ends.
    """
    from django.test import TransactionTestCase

    teardown = TransactionTestCase._fixture_teardown

    def deadlocked(exc: BaseException | None) -> bool:
        while exc is not None:
            if "deadlock detected" in str(exc):
                return True
            exc = exc.__cause__ or exc.__context__
        return False

    def retried(self):
        for attempt in range(3):
            try:
                return teardown(self)
            except Exception as exc:
                if attempt == 2 or not deadlocked(exc):
                    raise
                time.sleep(0.2)

    TransactionTestCase._fixture_teardown = retried


_flush_retried_on_deadlock()

# Real clusters are timing-sensitive (leases of seconds): they run after the parallel part, one
# test at a time, as do the modules marked `serial` (browsers, the demo, bare django-q2 clusters).
SERIAL_FIXTURES = {"start_cluster"}


@pytest.hookimpl(tryfirst=True)  # before `-m` reads the markers added here
def pytest_collection_modifyitems(config, items):
    from django.conf import settings

    postgres = settings.DATABASES["default"]["ENGINE"].endswith("postgresql")
    every = bool(os.environ.get("AGENTTASKS_EVERY_TEST"))
    chaos = bool(os.environ.get("AGENTTASKS_CHAOS"))
    kept, deselected = [], []
    for item in items:
        folder = item.path.parent.name
        if folder in BOTH_FOLDERS:
            item.add_marker(pytest.mark.both)
        if SERIAL_FIXTURES & set(getattr(item, "fixturenames", ())) or folder == "chaos":
            item.add_marker(pytest.mark.serial)
        if "chaos" in item.keywords and not chaos:
            # The chaos suite kills workers and restarts PostgreSQL: `make test` turns it on.
            item.add_marker(pytest.mark.skip(reason="chaos suite: set AGENTTASKS_CHAOS=1"))
        if postgres:
            wanted = every or "postgres" in item.keywords or "both" in item.keywords
        else:
            wanted = "postgres" not in item.keywords
        (kept if wanted else deselected).append(item)
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = kept


# Every process a test starts inherits this (its children too), so the ones left behind can be found.
os.environ["AGENTTASKS_TEST_PROCESS"] = str(os.getpid())


def left_behind() -> list[int]:
    """Return the processes this test process started (at any depth) that still live."""
    mark = f"AGENTTASKS_TEST_PROCESS={os.getpid()}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes()
        except OSError:
            continue
        if mark in environ.split(b"\0"):
            found.append(int(entry))
    return found


def end_left_behind() -> list[int]:
    """SIGKILL what `left_behind` finds; return their ids."""
    pids = left_behind()
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return pids


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Keep each phase's report on the test, for the fixtures that clean up after a failure."""
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"report_{report.when}", report)


@pytest.fixture(autouse=True)
def no_process_left_behind(request):
    """A test that fails leaves no process running (its clusters, servers, demos, browsers)."""
    yield
    report = getattr(request.node, "report_call", None)
    if report is not None and report.failed:
        ended = end_left_behind()
        if ended:
            print(f"ended processes the failed test left behind: {ended}")


def pytest_sessionfinish(session, exitstatus):
    """Whatever still runs that a test started ends with the run (xdist's controller runs none)."""
    if getattr(session.config.option, "numprocesses", None) and not hasattr(
        session.config, "workerinput"
    ):
        return
    ended = end_left_behind()
    if ended:
        print(f"\nended processes the tests left behind: {ended}")


def on_postgres() -> bool:
    return connection.vendor == "postgresql"


def wait_for(predicate, timeout=5.0, interval=0.01, message="condition"):
    """Wait until predicate() is truthy, or fail after timeout seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message}")
        time.sleep(interval)


@contextmanager
def served_asgi():
    """Serve the app with uvicorn (ASGI) on a loopback port in a thread; yield its URL.

    Its connections close after each request (PostgreSQL would keep them open, and the test
    database could not be dropped at the end).
    """
    import socket

    import uvicorn
    from django.core.asgi import get_asgi_application
    from django.db import connections

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    settings_dict = connections.settings["default"]
    previous = settings_dict.get("CONN_MAX_AGE", 0)
    settings_dict["CONN_MAX_AGE"] = 0
    config = uvicorn.Config(
        get_asgi_application(), host="127.0.0.1", port=port, log_level="warning", lifespan="off"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    try:
        wait_for(lambda: server.started, message="uvicorn started")
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
        settings_dict["CONN_MAX_AGE"] = previous


@contextmanager
def failing_inserts(table: str):
    """Make every INSERT into `table` fail inside the database (a fault in the middle of a write).

    A trigger, so it strikes the SQL functions of PostgreSQL as well as the ORM path.
    """
    with connection.cursor() as cursor:
        if on_postgres():
            cursor.execute(
                "CREATE OR REPLACE FUNCTION agenttasks_test_fail() RETURNS trigger AS $$ "
                "BEGIN RAISE EXCEPTION 'injected'; END $$ LANGUAGE plpgsql"
            )
            cursor.execute(
                f"CREATE TRIGGER agenttasks_test_fail BEFORE INSERT ON {table} "
                "FOR EACH ROW EXECUTE FUNCTION agenttasks_test_fail()"
            )
        else:
            cursor.execute(
                f"CREATE TRIGGER agenttasks_test_fail BEFORE INSERT ON {table} "
                "BEGIN SELECT RAISE(ABORT, 'injected'); END"
            )
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            suffix = f" ON {table}" if on_postgres() else ""
            cursor.execute(f"DROP TRIGGER agenttasks_test_fail{suffix}")


def run_threads(target, count, *args):
    """Run target(i, *args) in `count` threads started together; return their results in order."""
    barrier = threading.Barrier(count)
    results: list = [None] * count

    def body(i):
        try:
            barrier.wait()
            results[i] = target(i, *args)
        except BaseException as exc:  # noqa: BLE001 (the test inspects it)
            results[i] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=body, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results


def _reply_done(ctx):
    return Reply(content="done")


@pytest.fixture(autouse=True)
def test_agents():
    """Register the harness agents `default` and `worker` (callable)."""
    for agent_id in ("default", "worker"):
        registry.register(agent_id, runtime="callable", handler=_reply_done, replace=True)
    yield
    for agent_id in ("default", "worker"):
        registry.unregister(agent_id)


@pytest.fixture(autouse=True)
def recording_queue():
    """Record enqueued runs instead of executing them."""
    with queue.use_backend(queue.RecordingQueue()) as backend:
        yield backend


@pytest.fixture
def user(db):
    return UserFactory(username="u")


@pytest.fixture
def parent(user):
    """P: a visible conversation of user U with agent `default`."""
    return ConversationFactory(owner=user, agent="default")


@pytest.fixture
def parent_run(parent):
    """R: a running run on P."""
    return RunFactory(conversation=parent, status="running", trigger="message")


class SignalLog:
    def __init__(self):
        self.updated: list = []
        self.finished: list = []
        self.delivered: list = []

    def _updated(self, sender, task=None, **kw):
        self.updated.append(task)

    def _finished(self, sender, snapshot=None, **kw):
        self.finished.append(snapshot)

    def _delivered(self, sender, snapshot=None, **kw):
        self.delivered.append(snapshot)


@pytest.fixture
def signal_log():
    log = SignalLog()
    signals.task_updated.connect(log._updated)
    signals.task_finished.connect(log._finished)
    signals.result_delivered.connect(log._delivered)
    yield log
    signals.task_updated.disconnect(log._updated)
    signals.task_finished.disconnect(log._finished)
    signals.result_delivered.disconnect(log._delivered)


@pytest.fixture(scope="session", autouse=True)
def _release_the_test_database(django_db_setup, django_db_blocker):
    """Close what holds the test database open before it is dropped.

    The PostgreSQL listener, the worker's heartbeat thread and live-server threads keep
    connections (CONN_MAX_AGE) this thread cannot close; they are this run's own.
    """
    yield
    from agenttasks.broker import deltas
    from agenttasks.broker.listen import hub

    hub.stop()
    deltas.stop()
    with django_db_blocker.unblock():
        if connection.vendor != "postgresql":
            return
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        connection.close()


@pytest.fixture
def no_local_wakeups():
    """Turn off in-process wake-ups so a waiter must notice a change by polling."""
    from agenttasks.broker.listen import hub

    hub.enabled = False
    yield
    hub.enabled = True


@pytest.fixture
def real_queue(recording_queue):
    """Send runs and jobs to the real django-q2 broker (instead of recording them)."""
    with queue.use_backend(queue.DjangoQBackend()) as backend:
        yield backend


@pytest.fixture
def start_cluster(transactional_db, real_queue):
    """Start real django-q2 clusters against the test database; all stop after the test."""
    from .cluster import Cluster

    started = []

    def start(workers: int = 2, env: dict | None = None, **settings):
        cluster = Cluster(workers=workers, settings=settings, env=env).start()
        started.append(cluster)
        return cluster

    yield start
    for cluster in started:
        cluster.kill()  # a graceful django-q2 shutdown takes seconds; the test is over anyway
    queue.forget_listeners()  # its worker processes listened for runs; none do any more
    for cluster in started:
        # Shown when the test failed: what the cluster said, without django-q2's job chatter.
        chatter = ("Enqueued", "processing", "Processed", "Callback delivered")
        lines = [line for line in cluster.lines if not any(c in line for c in chatter)]
        print("\n".join(lines[-150:]))


@pytest.fixture(scope="module")
def module_clusters(django_db_setup, django_db_blocker):
    """Clusters a module's tests share (one per worker count and settings), started when first
    asked for and again if a test killed one; all stop after the module."""
    from .cluster import Cluster

    started: dict = {}

    def get(workers: int = 2, **settings):
        key = (workers, json.dumps(settings, sort_keys=True))
        cluster = started.get(key)
        if cluster is None or cluster.process.poll() is not None:
            started[key] = cluster = Cluster(workers=workers, settings=settings).start()
        return cluster

    yield get
    with django_db_blocker.unblock():
        for cluster in started.values():
            cluster.kill()


@pytest.fixture
def shared_cluster(module_clusters, transactional_db, real_queue):
    """Return `get(workers, **settings)`: a cluster of this module's that the test only reads
    through (a cluster's start costs seconds; its runs of one test end before the next starts)."""
    yield module_clusters
    queue.forget_listeners()


@pytest.fixture
def receiver():
    """A callback receiver at http://127.0.0.1:<port>/cb."""
    from .receiver import Receiver

    r = Receiver()
    yield r
    r.close()
