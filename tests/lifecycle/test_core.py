"""Lifecycle core: scenarios 7.1.1–7.1.30 and 7.6.1–7.6.2 (spawn guards) of docs/lifecycle.md.

Every test runs with real commits (`transaction=True`), so after-commit launches, signals and
wake-up delivery happen as they do in production. The helpers mirror the scenarios' harness.
"""

import threading
import time
from contextlib import contextmanager
from datetime import timedelta

import pytest
from django.db import DatabaseError, connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from agenttasks import lifecycle, store
from agenttasks.conf import app_settings
from agenttasks.exceptions import (
    AlreadyFinal,
    DepthLimit,
    LaunchFailed,
    SpawnError,
    TaskLimit,
)
from agenttasks.models import Conversation, Event, PendingAction, Run, Task, Wakeup
from agenttasks.runtime import task_tools as tools_module
from agenttasks.states import TERMINAL, model_status
from agenttasks.types import ActionRequest, NewTask, TaskInfo

from ..conftest import run_threads
from ..harness import fail, finish, row, task_id_of

pytestmark = pytest.mark.django_db(transaction=True)

ORPHAN_TEXT = "The server stopped while the task was running"
APPROVAL = ActionRequest(
    kind="approval", tool_name="deploy", tool_call_id="call-approve", args={"env": "prod"}
)


# --- the scenarios' harness -------------------------------------------------------------------


@pytest.fixture
def spawn(parent, parent_run):
    """spawn() = lifecycle.spawn(P, "worker", "do it", label="job", parent_run=R)."""

    def spawn_() -> TaskInfo:
        return lifecycle.spawn(parent, "worker", "do it", label="job", parent_run=parent_run)

    return spawn_


def start(t) -> Task:
    """A live worker holds the task's current run (fresh heartbeat)."""
    task = row(t)
    assert store.claim(task.run_id, "worker-1"), "the claim should win"
    return row(t)


def expire_lease(t) -> None:
    """Stage a dead worker: move the run's heartbeat past LEASE_TIMEOUT."""
    old = timezone.now() - timedelta(seconds=app_settings.LEASE_TIMEOUT + 5)
    Run.objects.filter(pk=row(t).run_id).update(heartbeat_at=old)


def configure(settings, **values) -> None:
    """Override AGENTTASKS keys for one test (the settings fixture restores them)."""
    settings.AGENTTASKS = {**(getattr(settings, "AGENTTASKS", None) or {}), **values}


def counts() -> dict:
    return {
        "tasks": Task.objects.count(),
        "runs": Run.objects.count(),
        "conversations": Conversation.objects.count(),
        "wakeups": Wakeup.objects.count(),
    }


def for_task(snapshots, t) -> list:
    return [s for s in snapshots if s.id == task_id_of(t)]


@contextmanager
def background(target):
    """Run target() in a thread with its own connection; re-raise its error after joining."""
    errors: list[BaseException] = []

    def body():
        try:
            target()
        except BaseException as exc:  # noqa: BLE001 (re-raised in the test thread)
            errors.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=body)
    thread.start()
    try:
        yield thread
    finally:
        thread.join(30)
    assert not thread.is_alive(), "the background thread did not finish"
    if errors:
        raise errors[0]


@contextmanager
def failing_task_lookup(error: DatabaseError):
    """Make every SELECT of a task by its conversation raise `error` on this connection."""

    def wrapper(execute, sql, params, many, context):
        where = sql.split("WHERE", 1)[1] if "WHERE" in sql else ""
        if (
            sql.lstrip().upper().startswith("SELECT")
            and 'FROM "agenttasks_task"' in sql
            and '"conversation_id"' in where
        ):
            raise error
        return execute(sql, params, many, context)

    with connection.execute_wrapper(wrapper):
        yield


# --- 7.1 lifecycle core ---------------------------------------------------------------------


def test_7_1_1_identity_is_separate_from_execution(spawn, recording_queue):
    info = spawn()
    task = row(info)
    assert info.run_id and info.run_id != info.task_id
    assert task.run_id == info.run_id
    run = Run.objects.get(pk=info.run_id)
    assert run.status == "queued"
    assert run.conversation_id == task.conversation_id and run.task_id == task.id
    assert recording_queue.run_ids == [info.run_id]  # launched after commit


