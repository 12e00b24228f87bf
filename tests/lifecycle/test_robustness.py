"""The lifecycle under double deliveries, re-openings, leases and other processes: scenarios
7.9.1–7.9.18 of docs/lifecycle.md ("Additions"), and a cross-process wait.

Store-level halves of some scenarios live in tests/store/ (7.9.1, 7.9.2, 7.9.3, 7.9.6; 7.9.16
in test_conf.py); the tests here drive the same
scenarios through the lifecycle, with real commits, and add what those do not cover. 7.9.15
(quoting) is in test_notifications.py.

"Another process" is a real OS process (`Peer`): `python -c` with the suite's settings, pointed
at this test database, that applies commands it reads from stdin and answers on stdout.
"""

import json
import logging
import os
import queue as queue_module
import statistics
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings
from django.db import DatabaseError, connection
from django.test import override_settings
from django.utils import timezone

from agenttasks import lifecycle, registry, store
from agenttasks.broker.listen import hub, task_key
from agenttasks.delivery import wakeups
from agenttasks.delivery.wakeups import PREFIX
from agenttasks.exceptions import ActionPending, DepthLimit, RunNotFound, TaskBusy, TaskNotFound
from agenttasks.models import (
    Comment,
    Conversation,
    Event,
    PendingAction,
    Run,
    Task,
    Wakeup,
)
from agenttasks.runtime.base import Reply
from agenttasks.runtime.task_tools import model_text
from agenttasks.types import ActionRequest, Continuation, RunOutcome, StopOutcome

from ..conftest import failing_inserts, on_postgres, run_threads, wait_for
from ..factories import ConversationFactory, RunFactory
from ..harness import finish, row

pytestmark = pytest.mark.django_db(transaction=True)

BASE_DIR = Path(__file__).resolve().parents[2]
ORPHAN = "The server stopped while the task was running"
APPROVAL = ActionRequest(kind="approval", tool_name="deploy", tool_call_id="call-9", args={})
PAST = timedelta(hours=1)


def agenttasks(**overrides):
    """override_settings for AGENTTASKS, keeping the suite's other keys."""
    return override_settings(AGENTTASKS={**getattr(settings, "AGENTTASKS", {}), **overrides})


def always_continue(task, outcome):
    """CONTINUE hook of 7.9.12: every run asks for another one."""
    return Continuation(input=f"next after {outcome.text}")


# --- the scenarios' harness ---------------------------------------------------------------------


def spawn(parent, parent_run=None, **kw) -> str:
    kw.setdefault("label", "job")
    return lifecycle.spawn(parent, "worker", "do it", parent_run=parent_run, **kw).task_id


def start(t):
    run = store.claim(row(t).run_id, "w1")
    assert run
    return run


def notifications(conversation):
    return list(
        Event.objects.filter(conversation=conversation, type="task.notification").order_by("seq")
    )


def wakeup_runs(conversation):
    return list(Run.objects.filter(conversation=conversation, trigger="wakeup"))


# --- another process -------------------------------------------------------------------------

PEER_SCRIPT = r"""
import json, os, sys, time
import django
django.setup()
from django.conf import settings
from django.test.utils import override_settings
overrides = json.loads(os.environ.get("PEER_AGENTTASKS") or "{}")
override_settings(AGENTTASKS={**getattr(settings, "AGENTTASKS", {}), **overrides}).enable()
from agenttasks import lifecycle, queue
from agenttasks.models import Run, Task
from agenttasks import registry
from agenttasks.runtime.base import Reply
from agenttasks.types import RunOutcome
for agent_id in ("default", "worker"):
    registry.register(agent_id, runtime="callable", handler=lambda ctx: Reply("done"), replace=True)
queue.use_backend(queue.RecordingQueue()).__enter__()
from agenttasks import store
commits = []
def timed(write):
    def wrapper(*args, **kwargs):
        won = write(*args, **kwargs)
        commits.append(time.time())  # its transaction has just committed
        return won
    return wrapper
store.finalize = timed(store.finalize)
store.end = timed(store.end)  # records the ending and finalizes in one commit
print(json.dumps({"ready": os.getpid()}), flush=True)
for line in sys.stdin:
    command = json.loads(line)
    try:
        if command["op"] == "finish":
            task = Task.objects.get(pk=command["task"])
            outcome = RunOutcome(command["run"], command["status"], text=command.get("text", ""))
            commits.clear()
            lifecycle.on_run_finished(task.conversation_id, outcome)
            task = Task.objects.get(pk=command["task"])
            reply = {"committed": commits[-1] if commits else None, "status": task.status,
                     "run": task.run_id,
                     "continuations": task.continuations}
        elif command["op"] == "read_run":
            run = Run.objects.get(pk=command["run"])
            reply = {"stop_request": run.stop_request, "status": run.status}
        else:
            reply = {"error": "unknown op"}
    except Exception as exc:
        reply = {"error": repr(exc)}
    print(json.dumps(reply), flush=True)
"""


