"""Many runs in flight per worker process (docs/architecture.md#in-flight-runs).

Real clusters on the test database, the fake model over HTTP on loopback, real threads for the
claim races. A worker process holds up to WORKER_SLOTS runs, one per slot; the job of a run
returns at once; the claim of several runs is one statement; the model client is one per
process; stops, leases, recycling, graceful stops and django-q2's timeout keep their rules.
"""

import os
import signal
import threading
import time
from collections import Counter
from datetime import timedelta

import pytest
from django.db import connection, models
from django.test.utils import override_settings
from django.utils import timezone

from agenttasks import lifecycle, store
from agenttasks.broker import deltas, queue
from agenttasks.execution import worker
from agenttasks.models import Event, PendingAction, ReaperPass, Run, Task, WorkerProcess
from agenttasks.operations import health, metrics
from agenttasks.runtime import model_client
from agenttasks.runtime.model_client import model_io
from agenttasks.store.endings import ORPHAN_TEXT
from agenttasks.types import NewTask

from ..cluster import run_jobs
from ..conftest import on_postgres, run_threads, wait_for
from ..fake_model import answer, hold, stream_answer

pytest_plugins = ["tests.fake_model"]
pytestmark = pytest.mark.django_db(transaction=True)

CHAT = {"chatter": {"runtime": "chat", "model": "m-chat", "stream": False}}
TERMINAL = ("completed", "failed", "cancelled")
FAST_LEASES = {"HEARTBEAT_INTERVAL": 1, "LEASE_TIMEOUT": 3, "REAP_INTERVAL": 1}


def after(seconds: float, text: str = "done"):
    """A script that answers every request after `seconds`."""

    def script(request):
        time.sleep(seconds)
        return answer(text)

    return script


def chat_tasks(user, n: int, **fields) -> list[Task]:
    return [
        lifecycle.create(owner=user, agent_id="chatter", input=f"question {i}", **fields)
        for i in range(n)
    ]


def slow_tasks(user, n: int, seconds: float, **fields) -> list[Task]:
    return [
        lifecycle.create(
            owner=user, agent_id="slow", input=f"nap {i}", metadata={"seconds": seconds}, **fields
        )
        for i in range(n)
    ]


def settled(tasks) -> bool:
    return Task.objects.filter(pk__in=[t.id for t in tasks], status__in=TERMINAL).count() == len(
        tasks
    )


def running(tasks) -> int:
    return Task.objects.filter(pk__in=[t.id for t in tasks], status="running").count()


def endings(task_id: str) -> int:
    """How many times the task's own log says it ended."""
    return Event.objects.filter(
        task_id=task_id, type="task.status", data__to__in=TERMINAL, conversation__task__id=task_id
    ).count()


# --- many runs in flight -----------------------------------------------------------------------


@pytest.mark.postgres
def test_300_tasks_on_2_workers_all_complete_with_both_processes_full(start_cluster, model, user):
    model.set(AGENTS=CHAT, WORKER_SLOTS=100, MAX_ACTIVE_TASKS_PER_USER=0)
    server = model.script(after(1.0))
    start_cluster(workers=2, **model.values)
    tasks = chat_tasks(user, 300)
    wait_for(lambda: settled(tasks), timeout=120, interval=0.2, message="300 chat tasks")
    assert Task.objects.filter(status="completed").count() == 300
    assert server.served["m-chat"] == 300
    # More requests at once than one process has slots: both processes were full together.
    assert server.max_in_flight["m-chat"] > 100, server.max_in_flight


def test_a_process_never_holds_more_runs_than_its_slots(start_cluster, user):
    start_cluster(workers=1, WORKER_SLOTS=2, MAX_ACTIVE_TASKS_PER_USER=0)
    tasks = slow_tasks(user, 6, 0.5)
    most = 0
    deadline = time.monotonic() + 60
    while not settled(tasks):
        most = max(most, running(tasks))
        assert time.monotonic() < deadline, "the six tasks did not settle"
        time.sleep(0.02)
    assert most == 2
    assert Task.objects.filter(status="completed").count() == 6


# --- stops ---------------------------------------------------------------------------------------