def test_7_1_2_the_tasks_conversation_is_hidden(spawn, parent, user):
    task = row(spawn())
    visible = Conversation.objects.filter(owner=user, hidden=False)
    assert not visible.filter(pk=task.conversation_id).exists()
    assert visible.filter(pk=parent.pk).exists()
    assert Conversation.objects.filter(pk=task.conversation_id).exists()
    assert task.conversation.hidden
    assert task.conversation.parent_id == parent.id
    assert task.conversation.title == "task: job"


def test_7_1_3_depth_is_bounded(spawn, recording_queue):
    task = row(spawn())
    before = counts()
    with pytest.raises(DepthLimit) as raised:
        lifecycle.spawn(task.conversation, "worker", "do it", label="job")
    assert str(raised.value) == "tasks: cannot spawn from a task at depth 1"
    assert raised.value.limit == 1
    assert counts() == before
    assert recording_queue.run_ids == [task.run_id]


def test_7_1_4_depth_limit_is_configurable(spawn, settings):
    configure(settings, MAX_DEPTH=2)
    task = row(spawn())
    child_info = lifecycle.spawn(task.conversation, "worker", "do it", label="job")
    child = row(child_info)
    assert child.depth == 2
    assert child.parent_conversation_id == task.conversation_id
    before = counts()
    with pytest.raises(DepthLimit) as raised:
        lifecycle.spawn(child.conversation, "worker", "do it", label="job")
    assert str(raised.value) == "tasks: cannot spawn from a task at depth 2"
    assert counts() == before


def test_7_1_5_concurrency_is_capped(spawn, settings, recording_queue):
    configure(settings, MAX_CONCURRENT_PER_PARENT=2)
    first, _second = spawn(), spawn()
    before = counts()
    with pytest.raises(TaskLimit) as raised:
        spawn()
    assert raised.value.limit == 2
    assert (
        str(raised.value)
        == "tasks: this conversation already has 2 tasks running; wait for one to finish"
    )
    assert counts() == before
    assert len(recording_queue.run_ids) == 2
    lifecycle.stop(first.task_id)
    third = spawn()
    assert third.status == "pending"
    assert row(third).status == "pending"


def test_delegate_tasks_do_not_count_against_the_per_parent_cap(
    spawn, parent, settings, recording_queue
):
    """The cap bounds a model's background fan-out; a delegate child is its caller's run's
    business, so a live one takes no slot from a spawn or from a retry."""
    configure(settings, MAX_CONCURRENT_PER_PARENT=1)
    delegate = store.create_task(
        NewTask(
            parent_conversation_id=parent.pk,
            owner=parent.owner,
            agent="worker",
            input="inline work",
            kind="delegate",
            delegation_key="k" * 64,
        )
    )
    assert row(delegate).status == "pending"  # live for the whole test
    first = spawn()  # the delegate took no slot
    with pytest.raises(TaskLimit):
        spawn()  # the one slot is taken
    fail(first, "rate limited")
    retried = lifecycle.retry(first.task_id)  # the freed slot, beside the live delegate
    assert (retried.status, retried.attempt) == ("pending", 2)
    assert row(delegate).status == "pending"


def test_7_1_6_an_ending_is_reported_once(spawn, signal_log):
    t = start(spawn())
    run_id = t.run_id
    done = finish(t, "completed", text="all done")
    assert done.status == "completed"
    assert [s.status for s in for_task(signal_log.finished, t)] == ["completed"]
    assert list(Wakeup.objects.values_list("state", "status", "run_id")) == [
        ("pending", "completed", run_id)
    ]
    reported = (len(signal_log.updated), len(signal_log.finished), len(signal_log.delivered))

    again = finish(t, "failed", error="late failure", run_id=run_id)

    assert (again.status, again.summary, again.result, again.error) == (
        "completed",
        "all done",
        "all done",
        "",
    )
    assert again.updated_at == done.updated_at and again.finished_at == done.finished_at
    assert (len(signal_log.updated), len(signal_log.finished), len(signal_log.delivered)) == (
        reported
    )
    assert Wakeup.objects.count() == 1