class Peer:
    """A separate OS process on the same test database, driven over stdin/stdout."""

    def __init__(self, **agenttasks_overrides):
        self.proc = subprocess.Popen(
            [sys.executable, "-c", PEER_SCRIPT],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=BASE_DIR,
            env=self._env(agenttasks_overrides),
        )
        self.lines: queue_module.Queue = queue_module.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        ready = self._next(60)
        assert ready["ready"] != os.getpid()

    @staticmethod
    def _env(overrides) -> dict:
        env = dict(os.environ)
        db = connection.settings_dict
        if on_postgres():
            auth = db["USER"] + (f":{db['PASSWORD']}" if db["PASSWORD"] else "")
            env["DATABASE_URL"] = (
                f"postgres://{auth}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"
            )
        else:
            env.pop("DATABASE_URL", None)
            env["SQLITE_PATH"] = str(db["NAME"])
        env["DJANGO_SETTINGS_MODULE"] = os.environ.get("DJANGO_SETTINGS_MODULE", "tests.settings")
        env["PYTHONPATH"] = str(BASE_DIR)
        env["AGENTTASKS_LOG"] = "WARNING"
        env["PEER_AGENTTASKS"] = json.dumps(overrides)
        return env

    def _read(self):
        for line in self.proc.stdout:
            self.lines.put(line)

    def _next(self, timeout):
        try:
            line = self.lines.get(timeout=timeout)
        except queue_module.Empty:
            self.proc.kill()
            raise AssertionError(
                f"peer process silent; stderr: {self.proc.stderr.read()}"
            ) from None
        return json.loads(line)

    def send(self, timeout=30, **command) -> dict:
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()
        reply = self._next(timeout)
        assert "error" not in reply, reply
        return reply

    def close(self):
        self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.proc.stdout.close()
        self.proc.stderr.close()


@pytest.fixture
def peer():
    peers = []

    def make(**overrides):
        peers.append(Peer(**overrides))
        return peers[-1]

    yield make
    for p in peers:
        p.close()


# --- 7.9 -------------------------------------------------------------------------------------


def test_7_9_1_a_double_delivery_runs_once(parent, parent_run, signal_log):
    """[concurrent] Two workers get the same queued run: one claims and executes, once."""
    for _ in range(5):
        t = spawn(parent, parent_run)
        run_id = row(t).run_id
        executed = []

        def deliver(i, t=t, run_id=run_id, executed=executed):
            if not store.claim(run_id, f"w{i}"):
                return False
            executed.append(i)  # the agent runs here, outside any transaction
            lifecycle.on_run_finished(
                row(t).conversation_id, RunOutcome(run_id, "completed", text=f"by w{i}")
            )
            return True

        results = run_threads(deliver, 2)
        assert sorted(results) == [False, True], results
        assert len(executed) == 1
        task = row(t)
        assert task.status == "completed" and task.result == f"by w{executed[0]}"
        assert task.conversation.events.filter(type="run.started").count() == 1
    assert len(signal_log.finished) == 5


def test_7_9_2_a_claim_refuses_a_run_its_task_left(parent, parent_run, recording_queue):
    t = spawn(parent, parent_run)
    run_id = row(t).run_id
    info = lifecycle.stop(t)
    assert info.status == "cancelled"
    assert store.claim(run_id, "late-worker") is None
    run = Run.objects.get(pk=run_id)
    assert run.status == "cancelled" and run.worker == ""
    # Never requeued, however old it gets.
    Run.objects.filter(pk=run_id).update(queued_at=timezone.now() - PAST)
    recording_queue.run_ids.clear()
    lifecycle.recover()
    assert run_id not in recording_queue.run_ids
    assert Run.objects.get(pk=run_id).status == "cancelled"