@pytest.mark.postgres
def test_now_stops_10_of_50_in_flight_abort_their_requests_and_no_other(start_cluster, model, user):
    model.set(AGENTS=CHAT, WORKER_SLOTS=50, MAX_ACTIVE_TASKS_PER_USER=0, **FAST_LEASES)
    released = threading.Event()
    server = model.script(
        lambda r: hold(
            lambda request: released.is_set() or request.disconnected(),
            deadline=60,
            then=answer("done"),
        )
    )
    start_cluster(workers=1, **model.values)
    tasks = chat_tasks(user, 50)
    wait_for(lambda: len(server.of("m-chat")) == 50, timeout=60, message="50 requests in flight")
    stopped = tasks[:10]
    for task in stopped:
        lifecycle.stop(task.id)
    wait_for(
        lambda: all(r.disconnected() for r in server.requests if _asked_by(r, stopped)),
        timeout=10,
        message="the stopped runs' requests aborted",
    )
    assert not any(r.disconnected() for r in server.requests if not _asked_by(r, stopped))
    released.set()
    wait_for(lambda: settled(tasks), timeout=30, message="every task settled")
    statuses = Counter(Task.objects.filter(pk__in=[t.id for t in tasks]).values_list("status"))
    assert statuses == {("cancelled",): 10, ("completed",): 40}
    assert {t.id for t in Task.objects.filter(status="cancelled")} == {t.id for t in stopped}


def _listening(cluster, channel: str) -> bool:
    """Whether one of the cluster's sessions last said LISTEN `channel`."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE application_name = ANY(%s) AND query LIKE %s",
            [cluster.listener_names(), f"%LISTEN {channel}%"],
        )
        return cursor.fetchone()[0] > 0


def _asked_by(request, tasks) -> bool:
    return request.first_user in {t.input for t in tasks}


# --- runs handed to listening workers, without a job each ----------------------------------------


def workers_alive() -> bool:
    queue.forget_listeners()
    return queue.workers_listen()


@pytest.mark.postgres
def test_while_workers_listen_a_new_run_is_a_notification_not_a_job(start_cluster, user):
    """django-q2's cost of a job is not paid per run: the create notifies agenttasks_runs."""
    start_cluster(workers=2, **FAST_LEASES, MAX_ACTIVE_TASKS_PER_USER=0)
    wait_for(workers_alive, timeout=20, message="the workers' heartbeats")
    with override_settings(AGENTTASKS={"MAX_ACTIVE_TASKS_PER_USER": 0}):
        tasks = [lifecycle.create(owner=user, agent_id="echo", input=f"hi {i}") for i in range(50)]
        retried = lifecycle.create(owner=user, agent_id="boom", input="fails")
    assert run_jobs() == 0  # no job was written, with the task or after it
    wait_for(lambda: settled([*tasks, retried]), timeout=30, message="every task ends")
    assert Task.objects.filter(pk__in=[t.id for t in tasks], status="completed").count() == 50
    lifecycle.retry(retried.id)  # a launch after the create: a notification too
    wait_for(lambda: Task.objects.get(pk=retried.id).attempt == 2 and settled([retried]))
    assert run_jobs() == 0


@pytest.mark.postgres
def test_a_worker_whose_listener_reconnects_claims_what_was_queued_meanwhile(start_cluster, user):
    cluster = start_cluster(workers=1, **FAST_LEASES, MAX_ACTIVE_TASKS_PER_USER=0)
    wait_for(workers_alive, timeout=20, message="the worker's heartbeat")
    wait_for(lambda: _listening(cluster, queue.RUNS_CHANNEL), message="the worker listening")
    with connection.cursor() as cursor:  # the listener's session dies (a network blip, say)
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE application_name = ANY(%s) AND query LIKE %s",
            [cluster.listener_names(), f"%LISTEN {queue.RUNS_CHANNEL}%"],
        )
    task = lifecycle.create(owner=user, agent_id="echo", input="while it was deaf")
    assert run_jobs() == 0
    wait_for(lambda: settled([task]), timeout=20, message="the run claimed after the reconnect")


@pytest.mark.postgres
def test_with_no_worker_alive_a_new_run_gets_its_job(start_cluster, user):
    values = {**FAST_LEASES, "SHUTDOWN_GRACE": 1, "MAX_ACTIVE_TASKS_PER_USER": 0}
    cluster = start_cluster(workers=1, **values)
    wait_for(workers_alive, timeout=20, message="the worker's heartbeat")
    cluster.process.send_signal(signal.SIGTERM)  # a graceful stop removes its row first
    cluster.process.wait(20)
    assert not workers_alive()
    with override_settings(AGENTTASKS=values):
        task = lifecycle.create(owner=user, agent_id="echo", input="nobody listens")
    assert run_jobs() == 1  # the job waits for the next cluster
    start_cluster(workers=1, **values)
    wait_for(lambda: settled([task]), timeout=20, message="the next cluster runs it")