def test_7_1_7_finalize_is_a_compare_and_set(spawn):
    t = start(spawn())
    run_id = t.run_id
    assert lifecycle.stop(t.id).status == "cancelled"
    late = finish(t, "completed", text="too late", run_id=run_id)
    assert late.status == "cancelled"
    assert late.result != "too late"
    assert late.summary == "stopped"
    assert not Wakeup.objects.exists()


def test_7_1_8_concurrent_finalizers_produce_one_winner(spawn):
    # [concurrent] PostgreSQL row locks decide; on SQLite IMMEDIATE transactions serialize them.
    t = start(spawn())

    def finalize(i):
        status = "completed" if i % 2 == 0 else "failed"
        return bool(store.finalize(t.id, t.run_id, status, summary="r", result="r"))

    results = run_threads(finalize, 8)
    assert results.count(True) == 1, results
    assert results.count(False) == 7, results
    assert Wakeup.objects.count() == 1
    assert row(t).status in ("completed", "failed")


def test_7_1_9_a_cancellation_does_not_wake(spawn, signal_log):
    t = spawn()
    assert lifecycle.stop(t.task_id).status == "cancelled"
    assert row(t).status == "cancelled"
    assert signal_log.finished == []
    delivered = for_task(signal_log.delivered, t)
    assert len(delivered) == 1 and delivered[0].status == "cancelled"
    assert not Wakeup.objects.exists()


def test_7_1_10_the_sweep_fails_orphans_and_reports_them(spawn, signal_log):
    t = start(spawn())
    expire_lease(t)
    returned = lifecycle.recover()
    assert [r.id for r in returned] == [t.id]
    assert returned[0].status == "failed"
    task = row(t)
    assert task.status == "failed"
    assert task.summary == ORPHAN_TEXT
    finished = for_task(signal_log.finished, t)
    assert len(finished) == 1 and finished[0].status == "failed"
    assert list(Wakeup.objects.values_list("task_id", "state", "status")) == [
        (t.id, "pending", "failed")
    ]


def test_7_1_11_the_sweep_keeps_paused_tasks(spawn):
    t = finish(start(spawn()), "input_required", actions=(APPROVAL,))
    assert t.status == "waiting_for_input"
    expire_lease(t)
    returned = lifecycle.recover()
    assert t.id not in [r.id for r in returned]
    task = row(t)
    assert task.status == "waiting_for_input"
    assert task.run.status == "paused"


def _launch_failure_is_rolled_back(spawn, parent_run, recording_queue, created):
    before_tasks = Task.objects.count()
    with pytest.raises(LaunchFailed) as raised:
        spawn()
    assert str(raised.value) == "tasks: starting task run: queue down"
    assert isinstance(raised.value.__cause__, RuntimeError)
    # Exactly one hidden conversation existed during the launch, and it is gone.
    assert len(created) == 1 and len(created[0]) == 1
    assert not Conversation.objects.filter(pk=created[0][0]).exists()
    assert not Conversation.objects.filter(hidden=True).exists()
    assert Task.objects.count() == before_tasks == 0
    assert list(Run.objects.values_list("pk", flat=True)) == [parent_run.pk]
    assert not Event.objects.filter(conversation_id=created[0][0]).exists()
    assert recording_queue.run_ids == []


def test_7_1_12_a_failed_spawn_rolls_back_its_conversation(spawn, parent_run, recording_queue):
    created = []
    recording_queue.before_enqueue = lambda run_id: created.append(
        list(Conversation.objects.filter(hidden=True).values_list("pk", flat=True))
    )
    recording_queue.fail_with = RuntimeError("queue down")
    _launch_failure_is_rolled_back(spawn, parent_run, recording_queue, created)