def test_7_9_2_a_queued_run_left_by_a_retry_is_cancelled_by_its_late_claim(parent, parent_run):
    t = spawn(parent, parent_run)
    finish(t, "failed", error="boom")
    lifecycle.retry(t)
    stale = Run.objects.create(
        conversation_id=row(t).conversation_id, task_id=t, agent="worker", trigger="retry"
    )
    assert store.claim(stale.id, "w1") is None
    stale.refresh_from_db()
    assert stale.status == "cancelled"
    assert row(t).status == "pending"  # the task's own run is untouched


def test_7_9_3_a_comment_reopens_a_finished_task(
    parent, parent_run, user, recording_queue, signal_log
):
    t = spawn(parent, parent_run)
    finish(t, "failed", error="rate limited")
    lifecycle.retry(t)  # attempt 2: a re-open must keep it
    before = finish(t, "completed", text="the answer")
    Task.objects.filter(pk=t).update(continuations=3)  # staged: a chain ran before
    wakeup = Wakeup.objects.get(task_id=t, state="pending")
    comment = lifecycle.comment(t, "use prod instead", author=user)
    task = row(t)
    assert isinstance(comment, Comment) and comment.content == "use prod instead"
    assert task.status == "pending" and task.run_id != before.run_id
    assert task.run.trigger == "comment" and task.run.input == "use prod instead"
    assert comment.run_id == task.run_id
    assert task.attempt == before.attempt == 2
    assert (task.summary, task.result, task.error) == ("", "", "")
    assert task.continuations == 0 and task.finished_at is None
    wakeup.refresh_from_db()
    assert wakeup.state == "dropped"
    assert recording_queue.run_ids[-1] == task.run_id
    last_user = task.conversation.events.filter(type="message.user").order_by("-seq").first()
    assert last_user.data["content"] == "use prod instead" and last_user.run_id == task.run_id
    assert signal_log.updated[-1].status == "pending"


def _counts(t):
    task = row(t)
    return (
        task.status,
        task.run_id,
        task.updated_at,
        Run.objects.filter(task_id=t).count(),
        Event.objects.filter(conversation_id=task.conversation_id).count(),
        Comment.objects.filter(task_id=t).count(),
    )


def test_7_9_4_comment_refusals(parent, parent_run, user):
    pending = spawn(parent, parent_run)
    running = spawn(parent, parent_run)
    start(running)
    paused = spawn(parent, parent_run)
    start(paused)
    lifecycle.on_run_finished(
        row(paused).conversation_id,
        RunOutcome(row(paused).run_id, "input_required", actions=(APPROVAL,)),
    )
    assert row(paused).status == "waiting_for_input"
    action = PendingAction.objects.get(run_id=row(paused).run_id)

    for t, status in ((pending, "pending"), (running, "running")):
        before = _counts(t)
        with pytest.raises(TaskBusy) as raised:
            lifecycle.comment(t, "hello?", author=user)
        assert str(raised.value) == f"tasks: task is {status}"  # the stored status
        assert model_text(raised.value) == "tasks: task is working"  # a model's word
        assert raised.value.status == status and raised.value.info.status == status
        assert _counts(t) == before

    before = _counts(paused)
    with pytest.raises(ActionPending) as raised:
        lifecycle.comment(paused, "hello?", author=user)
    assert str(raised.value) == "tasks: task is waiting on an approval or a question"
    assert raised.value.action_ids == [action.id]
    assert raised.value.info.status == "waiting_for_input"
    assert _counts(paused) == before
    action.refresh_from_db()
    assert action.status == "pending"