# --- leases, SIGKILL, graceful stops, recycling, django-q2's timeout ------------------------------


@pytest.mark.postgres
def test_sigkill_of_a_worker_with_runs_in_flight_loses_nothing(start_cluster, user, receiver):
    values = {
        **FAST_LEASES,
        "WORKER_SLOTS": 30,
        "MAX_ACTIVE_TASKS_PER_USER": 0,
        "CALLBACK_ALLOWED_HOSTS": ["127.0.0.1"],
    }
    with override_settings(AGENTTASKS=values):
        cluster = start_cluster(workers=2, **values)
        tasks = slow_tasks(user, 50, 6, callback_url=receiver.url)
        wait_for(lambda: running(tasks) == 50, timeout=30, message="50 runs in flight")
        by_worker = Counter(
            Run.objects.filter(task__in=[t.id for t in tasks]).values_list("worker", flat=True)
        )
        assert len(by_worker) == 2, by_worker  # both processes hold runs
        victim, held = by_worker.most_common(1)[0]
        os.kill(int(victim.rsplit(":", 1)[1]), signal.SIGKILL)
        wait_for(lambda: settled(tasks), timeout=60, interval=0.2, message="every task ended")
        killed = Task.objects.filter(run__worker=victim)
        assert killed.count() == held
        assert set(killed.values_list("status", "error")) == {("failed", ORPHAN_TEXT)}
        survivors = Task.objects.filter(pk__in=[t.id for t in tasks]).exclude(run__worker=victim)
        assert set(survivors.values_list("status", flat=True)) == {"completed"}
        assert all(endings(t.id) == 1 for t in tasks)
        wait_for(lambda: len(receiver.bodies()) >= 50, timeout=20, message="50 callbacks")
        # Each ending's callback was claimed once (callback_version), so none can follow. A
        # receipt comes before its settling write: wait for that.
        unsettled = Task.objects.filter(pk__in=[t.id for t in tasks]).exclude(
            callback_version=models.F("version")
        )
        wait_for(lambda: not unsettled.exists(), message="every callback settled")
        sent = Counter(body["taskId"] for body in receiver.bodies())
        assert set(sent) == {t.id for t in tasks} and set(sent.values()) == {1}
        assert len(cluster.started_worker_pids()) == 3  # django-q2 replaced the killed one


@pytest.mark.postgres
def test_graceful_stop_claims_nothing_more_and_gives_runs_their_grace(start_cluster, user):
    values = {**FAST_LEASES, "SHUTDOWN_GRACE": 3, "MAX_ACTIVE_TASKS_PER_USER": 0}
    with override_settings(AGENTTASKS=values):
        cluster = start_cluster(workers=1, **values)
        (quick,) = slow_tasks(user, 1, 1.5)
        (long,) = slow_tasks(user, 1, 60)
        wait_for(lambda: running([quick, long]) == 2, timeout=20, message="both running")
        began = time.monotonic()
        cluster.process.send_signal(signal.SIGTERM)
        cluster.process.wait(20)
        assert time.monotonic() - began < 3 + 5
        late = lifecycle.create(owner=user, agent_id="echo", input="after the stop")
        assert Task.objects.get(pk=quick.id).status == "completed"  # within its grace
        assert Task.objects.get(pk=long.id).status == "running"  # left to its lease
        assert Task.objects.get(pk=late.id).status == "pending"
        # The lease expires; the next cluster's reaper recovers the run that was cut short.
        start_cluster(workers=1, **values)
        wait_for(
            lambda: Task.objects.get(pk=long.id).status == "failed", timeout=20, message="recovery"
        )
        assert Task.objects.get(pk=long.id).error == ORPHAN_TEXT
        assert endings(long.id) == 1
        wait_for(lambda: Task.objects.get(pk=late.id).status == "completed", timeout=20)