def test_7_1_13_the_rollback_survives_the_parent_being_stopped(spawn, parent_run, recording_queue):
    created = []

    def stop_parent_then_fail(run_id):
        created.append(list(Conversation.objects.filter(hidden=True).values_list("pk", flat=True)))
        Run.objects.filter(pk=parent_run.pk).update(stop_request="now")

    recording_queue.before_enqueue = stop_parent_then_fail
    recording_queue.fail_with = RuntimeError("queue down")
    _launch_failure_is_rolled_back(spawn, parent_run, recording_queue, created)
    assert Run.objects.get(pk=parent_run.pk).stop_request == "now"


def test_7_1_14_stop_tree_cancels_every_live_task(spawn, parent):
    done = finish(spawn(), "completed", text="finished")
    live = spawn()
    assert done.status == "completed"
    lifecycle.stop_tree(parent)  # no error
    assert row(live).status == "cancelled"
    after = row(done)
    assert after.status == "completed"
    assert after.updated_at == done.updated_at


def test_7_1_15_a_status_wait_returns_at_completion(spawn):
    # [concurrent] the completing thread has its own connection.
    t = start(spawn())
    waiting = threading.Event()

    def complete():
        waiting.wait(5)
        time.sleep(0.02)  # staged: complete 20 ms after status() starts
        finish(t, "completed", text="finished")

    with background(complete):
        waiting.set()
        began = time.monotonic()
        info = lifecycle.status(t.id, wait=2)
        elapsed = time.monotonic() - began
    assert info.status == "completed", info
    assert elapsed < 1.0, elapsed


def test_7_1_16_a_terminal_read_on_the_models_path_settles_the_debt(
    spawn, parent, parent_run, signal_log
):
    t = finish(spawn(), "completed", text="finished")
    assert Wakeup.objects.get(task_id=t.id).state == "pending"

    # The REST path: a person reading the result has told the model nothing.
    assert lifecycle.status(t.id).status == "completed"
    assert Wakeup.objects.get(task_id=t.id).state == "pending"
    assert for_task(signal_log.delivered, t) == []

    task_status = tools_module.task_tools(parent, parent_run)[1]
    assert task_status.name == "task_status"
    out = task_status.call({"task_id": t.id, "wait_seconds": 0}, "call-1")
    assert not out.is_error, out.text
    assert "status: completed" in out.text
    assert len(for_task(signal_log.delivered, t)) == 1
    assert Wakeup.objects.get(task_id=t.id).state == "consumed"


def test_7_1_17_a_wait_is_bounded(spawn, settings):
    configure(settings, MAX_STATUS_WAIT=0.03)
    t = start(spawn())
    began = time.monotonic()
    info = lifecycle.status(t.id, wait=3600)
    assert time.monotonic() - began < 1.0
    assert info.status == "running"


def test_7_1_18_a_graceful_completion_is_a_cancellation(spawn, signal_log):
    t = finish(start(spawn()), "completed", graceful=True)
    assert t.status == "cancelled"
    assert t.summary == "stopped after the current turn"
    assert not Wakeup.objects.exists()
    assert for_task(signal_log.finished, t) == []


def test_7_1_19_a_failure_carries_its_reason(spawn):
    t = finish(start(spawn()), "failed", error="model refused")
    assert t.status == "failed"
    assert "model refused" in t.summary
    assert "model refused" in t.result
    assert "model refused" in t.error


def test_7_1_20_input_required_is_not_terminal(spawn, signal_log):
    t = start(spawn())
    run_id = t.run_id
    t = finish(t, "input_required", actions=(APPROVAL,))
    assert t.status == "waiting_for_input"
    assert t.run_id == run_id and t.run.status == "paused"
    assert signal_log.finished == []
    assert not Wakeup.objects.exists()
    action = PendingAction.objects.get(run_id=run_id)
    assert action.status == "pending"

    assert store.answer(t.id, run_id, action.id, {"status": "approved"})
    t = row(t)
    assert t.status == "pending"
    assert t.run_id == run_id and t.run.status == "queued"

    t = finish(t, "completed", text="deployed")
    assert t.status == "completed" and t.result == "deployed"