def test_7_9_5_legacy_clarification(parent, parent_run, user, signal_log):
    """A callable reply with metadata["waitingForInput"] pauses the task; a comment re-opens it."""
    from agenttasks.runtime import callable as callable_runtime
    from agenttasks.runtime.base import RunContext, StopFlag

    def clarifier(ctx):
        users = [c for c in ctx.metadata["comments"] if c["role"] == "user"]
        if not users:
            return Reply(content="Which format?", metadata={"waitingForInput": True})
        return Reply(content=f"Done in {users[-1]['content']}")

    registry.register("clarifier", runtime="callable", handler=clarifier, replace=True)
    try:
        t = lifecycle.spawn(parent, "clarifier", "export it", parent_run=parent_run).task_id

        def execute():
            run = start(t)
            run = Run.objects.select_related("conversation", "task").get(pk=run.pk)
            ctx = RunContext(
                run=run,
                conversation=run.conversation,
                task=run.task,
                agent=registry.get("clarifier"),
                stop=StopFlag(),
            )
            outcome = callable_runtime.execute(ctx)
            lifecycle.on_run_finished(run.conversation_id, outcome)
            return run.id

        first_run = execute()
        task = row(t)
        assert task.status == "waiting_for_input"
        assert Run.objects.get(pk=first_run).status == "completed"
        assert not Wakeup.objects.filter(task_id=t).exists()
        assert signal_log.finished == []
        question = Comment.objects.get(task_id=t)
        assert (question.role, question.content) == ("agent", "Which format?")
        assert lifecycle.status(t).status == "waiting_for_input"

        lifecycle.comment(t, "PDF", author=user)
        task = row(t)
        assert task.status == "pending" and task.run_id != first_run
        assert task.run.trigger == "comment" and task.run.input == "PDF"
        execute()
        task = row(t)
        assert (task.status, task.result) == ("completed", "Done in PDF")
        assert Wakeup.objects.get(task_id=t).status == "completed"
        assert [s.status for s in signal_log.finished] == ["completed"]
    finally:
        registry.unregister("clarifier")


def test_7_9_6_debt_is_atomic_with_the_ending(parent, parent_run, signal_log):
    """Through on_run_finished, with real commits: the wake-up insert fails after the status
    write, and the ending is kept neither."""
    t = spawn(parent, parent_run)
    start(t)
    with failing_inserts("agenttasks_wakeup"), pytest.raises(DatabaseError):
        finish(t, "completed", text="done")
    task = row(t)
    assert task.status == "running" and task.result == "" and task.finished_at is None
    assert not Wakeup.objects.exists()
    assert signal_log.finished == []
    task = finish(t, "completed", text="done")
    assert (task.status, task.result) == ("completed", "done")
    wakeup = Wakeup.objects.get()
    assert (wakeup.task_id, wakeup.run_id, wakeup.state) == (t, task.run_id, "pending")
    assert len(signal_log.finished) == 1


def test_7_9_7_a_busy_parent_is_woken_at_its_boundary_once_with_everything(
    parent, parent_run, recording_queue
):
    t1 = spawn(parent, parent_run, label="first")
    t2 = spawn(parent, parent_run, label="second")
    finish(t1, "completed", text="one")
    finish(t2, "failed", error="two")
    assert notifications(parent) == [] and wakeup_runs(parent) == []
    assert set(Wakeup.objects.values_list("state", flat=True)) == {"pending"}

    lifecycle.on_run_finished(parent, RunOutcome(parent_run.id, "completed", text="ok"))

    [event] = notifications(parent)
    [run] = wakeup_runs(parent)
    lines = event.data["content"][len(PREFIX) :].split("\n")
    assert event.data["content"].startswith(PREFIX)
    assert lines[0] == f'Task "first" ({t1}) completed. Result: one'
    assert lines[1] == f'Task "second" ({t2}) failed. Result: two'
    assert lines[2:] == [wakeups.RETRY_HINT, wakeups.GUIDANCE]
    assert event.data["taskIds"] == [t1, t2] and event.run_id == run.id
    assert (run.status, run.trigger, run.input, run.task_id) == (
        "queued",
        "wakeup",
        event.data["content"],
        None,
    )
    assert recording_queue.run_ids[-1] == run.id
    for wakeup in Wakeup.objects.all():
        assert (wakeup.state, wakeup.delivered_run_id) == ("delivered", run.id)
    # Once: a second attempt finds nothing owed (and the parent busy with its wake-up run).
    assert wakeups.deliver_pending(parent.id) is None
    assert len(notifications(parent)) == 1 and len(wakeup_runs(parent)) == 1