def alive(pid: int) -> bool:
    """Whether a process runs (a zombie nobody reaps has ended)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_recycled_worker_finishes_the_runs_it_holds(start_cluster, user):
    cluster = start_cluster(
        workers=1, env={"Q_RECYCLE": "2"}, WORKER_SLOTS=4, MAX_ACTIVE_TASKS_PER_USER=0
    )
    tasks = slow_tasks(user, 4, 2)
    wait_for(lambda: settled(tasks), timeout=60, interval=0.1, message="the four tasks")
    assert set(
        Task.objects.filter(pk__in=[t.id for t in tasks]).values_list("status", flat=True)
    ) == {"completed"}
    wait_for(lambda: len(cluster.started_worker_pids()) >= 2, message="the recycled worker's heir")


def test_django_q2_timeout_does_not_cut_a_run_in_a_slot(start_cluster, user):
    cluster = start_cluster(workers=1, env={"Q_TIMEOUT": "2"}, MAX_ACTIVE_TASKS_PER_USER=0)
    (task,) = slow_tasks(user, 1, 4)
    wait_for(lambda: settled([task]), timeout=30, message="the four-second task")
    ended = Task.objects.get(pk=task.id)
    assert ended.status == "completed", ended.error
    assert len(cluster.started_worker_pids()) == 1  # nothing was killed


# --- other work is not starved -------------------------------------------------------------------


@pytest.mark.postgres
def test_a_saturated_cluster_still_reaps_and_delivers_callbacks(start_cluster, user, receiver):
    values = {
        **FAST_LEASES,
        "WORKER_SLOTS": 3,
        "MAX_ACTIVE_TASKS_PER_USER": 0,
        "CALLBACK_ALLOWED_HOSTS": ["127.0.0.1"],
    }
    with override_settings(AGENTTASKS=values):
        start_cluster(workers=2, **values)
        busy = slow_tasks(user, 10, 30, callback_url=receiver.url)
        wait_for(lambda: running(busy) == 6, timeout=20, message="every slot busy")
        assert Task.objects.filter(pk__in=[t.id for t in busy], status="pending").count() == 4
        wait_for(
            lambda: health.check(details=True)[1].get("saturated"),
            timeout=10,
            message="health saying every slot is busy",
        )
        # The reaper runs: it fails an orphan (its worker long gone) and records its pass.
        orphan = store.create_task(NewTask(owner=user, agent="echo", input="orphan"))
        store.claim(orphan.run_id, "gone:1")
        Run.objects.filter(pk=orphan.run_id).update(
            heartbeat_at=timezone.now() - timedelta(minutes=5)
        )
        # The row of the first pass is written as the pass ends, which may be after this.
        wait_for(ReaperPass.objects.exists, timeout=10, message="a first pass")
        passed = ReaperPass.objects.get().finished_at
        wait_for(lambda: Task.objects.get(pk=orphan.id).status == "failed", timeout=10)
        wait_for(lambda: ReaperPass.objects.get().finished_at > passed, message="another pass")
        # Callbacks go out: stopping a running task sends its callback while the slots are full.
        lifecycle.stop(busy[0].id)
        wait_for(lambda: receiver.bodies(), timeout=10, message="the callback")
        assert receiver.bodies()[0]["taskId"] == busy[0].id
        # The freed slot takes a queued run (the callback's job may be delivered before that).
        wait_for(lambda: running(busy) == 6, timeout=10, message="the freed slot taken")


# --- the claim of several runs -------------------------------------------------------------------


def _claim_seven(i: int) -> list[str]:
    return [run.id for run in store.claim_many(f"host:{i}", 7).runs]


@pytest.mark.postgres
def test_eight_threads_claiming_at_once_claim_every_run_once(user):
    for _ in range(20):
        tasks = [store.create_task(NewTask(owner=user, agent="echo", input="x")) for _ in range(40)]
        results = run_threads(_claim_seven, 8)  # some pass over what others hold
        assert not [r for r in results if isinstance(r, BaseException)], results
        claimed = [run_id for got in results for run_id in got]
        assert sorted(claimed) == sorted(t.run_id for t in tasks)
        assert set(Run.objects.filter(pk__in=claimed).values_list("status", flat=True)) == {
            "running"
        }
        for task in tasks:
            statuses = Event.objects.filter(task_id=task.id, type="task.status")
            assert [e.data["to"] for e in statuses] == ["pending", "running"]  # claimed once
        Task.objects.filter(pk__in=[t.id for t in tasks]).update(status="completed")
        Run.objects.filter(pk__in=claimed).update(status="completed")


def test_a_claim_of_several_takes_the_named_runs_first_then_the_oldest(user):
    tasks = [store.create_task(NewTask(owner=user, agent="echo", input=f"{i}")) for i in range(5)]
    claimed = store.claim_many("host:1", 3, first=[tasks[4].run_id]).runs
    assert [run.id for run in claimed] == [tasks[4].run_id, tasks[0].run_id, tasks[1].run_id]
    for run in claimed:
        assert (run.status, run.worker, run.task.status) == ("running", "host:1", "running")
    assert len(store.claim_many("host:2", 10).runs) == 2
    assert store.claim_many("host:3", 10).runs == []


def test_a_claim_of_several_leaves_delegate_children_to_their_callers(user, parent_run):
    child = store.create_task(
        NewTask(
            owner=user,
            agent="echo",
            input="inline",
            kind="delegate",
            parent_conversation_id=parent_run.conversation_id,
            parent_run_id=parent_run.id,
            delegation_key="k",
        )
    )
    assert store.claim_many("host:1", 5).runs == []
    (run,) = store.claim_many("host:1", 5, first=[child.run_id]).runs  # its job named it
    assert run.id == child.run_id


# --- the process's shared parts ------------------------------------------------------------------


def test_one_model_client_per_process_with_a_bounded_pool():
    with override_settings(AGENTTASKS={"MODEL_MAX_CONNECTIONS": 7}):
        import agenttasks.runtime.model_client as client

        client._io = None
        io = model_io()
        assert model_io() is io
        (pool,) = (c._transport._pool for c in io.clients)
        assert (pool._max_connections, pool._max_keepalive_connections) == (7, 7)
        client._io = None


def test_a_processs_connections_are_split_among_small_pools():
    # httpcore's pool is quadratic in its idle connections: 500 in one pool starved the loop.
    io = model_client._ModelIO(max_connections=500)
    pools = [c._transport._pool for c in io.clients]
    assert sum(p._max_connections for p in pools) == 500
    assert max(p._max_connections for p in pools) <= model_client.POOL_SIZE
    assert all(p._max_keepalive_connections == p._max_connections for p in pools)


def test_slots_and_runs_in_flight_in_metrics_and_health():
    now = timezone.now()
    WorkerProcess.objects.create(
        id="n1:10", node="n1", slots=4, busy=4, started_at=now, seen_at=now
    )
    WorkerProcess.objects.create(
        id="n2:11", node="n2", slots=4, busy=1, started_at=now, seen_at=now
    )
    WorkerProcess.objects.create(  # not heard from within LEASE_TIMEOUT: a dead process
        id="n3:12", node="n3", slots=9, busy=9, started_at=now, seen_at=now - timedelta(hours=1)
    )
    with override_settings(AGENTTASKS={"METRICS_ENABLED": True}):
        text = metrics.exposition()[0].decode()
    assert 'agenttasks_worker_slots{node="n1"} 4.0' in text
    assert 'agenttasks_runs_in_flight{node="n1"} 4.0' in text
    assert 'agenttasks_worker_slots_free{node="n2"} 3.0' in text
    assert 'node="n3"' not in text
    _, body = health.check(details=True)
    assert body["details"]["workers"] == {
        "processes": 2,
        "slots": 8,
        "inFlight": 5,
        "freeSlots": 3,
    }
    assert "saturated" not in body
    WorkerProcess.objects.filter(pk="n2:11").update(busy=4)
    assert health.check(details=False)[1]["saturated"] == (
        "every worker slot is busy (8 runs in flight in 8 slots)"
    )


def test_a_delta_nobody_follows_costs_nothing():
    deltas.stop()
    deltas.publish("conv_nobody", "run_x", "a piece")
    assert deltas._sender is None  # no sender, no connection, no statement


@pytest.mark.postgres
def test_a_worker_hears_which_conversations_other_processes_follow():
    deltas.watch_followers()
    wait_for(lambda: deltas.FOLLOW_CHANNEL in deltas.hub.listening, message="LISTEN follow")
    assert not deltas.followed("conv_elsewhere")
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_notify(%s, %s)", [deltas.FOLLOW_CHANNEL, "conv_elsewhere"])
    wait_for(lambda: deltas.followed("conv_elsewhere"), message="the follow announcement")


def test_execute_run_outside_a_worker_process_runs_in_the_calling_thread(user):
    task = lifecycle.create(owner=user, agent_id="echo", input="here")
    assert worker._pool is None or worker._pool.pid != os.getpid()
    worker.execute_run(task.run_id)
    assert Task.objects.get(pk=task.id).status == "completed"


def test_sqlite_defaults_to_a_few_slots_and_postgresql_to_many():
    expected = worker.POSTGRES_SLOTS if on_postgres() else worker.SQLITE_SLOTS
    with override_settings(AGENTTASKS={}):
        assert worker.slots_per_process() == expected
    with override_settings(AGENTTASKS={"WORKER_SLOTS": 12}):
        assert worker.slots_per_process() == 12


def test_a_run_that_pauses_for_a_person_frees_its_slot(start_cluster, user):
    start_cluster(workers=1, WORKER_SLOTS=1, MAX_ACTIVE_TASKS_PER_USER=0)
    paused = lifecycle.create(owner=user, agent_id="approver", input="prod")
    wait_for(
        lambda: Task.objects.get(pk=paused.id).status == "waiting_for_input",
        timeout=20,
        message="the approval",
    )
    after = lifecycle.create(owner=user, agent_id="echo", input="next")  # the one slot is free
    wait_for(lambda: settled([after]), timeout=20, message="the next task")
    action = PendingAction.objects.get(task_id=paused.id)
    lifecycle.resolve_action(action.id, {"approved": True})
    wait_for(lambda: settled([paused]), timeout=20, message="the approved task")
    assert Task.objects.get(pk=paused.id).status == "completed"


def test_the_worker_check_asks_for_a_pool_on_postgresql(monkeypatch):
    from agenttasks.checks import check_worker_connections

    options = connection.settings_dict.setdefault("OPTIONS", {})
    monkeypatch.setitem(connection.settings_dict, "OPTIONS", {**options})
    connection.settings_dict["OPTIONS"].pop("pool", None)
    with override_settings(AGENTTASKS={"WORKER_SLOTS": 50}):
        warned = [m.id for m in check_worker_connections()]
        assert warned == (["agenttasks.W010"] if on_postgres() else [])
        connection.settings_dict["OPTIONS"]["pool"] = {"max_size": 10}
        assert check_worker_connections() == []
    connection.settings_dict["OPTIONS"].pop("pool")
    with override_settings(AGENTTASKS={"WORKER_SLOTS": 1}):
        assert check_worker_connections() == []


@pytest.mark.postgres
def test_a_reader_in_another_process_gets_every_piece_coalesced(start_cluster, model, user):
    model.set(AGENTS={"writer": {"runtime": "chat", "model": "m-writer"}}, **FAST_LEASES)
    pieces = [f"w{i} " for i in range(40)]
    model.script(lambda r: stream_answer(pieces, gap=0.05))  # two seconds of pieces
    cluster = start_cluster(workers=1, **model.values)
    wait_for(lambda: _listening(cluster, deltas.FOLLOW_CHANNEL), message="the worker listening")
    conversation = lifecycle.create_conversation(owner=user, agent_id="writer")
    got: list[tuple[str, str]] = []

    def reader(run_id, piece):
        got.append((run_id, piece))

    deltas.subscribe(conversation.id, reader)
    try:
        wait_for(
            lambda: deltas.hub.announced(deltas.FOLLOW_CHANNEL, conversation.id),
            message="the follow announcement",
        )
        lifecycle.post_message(conversation.id, "write")
        reply = wait_for(
            lambda: Event.objects.filter(
                conversation_id=conversation.id, type="message.assistant"
            ).first(),
            timeout=20,
            message="the stored reply",
        )
        # The last pieces are flushed as the reply ends: their notification may come just after
        # the stored reply is seen.
        wait_for(
            lambda: "".join(piece for _, piece in got) == "".join(pieces),
            timeout=10,
            message="every piece",
        )
    finally:
        deltas.unsubscribe(conversation.id, reader)
    assert {run_id for run_id, _ in got} == {reply.run_id}
    # Coalesced: at most four a second over the two seconds, and the rest at the reply's end.
    assert len(got) <= 2 * 4 + 2, len(got)