def test_7_1_21_state_changes_are_reported(spawn, signal_log):
    t = finish(spawn(), "completed", text="finished")
    updated = [model_status(s.status) for s in for_task(signal_log.updated, t)]
    assert len(updated) >= 2, updated
    assert updated[0] == "working" and updated[-1] == "completed"
    events = t.conversation.events.filter(type="task.status").order_by("seq")
    assert [e.data["to"] for e in events] == ["pending", "running", "completed"]
    assert all(e.data["taskId"] == t.id for e in events)
    assert {s.status for s in for_task(signal_log.updated, t)} <= {e.data["to"] for e in events}


def test_7_1_22_meta_for_identifies_a_tasks_conversation(spawn, parent):
    t = row(spawn())
    meta = lifecycle.meta_for(t.conversation)
    assert meta is not None
    assert meta.task_id == t.id
    assert meta.parent_conversation_id == parent.id
    assert meta.label == "job" and meta.depth == 1
    assert lifecycle.meta_for(parent) is None


def test_7_1_23_stopping_a_finished_task_is_reported_not_retried(spawn):
    t = finish(spawn(), "completed", text="finished")
    with pytest.raises(AlreadyFinal) as raised:
        lifecycle.stop(t.id)
    assert str(raised.value) == "tasks: task already completed"
    assert raised.value.info.status == "completed"
    assert row(t).status == "completed"


def _stop_request_writes(captured) -> int:
    return sum(
        1
        for q in captured.captured_queries
        if q["sql"].lstrip().upper().startswith("UPDATE") and "stop_request" in q["sql"]
    )


def test_7_1_24_a_graceful_stop_defers_to_the_run(spawn):
    t = start(spawn())
    with CaptureQueriesContext(connection) as captured:
        info = lifecycle.stop(t.id, graceful=True)
    assert info.status == "running"
    task = row(t)
    assert task.status == "running"
    assert task.run.stop_request == "after_turn"
    assert _stop_request_writes(captured) == 1
    # Asking again changes nothing: the request is written once.
    with CaptureQueriesContext(connection) as captured:
        assert lifecycle.stop(t.id, graceful=True).status == "running"
    assert _stop_request_writes(captured) == 0
    assert row(t).run.stop_request == "after_turn"


def test_7_1_25_a_paused_task_is_claimed_before_anyone_acts_on_the_stop(
    spawn, signal_log, monkeypatch
):
    t = finish(start(spawn()), "input_required", actions=(APPROVAL,))
    run_id = t.run_id
    action = PendingAction.objects.get(run_id=run_id)
    at_entry = []
    real_finalize = store.finalize

    def spy_finalize(task_id, run_id_, status, **kw):
        at_entry.append(
            (
                Task.objects.get(pk=task_id).status,
                Run.objects.get(pk=run_id_).status,
                PendingAction.objects.get(pk=action.pk).status,
            )
        )
        return real_finalize(task_id, run_id_, status, **kw)

    def no_request_stop(*args, **kw):
        raise AssertionError("a paused task is finalized, not asked to stop")

    monkeypatch.setattr(store, "finalize", spy_finalize)
    monkeypatch.setattr(store, "request_stop", no_request_stop)

    info = lifecycle.stop(t.id)

    # One store operation (one transaction) found it paused and left it cancelled and closed.
    assert at_entry == [("waiting_for_input", "paused", "pending")]
    assert info.status == "cancelled"
    task = row(t)
    assert task.status == "cancelled"
    assert task.summary == "stopped while awaiting approval"
    assert task.run_id == run_id and task.run.status == "cancelled"
    action.refresh_from_db()
    assert action.status == "cancelled"
    assert len(for_task(signal_log.delivered, t)) == 1

    assert lifecycle.resolve_action(action.id, {"approved": True}) is None
    action.refresh_from_db()
    assert action.status == "cancelled"
    task = row(t)
    assert task.status == "cancelled" and task.run.status == "cancelled"


def test_7_1_26_a_working_task_gets_the_stop_request_then_the_cancellation(spawn, monkeypatch):
    t = start(spawn())
    at_entry = []
    real_finalize = store.finalize

    def spy_finalize(task_id, run_id, status, **kw):
        at_entry.append(
            (Run.objects.get(pk=run_id).stop_request, Task.objects.get(pk=task_id).status)
        )
        return real_finalize(task_id, run_id, status, **kw)

    monkeypatch.setattr(store, "finalize", spy_finalize)
    assert lifecycle.stop(t.id).status == "cancelled"
    assert at_entry == [("now", "running")]
    task = row(t)
    assert task.status == "cancelled"
    assert task.run.stop_request == "now"