def _open_action(parent):
    run = RunFactory(conversation=parent, status="completed")
    return PendingAction.objects.create(
        conversation=parent, run=run, kind="approval", tool_name="deploy", tool_call_id="c1"
    )


def _close_action(parent, action):
    PendingAction.objects.filter(pk=action.pk).update(status="cancelled")


def _set_deleting(parent, _):
    Conversation.objects.filter(pk=parent.pk).update(deleting_at=timezone.now())


def _clear_deleting(parent, _):
    Conversation.objects.filter(pk=parent.pk).update(deleting_at=None)


@pytest.mark.parametrize("obstacle", ["open_action", "deleting", "raising_check"])
def test_7_9_8_unsafe_parents_are_not_woken(parent, monkeypatch, obstacle):
    t1 = spawn(parent)
    t2 = spawn(parent)
    start(t1)
    start(t2)
    if obstacle == "open_action":
        action = _open_action(parent)
        undo = lambda: _close_action(parent, action)  # noqa: E731
    elif obstacle == "deleting":
        _set_deleting(parent, None)
        undo = lambda: _clear_deleting(parent, None)  # noqa: E731
    else:

        def broken(conversation):
            raise DatabaseError("the check failed")

        monkeypatch.setattr(wakeups, "may_wake", broken)
        undo = monkeypatch.undo

    finish(t1, "completed", text="one")  # each ending attempts delivery at once
    finish(t2, "failed", error="two")
    assert wakeups.deliver_pending(parent.id) is None  # and so does an explicit pass
    assert notifications(parent) == [] and wakeup_runs(parent) == []
    assert list(Wakeup.objects.values_list("state", flat=True)) == ["pending", "pending"]

    undo()  # the obstacle was the only reason: now both go in one wake-up
    run = wakeups.deliver_pending(parent.id)
    assert run is not None and len(notifications(parent)) == 1
    assert list(Wakeup.objects.values_list("state", flat=True)) == ["delivered", "delivered"]


def test_7_9_9_concurrent_deliveries_produce_one_wakeup(parent, parent_run):
    """[concurrent] Two deliveries for one parent at once: one wake-up run, one event."""
    for round_no in range(5):
        tasks = [spawn(parent, parent_run) for _ in range(3)]
        for i, t in enumerate(tasks):
            finish(t, "completed" if i % 2 == 0 else "failed", text=f"r{i}", error=f"e{i}")
        # The parent's turn ends without its own delivery pass, so the two below race for it.
        Run.objects.filter(conversation=parent, status__in=("queued", "running")).update(
            status="completed"
        )
        results = run_threads(lambda i: wakeups.deliver_pending(parent.id), 2)
        made = [r for r in results if isinstance(r, Run)]
        assert len(made) == 1 and results.count(None) == 1, results
        assert len(wakeup_runs(parent)) == round_no + 1
        assert len(notifications(parent)) == round_no + 1
        owed = Wakeup.objects.filter(task_id__in=tasks)
        assert {(w.state, w.delivered_run_id) for w in owed} == {("delivered", made[0].id)}
        assert notifications(parent)[-1].data["taskIds"] == tasks
        # The next round starts with a busy parent again.
        Run.objects.filter(pk=made[0].id).update(status="running")


def test_7_9_10_leases(parent, parent_run, recording_queue):
    now = timezone.now()
    expired = spawn(parent, parent_run, label="expired")
    fresh = spawn(parent, parent_run, label="fresh")
    stale_queued = spawn(parent, parent_run, label="stale queued")
    young_queued = spawn(parent, parent_run, label="young queued")
    paused = spawn(parent, parent_run, label="paused")
    for t in (expired, fresh, paused):
        start(t)
    finish(paused, "input_required", actions=(APPROVAL,))
    Run.objects.filter(pk__in=[row(expired).run_id, row(paused).run_id]).update(
        heartbeat_at=now - PAST
    )
    Run.objects.filter(pk=row(stale_queued).run_id).update(queued_at=now - PAST)
    recording_queue.run_ids.clear()

    failed = lifecycle.recover()

    assert [t.id for t in failed] == [expired]
    task = row(expired)
    assert (task.status, task.summary, task.error) == ("failed", ORPHAN, ORPHAN)
    assert task.run.status == "failed" and task.run.error == ORPHAN
    assert Wakeup.objects.get(task_id=expired).status == "failed"
    assert row(fresh).status == "running" and row(fresh).run.status == "running"
    assert row(paused).status == "waiting_for_input" and row(paused).run.status == "paused"
    assert PendingAction.objects.get(run_id=row(paused).run_id).status == "pending"
    assert recording_queue.run_ids == [row(stale_queued).run_id]
    requeued = row(stale_queued).run
    assert requeued.queued_at < now - timedelta(minutes=1)  # still says how long it waited
    assert requeued.requeues == 1 and requeued.requeue_at > now
    assert row(stale_queued).status == "pending" and row(young_queued).status == "pending"
    # A second pass right after finds nothing to do.
    recording_queue.run_ids.clear()
    assert lifecycle.recover() == [] and recording_queue.run_ids == []