def test_7_1_27_a_wait_notices_an_ending_it_did_not_make(spawn, no_local_wakeups):
    # [concurrent] in-process wake-ups are off, so the waiter must notice the commit by polling.
    t = start(spawn())
    waiting = threading.Event()

    def complete():
        waiting.wait(5)
        time.sleep(0.03)  # staged: finalize 30 ms after status() starts
        assert store.finalize(t.id, t.run_id, "completed", summary="r", result="r")

    with background(complete):
        waiting.set()
        began = time.monotonic()
        info = lifecycle.status(t.id, wait=10)
        elapsed = time.monotonic() - began
    assert info.status == "completed", info
    assert elapsed < 2.0, elapsed


def test_7_1_28_the_cap_holds_under_concurrent_spawns(spawn, parent, settings):
    # [concurrent] the parent's row lock (PostgreSQL) or IMMEDIATE transactions (SQLite).
    configure(settings, MAX_CONCURRENT_PER_PARENT=2)
    results = run_threads(lambda i: spawn(), 8)
    spawned = [r for r in results if isinstance(r, TaskInfo)]
    refused = [r for r in results if isinstance(r, TaskLimit)]
    assert len(spawned) + len(refused) == 8, results
    live = Task.objects.filter(parent_conversation=parent).exclude(status__in=TERMINAL)
    assert live.count() <= 2
    assert len(spawned) == live.count() == 2, results
    assert all(r.limit == 2 for r in refused)
    assert Task.objects.count() == 2 and Conversation.objects.filter(hidden=True).count() == 2


def test_7_1_29_a_graceful_stop_nothing_can_honour_finalizes(spawn):
    # (a) the run is still queued: no worker holds it.
    queued = spawn()
    assert row(queued).run.status == "queued"
    assert lifecycle.stop(queued.task_id, graceful=True).status == "cancelled"
    task = row(queued)
    assert (task.status, task.summary) == ("cancelled", "stopped")
    assert task.run.status == "cancelled"

    # (b) the run is running but its lease expired: its worker is dead.
    dead = start(spawn())
    expire_lease(dead)
    assert lifecycle.stop(dead.id, graceful=True).status == "cancelled"
    task = row(dead)
    assert (task.status, task.summary) == ("cancelled", "stopped")


def test_7_1_30_a_graceful_stop_leaves_the_ending_to_a_live_run(spawn):
    t = start(spawn())
    info = lifecycle.stop(t.id, graceful=True)
    assert info.status == "running"
    assert row(t).status not in TERMINAL
    # The run then records its own ending.
    t = finish(t, "completed", graceful=True)
    assert t.status == "cancelled"


# --- 7.6 spawn guards -----------------------------------------------------------------------


def test_7_6_1_spawn_refuses_when_the_depth_lookup_fails(spawn, parent, recording_queue):
    error = DatabaseError("server closed the connection unexpectedly")
    before = counts()
    with failing_task_lookup(error), pytest.raises(SpawnError) as raised:
        spawn()
    assert str(raised.value).startswith("tasks: looking up session")
    assert str(raised.value) == f'tasks: looking up session "{parent.id}": {error}'
    assert raised.value.__cause__ is error
    assert counts() == before
    assert recording_queue.run_ids == []


def test_7_6_2_meta_for_reports_a_store_failure(parent):
    # Adapted: there is no chat runtime yet; `task_tools.attachable` is the check a runtime
    # makes before handing a run the four tools (docs/lifecycle.md#the-four-model-tools), so it stands in for "withholds".
    error = DatabaseError("server closed the connection unexpectedly")
    assert tools_module.attachable(parent) is True
    with failing_task_lookup(error):
        with pytest.raises(SpawnError) as raised:
            lifecycle.meta_for(parent)
        assert raised.value.__cause__ is error
        assert tools_module.attachable(parent) is False
    assert lifecycle.meta_for(parent) is None