def test_7_9_11_the_sweep_is_safe_beside_retries(parent, parent_run, recording_queue):
    t = spawn(parent, parent_run)
    start(t)
    old_run = row(t).run_id
    Run.objects.filter(pk=old_run).update(heartbeat_at=timezone.now() - PAST)
    finish(t, "failed", error="rate limited")
    lifecycle.retry(t)  # claimed just before the sweep: its run is queued
    retry_run = row(t).run_id
    Run.objects.filter(pk=old_run).update(status="running")  # a stale row of the old attempt
    recording_queue.run_ids.clear()

    assert lifecycle.recover() == []
    task = row(t)
    assert (task.status, task.run_id, task.attempt) == ("pending", retry_run, 2)
    assert task.run.status == "queued" and recording_queue.run_ids == []

    start(t)  # and once a worker holds it with a fresh heartbeat
    assert lifecycle.recover() == []
    assert row(t).status == "running"


def test_7_9_12_the_continuation_counter_is_shared(parent, parent_run, peer):
    """Runs 1 and 3 end in this process, run 2 in another: the ceiling is the persisted count."""
    overrides = {
        "CONTINUE": {"loop": "tests.lifecycle.test_robustness.always_continue"},
        "MAX_CONTINUATIONS": 2,
    }
    other = peer(**overrides)
    with agenttasks(**overrides):
        t = spawn(parent, parent_run, kind="loop", state={"step": 1})
        task = finish(t, "completed", text="one")  # here: advance 1
        assert (task.status, task.continuations) == ("pending", 1)
        start(t)
        reply = other.send(op="finish", task=t, run=task.run_id, status="completed", text="two")
        assert (reply["status"], reply["continuations"]) == ("pending", 2)  # there: advance 2
        task = row(t)
        assert task.run_id == reply["run"] and task.run.input == "next after two"
        task = finish(t, "completed", text="three")  # here again: the ceiling
    assert task.status == "failed"
    assert task.summary == "stopped after 3 runs: the task's continuation ceiling (2) was reached"
    assert task.continuations == 2 and Run.objects.filter(task_id=t).count() == 3
    assert Wakeup.objects.get(task_id=t).status == "failed"


def test_7_9_13_delivery_is_run_bound_across_reopens(parent, parent_run, user, signal_log):
    t = spawn(parent, parent_run)
    finish(t, "completed", text="first answer")
    old_info = lifecycle.status(t)
    assert (old_info.status, old_info.result) == ("completed", "first answer")
    lifecycle.comment(t, "again please", author=user)
    task = finish(t, "completed", text="second answer")
    assert task.run_id != old_info.run_id
    second = Wakeup.objects.get(task_id=t, run_id=task.run_id)

    lifecycle.model_has_result(old_info)
    second.refresh_from_db()
    assert second.state == "pending" and signal_log.delivered == []
    assert Wakeup.objects.get(task_id=t, run_id=old_info.run_id).state == "dropped"

    lifecycle.model_has_result(lifecycle.status(t))  # the current answer does settle it
    second.refresh_from_db()
    assert second.state == "consumed" and len(signal_log.delivered) == 1


def test_7_9_14_a_graceful_stop_that_meets_a_pause_ends_the_task(parent, parent_run, signal_log):
    t = spawn(parent, parent_run)
    start(t)
    info = lifecycle.stop(t, graceful=True)
    assert info.status == "running" and row(t).run.stop_request == "after_turn"
    # The agent's turn ends asking for approval (its runtime had not seen the request yet).
    task = finish(t, "input_required", actions=(APPROVAL,))
    assert task.status == "cancelled"
    assert task.summary == "stopped after the current turn"
    assert task.run.status in ("completed", "cancelled")
    assert not PendingAction.objects.filter(task_id=t, status="pending").exists()
    assert not Wakeup.objects.filter(task_id=t).exists()
    assert [s.id for s in signal_log.delivered] == [t] and signal_log.finished == []


def test_7_9_14_the_callable_runtime_ends_instead_of_pausing(parent, parent_run, signal_log):
    """The runtime half: a run that already knows about the stop never asks."""
    from agenttasks.runtime import callable as callable_runtime
    from agenttasks.runtime.base import RunContext, StopFlag

    def approver(ctx):
        ctx.request_approval("deploy", {"env": "prod"})
        return Reply(content="deployed")

    registry.register("approver-7-9-14", runtime="callable", handler=approver, replace=True)
    try:
        t = lifecycle.spawn(parent, "approver-7-9-14", "ship", parent_run=parent_run).task_id
        run = start(t)
        assert lifecycle.stop(t, graceful=True).status == "running"
        run = Run.objects.select_related("conversation", "task").get(pk=run.pk)
        flag = StopFlag()
        flag.set(run.stop_request)
        ctx = RunContext(
            run=run,
            conversation=run.conversation,
            task=run.task,
            agent=registry.get("approver-7-9-14"),
            stop=flag,
        )
        lifecycle.on_run_finished(run.conversation_id, callable_runtime.execute(ctx))
    finally:
        registry.unregister("approver-7-9-14")
    task = row(t)
    assert (task.status, task.summary) == ("cancelled", "stopped after the current turn")
    assert not PendingAction.objects.filter(task_id=t).exists()


def test_7_9_16_settings_at_or_below_zero_read_as_defaults_in_the_lifecycle(parent, parent_run):
    """test_conf.py checks each key's value; this checks the lifecycle obeys the defaults."""
    with agenttasks(SUMMARY_LIMIT=0, MAX_ATTEMPTS=-1, MAX_DEPTH=0, LEASE_TIMEOUT=-5):
        t = spawn(parent, parent_run)
        task = finish(t, "failed", text="x" * 400)
        assert len(task.summary) == 300 and len(task.result) == 400  # SUMMARY_LIMIT 300
        assert lifecycle.retry(t).attempt == 2  # MAX_ATTEMPTS 3
        finish(t, "failed", error="again")
        assert lifecycle.retry(t).attempt == 3
        finish(t, "failed", error="and again")
        with pytest.raises(Exception, match="already used its 3 attempts"):
            lifecycle.retry(t)
        with pytest.raises(DepthLimit):  # MAX_DEPTH 1
            lifecycle.spawn(row(t).conversation, "worker", "deeper")
        u = spawn(parent, parent_run)
        start(u)
        Run.objects.filter(pk=row(u).run_id).update(
            heartbeat_at=timezone.now() - timedelta(seconds=10)
        )
        assert lifecycle.recover() == []  # LEASE_TIMEOUT 30: ten seconds is alive
        assert row(u).status == "running"


def test_7_9_17_deleting_during_a_run(parent, parent_run, user, signal_log):
    t = spawn(parent, parent_run)
    finished_sibling = spawn(parent, parent_run)
    finish(finished_sibling, "completed", text="owed")
    run = start(t)  # a worker executes the child's run
    child_conversation = row(t).conversation_id
    unrelated = ConversationFactory(owner=user)

    lifecycle.delete_conversation(parent.id)

    assert not Conversation.objects.filter(pk__in=[parent.id, child_conversation]).exists()
    assert not Task.objects.exists() and not Wakeup.objects.exists()
    assert not Run.objects.filter(pk=run.id).exists()
    assert Conversation.objects.filter(pk=unrelated.pk).exists()
    # The worker's late ending finds the tree gone: a lookup error it logs at INFO and swallows.
    with pytest.raises((TaskNotFound, RunNotFound)):
        lifecycle.on_run_finished(child_conversation, RunOutcome(run.id, "completed", text="late"))
    assert not Wakeup.objects.exists() and not Task.objects.exists()
    assert not Event.objects.filter(conversation_id=child_conversation).exists()
    assert signal_log.finished[-1].id == finished_sibling  # nothing new was reported


def test_7_9_17_the_worker_swallows_the_late_ending(parent, parent_run, user, caplog):
    """Through worker.execute_run: the handler deletes the tree while its own run executes."""
    from agenttasks.execution import worker

    seen = {}

    def deleter(ctx):
        seen["run"] = ctx.run_id
        lifecycle.delete_conversation(parent.id)
        return Reply(content="late")

    registry.register("deleter", runtime="callable", handler=deleter, replace=True)
    try:
        with agenttasks(HEARTBEAT_INTERVAL=0.05, LEASE_TIMEOUT=30):
            t = lifecycle.spawn(parent, "deleter", "go", parent_run=parent_run).task_id
            run_id = row(t).run_id
            with caplog.at_level(logging.INFO, logger="agenttasks"):
                worker.execute_run(run_id)  # raises nothing
    finally:
        registry.unregister("deleter")
    assert seen["run"] == run_id
    assert not Task.objects.exists() and not Wakeup.objects.exists()
    assert not Conversation.objects.filter(pk=parent.id).exists()
    gone = [
        r
        for r in caplog.records
        if r.name == "agenttasks.execution.worker" and r.levelno == logging.INFO
    ]
    assert gone, [r.getMessage() for r in caplog.records]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_7_9_18_an_immediate_stop_reaches_another_node(parent, parent_run, peer, signal_log):
    """The store/lifecycle half: the request is on the run row, which another process reads.

    The worker half (its heartbeat reading the row within HEARTBEAT_INTERVAL and aborting) is
    the worker's scenario; here the node holding the run is staged by a claim.
    """
    other = peer()
    t = spawn(parent, parent_run)
    run = start(t)
    assert other.send(op="read_run", run=run.id) == {"stop_request": "", "status": "running"}

    info = lifecycle.stop(t)

    assert info.status == "cancelled"
    task = row(t)
    assert task.status == "cancelled" and task.summary == "stopped"
    assert task.run.stop_request == "now" and task.run.status == "running"
    assert other.send(op="read_run", run=run.id) == {"stop_request": "now", "status": "running"}
    assert store.request_stop(t, run.id, graceful=True) is StopOutcome.MOVED
    # The held run's late ending, from the other node, loses the compare-and-set.
    reply = other.send(op="finish", task=t, run=run.id, status="completed", text="too late")
    assert reply["status"] == "cancelled"
    task = row(t)
    assert task.status == "cancelled" and task.result != "too late"
    # The late ending is recorded on the run as discarded: told to stop now, the run ends
    # cancelled (docs/architecture.md#run-status-and-triggers), and the task keeps the stop's outcome.
    assert task.run.status == "cancelled" and task.run.output == "too late"
    assert signal_log.finished == [] and [s.id for s in signal_log.delivered] == [t]
    assert not Wakeup.objects.filter(task_id=t).exists()


# --- a status wait across processes ----------------------------------------------------------


def test_a_status_wait_returns_when_another_process_commits_the_ending(parent, parent_run, peer):
    """A waiter here; another OS process commits the ending; the wait ends at once, not at 10 s."""
    other = peer()
    latencies = []
    for _ in range(5):
        t = spawn(parent, parent_run)
        run = start(t)
        result = {}

        def waiter(t=t, result=result):
            try:
                result["info"] = lifecycle.status(t, wait=10)
                result["returned"] = time.time()
            finally:
                connection.close()

        thread = threading.Thread(target=waiter)
        thread.start()
        wait_for(lambda t=t: hub._waiters.get(task_key(t)), message="the waiter to subscribe")
        reply = other.send(op="finish", task=t, run=run.id, status="completed", text="there")
        assert reply["status"] == "completed"
        thread.join(12)
        assert not thread.is_alive()
        assert result["info"].status == "completed" and result["info"].result == "there"
        latency = result["returned"] - reply["committed"]
        assert latency < 2.0, latency
        latencies.append(latency)
    median = statistics.median(latencies)
    print(
        f"\ncross-process status wait latency on {connection.vendor}: "
        + ", ".join(f"{x * 1000:.1f} ms" for x in latencies)
        + f"; median {median * 1000:.1f} ms"
    )
