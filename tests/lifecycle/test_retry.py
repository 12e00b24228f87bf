"""Retry: scenarios 7.2.1–7.2.23 of docs/lifecycle.md, on the harness described there.

`spawn()`, `start(t)`, `finish(t, …)` and `fail(t, reason)` are the harness's helpers. Endings,
launches and signals run after commit, so every test commits for real.
"""

import threading
import time
from datetime import timedelta

import pytest
from django.db import connection
from django.test import override_settings
from django.utils import timezone

from agenttasks import lifecycle, store
from agenttasks.conf import app_settings
from agenttasks.exceptions import LaunchFailed, NotRetryable, RetryLimit, TaskError, TaskLimit
from agenttasks.models import Run, Wakeup
from agenttasks.runtime.task_tools import model_text, task_tools
from agenttasks.types import ActionRequest, RunOutcome, StopOutcome

from ..conftest import run_threads
from ..harness import fail, finish, row, runs_of, wakeups_of

pytestmark = pytest.mark.django_db(transaction=True)

ORPHAN = "The server stopped while the task was running"
APPROVAL = ActionRequest(kind="approval", tool_name="deploy", tool_call_id="call-9", args={})


@pytest.fixture
def h(parent, parent_run, recording_queue, signal_log):
    """The scenarios' harness bound to P, R, the recording queue and the signal log."""
    return Harness(parent, parent_run, recording_queue, signal_log)


class Harness:
    def __init__(self, parent, parent_run, queue, log):
        self.P, self.R, self.queue, self.log = parent, parent_run, queue, log

    def spawn(self, **kw):
        info = lifecycle.spawn(self.P, "worker", "do it", label="job", parent_run=self.R, **kw)
        return info.task_id

    def start(self, t):
        return store.claim(row(t).run_id, "w1")

    finish = staticmethod(finish)
    fail = staticmethod(fail)

    def tool(self, name):
        return next(tool for tool in task_tools(self.P, self.R) if tool.name == name)


def expire_lease(t) -> None:
    """Stage a dead worker: the current run's heartbeat is older than LEASE_TIMEOUT."""
    past = timezone.now() - timedelta(seconds=app_settings.LEASE_TIMEOUT + 60)
    Run.objects.filter(pk=row(t).run_id).update(heartbeat_at=past, started_at=past)


def spy_request_stop(monkeypatch, before=None, after=None):
    """Record every request_stop answer; `before(n)`/`after(n)` run around the n-th call."""
    answers: list[StopOutcome] = []
    real = store.request_stop

    def spy(task_id, run_id, *, graceful):
        if before is not None:
            before(len(answers) + 1)
        answer = real(task_id, run_id, graceful=graceful)
        answers.append(answer)
        if after is not None:
            after(len(answers))
        return answer

    monkeypatch.setattr(store, "request_stop", spy)
    return answers


def on_retry_launch(queue, action):
    """Run `action(task_id)` inside the launch of the next run that is a retry, once."""

    def hook(run_id):
        run = Run.objects.get(pk=run_id)
        if run.trigger == "retry" and queue.before_enqueue is hook:
            queue.before_enqueue = None
            action(run.task_id)

    queue.before_enqueue = hook


def test_7_2_1_retry_keeps_task_and_conversation_and_changes_the_run(h):
    t = h.spawn()
    before = h.fail(t, "rate limited")
    info = lifecycle.retry(t)
    task = row(t)
    assert task.id == before.id and task.conversation_id == before.conversation_id
    assert task.run_id and task.run_id != before.run_id and info.run_id == task.run_id
    assert info.status == "pending" and task.status == "pending"
    assert task.attempt == 2 and info.attempt == 2
    assert (task.summary, task.result, task.error) == ("", "", "")
    run = task.run
    assert run.trigger == "retry"
    assert run.conversation_id == before.conversation_id and run.task_id == t
    assert task.inherit == before.inherit and task.inherit["id"] == "worker"
    assert run.agent == before.agent
    assert "rate limited" in run.input


def test_7_2_2_the_prompt_falls_back_to_the_summary(h):
    t = h.spawn()
    h.start(t)
    expire_lease(t)
    assert [o.id for o in lifecycle.recover()] == [t]
    orphan = row(t)
    assert (orphan.status, orphan.summary, orphan.result) == ("failed", ORPHAN, "")
    lifecycle.retry(t)
    assert ORPHAN in row(t).run.input


def test_7_2_3_only_a_failed_task_is_retried(h):
    pending = h.spawn()
    running = h.spawn()
    h.start(running)
    waiting = h.spawn()
    h.finish(waiting, "input_required", actions=(APPROVAL,))
    completed = h.spawn()
    h.finish(completed, "completed", text="done")
    cancelled = h.spawn()
    lifecycle.stop(cancelled)
    expected = {
        pending: ("pending", "working"),
        running: ("running", "working"),
        waiting: ("waiting_for_input", "input_required"),
        completed: ("completed", "completed"),
        cancelled: ("cancelled", "cancelled"),
    }
    for t, (status, name) in expected.items():
        before = row(t)
        assert before.status == status
        with pytest.raises(NotRetryable) as refused:
            lifecycle.retry(t)
        # Python speaks the stored status; a model is told the model-facing name.
        assert str(refused.value) == (
            f"tasks: cannot retry a task that is {status}; only a failed task can be retried"
        )
        assert model_text(refused.value) == (
            f"tasks: cannot retry a task that is {name}; only a failed task can be retried"
        )
        assert refused.value.info.status == status and refused.value.info.task_id == t
        assert row(t).run_id == before.run_id and len(runs_of(t)) == 1


@override_settings(AGENTTASKS={"MAX_ATTEMPTS": 2})
def test_7_2_4_retry_stops_at_the_attempt_limit(h):
    t = h.spawn()
    h.fail(t, "one")
    lifecycle.retry(t)
    h.fail(t, "two")
    with pytest.raises(RetryLimit) as refused:
        lifecycle.retry(t)
    assert (
        str(refused.value)
        == "tasks: this task has already used its 2 attempts; start a new task instead"
    )
    task = row(t)
    assert task.attempt == 2 and task.status == "failed" and len(runs_of(t)) == 2


@override_settings(AGENTTASKS={"MAX_ATTEMPTS": 1})
def test_7_2_5_a_limit_of_one_disables_retrying(h):
    t = h.spawn()
    h.fail(t, "once")
    with pytest.raises(RetryLimit) as refused:
        lifecycle.retry(t)
    assert (
        str(refused.value)
        == "tasks: this task has already used its 1 attempts; start a new task instead"
    )
    assert row(t).attempt == 1 and len(runs_of(t)) == 1


@override_settings(AGENTTASKS={"MAX_CONCURRENT_PER_PARENT": 2})
def test_7_2_6_a_retry_takes_a_concurrency_slot(h):
    t = h.spawn()
    h.fail(t, "flaky")
    h.spawn()
    h.spawn()
    with pytest.raises(TaskLimit) as refused:
        lifecycle.retry(t)
    assert refused.value.limit == 2
    task = row(t)
    assert task.status == "failed" and task.attempt == 1
    assert len(runs_of(t)) == 1


def test_7_2_7_concurrent_retries_produce_one_run(h):
    # [concurrent] real threads, each on its own connection: PostgreSQL row locks, or SQLite's
    # IMMEDIATE transactions, let exactly one retry_claim win.
    t = h.spawn()
    h.fail(t, "flaky")
    first_run = row(t).run_id
    results = run_threads(lambda i: lifecycle.retry(t), 6)
    winners = [r for r in results if not isinstance(r, BaseException)]
    assert len(winners) == 1, results
    losers = [r for r in results if isinstance(r, BaseException)]
    assert all(isinstance(r, TaskError) for r in losers), losers
    task = row(t)
    assert task.attempt == 2 and winners[0].attempt == 2 and task.run_id == winners[0].run_id
    assert Run.objects.filter(conversation_id=task.conversation_id).count() == 2
    retry_runs = [r for r in h.queue.run_ids if r != first_run]
    assert retry_runs == [task.run_id]


def test_7_2_8_a_retry_launch_failure_puts_the_task_back(h):
    t = h.spawn()
    h.fail(t, "flaky")
    h.queue.fail_with = RuntimeError("queue down")
    with pytest.raises(LaunchFailed) as refused:
        lifecycle.retry(t)
    assert str(refused.value) == "tasks: restarting task run: queue down"
    assert refused.value.info.status == "failed" and refused.value.info.attempt == 1
    task = row(t)
    assert task.status == "failed" and task.attempt == 1
    assert "retry could not start" in task.summary
    last = h.log.finished[-1]
    assert last.id == t and last.summary == task.summary
    retry_run = runs_of(t)[-1]
    assert retry_run.trigger == "retry" and retry_run.status == "failed"
    pending = Wakeup.objects.filter(task_id=t, state="pending")
    assert pending.count() == 1 and pending.get().run_id == retry_run.id
    assert [w.state for w in wakeups_of(t)] == ["dropped", "pending"]


def test_7_2_9_launch_failures_spend_no_attempts(h):
    t = h.spawn()
    h.fail(t, "flaky")
    h.queue.fail_with = RuntimeError("queue down")
    for _ in range(app_settings.MAX_ATTEMPTS + 1):
        with pytest.raises(LaunchFailed):
            lifecycle.retry(t)
        assert row(t).attempt == 1
    h.queue.fail_with = None
    info = lifecycle.retry(t)
    assert info.attempt == 2 and info.status == "pending" and row(t).attempt == 2


def test_7_2_10_the_debt_of_a_failed_retry_follows_the_caller(h):
    # (a) the model's own task_retry call: it was told, so the debt is consumed.
    a = h.spawn()
    h.fail(a, "flaky")
    h.queue.fail_with = RuntimeError("queue down")
    output = h.tool("task_retry").call({"task_id": a}, "call-1")
    assert output.is_error
    assert "retry could not start" in output.text
    assert h.log.delivered[-1].id == a
    assert Wakeup.objects.get(task_id=a, run_id=row(a).run_id).state == "consumed"
    # (b) lifecycle.retry (a person or site code): the model still has to hear of it.
    h.queue.fail_with = None
    b = h.spawn()
    h.fail(b, "flaky")
    h.queue.fail_with = RuntimeError("queue down")
    with pytest.raises(LaunchFailed):
        lifecycle.retry(b)
    finished_b = [s for s in h.log.finished if s.id == b]
    assert len(finished_b) == 2
    assert finished_b[0].summary == "flaky" and "retry could not start" in finished_b[1].summary
    assert Wakeup.objects.get(task_id=b, run_id=row(b).run_id).state == "pending"
    assert not [s for s in h.log.delivered if s.id == b]


def test_7_2_11_a_retry_launch_failure_wakes_waiters(h, monkeypatch):
    # [concurrent] the waiter is a thread on its own connection. Its poll interval is stretched
    # past the 1 s bound, so only a wake-up (not a poll) can return it in time.
    monkeypatch.setattr(lifecycle.reading, "STATUS_POLL", 5.0)
    t = h.spawn()
    h.fail(t, "flaky")
    waiting = threading.Event()
    answer: dict = {}

    def waiter():
        try:
            waiting.set()
            began = time.monotonic()
            answer["info"] = lifecycle.status(t, wait=10)
            answer["elapsed"] = time.monotonic() - began
        finally:
            connection.close()

    thread = threading.Thread(target=waiter)

    def start_waiter_then_raise(run_id):
        thread.start()
        assert waiting.wait(5)
        raise RuntimeError("queue down")

    h.queue.before_enqueue = start_waiter_then_raise
    with pytest.raises(LaunchFailed):
        lifecycle.retry(t)
    thread.join(10)
    assert not thread.is_alive()
    assert answer["info"].status == "failed"
    assert answer["elapsed"] < 1.0, answer


def test_7_2_12_the_next_ending_still_wakes_the_parent(h):
    t = h.spawn()
    h.fail(t, "flaky")
    lifecycle.retry(t)
    h.finish(t, "completed", text="retried text")
    finished = [s for s in h.log.finished if s.id == t]
    assert len(finished) == 2
    assert "retried text" in finished[1].summary
    first, second = wakeups_of(t)
    assert (first.status, first.state) == ("failed", "dropped")
    assert (second.status, second.state) == ("completed", "pending")
    assert second.run_id == row(t).run_id


def test_7_2_13_a_stale_finalize_cannot_end_the_new_attempt(h):
    t = h.spawn()
    old_run = h.fail(t, "flaky").run_id
    lifecycle.retry(t)
    assert store.finalize(t, old_run, "cancelled") is None
    assert lifecycle.status(t).status == "pending"
    task = h.finish(t, "completed", text="done")
    assert (task.status, task.result) == ("completed", "done")


def test_7_2_14_a_stop_chases_one_retry(h, monkeypatch):
    t = h.spawn()
    h.start(t)

    def fail_and_retry_first(call_no):
        if call_no == 1:
            h.fail(t, "flaky")
            lifecycle.retry(t)

    answers = spy_request_stop(monkeypatch, before=fail_and_retry_first)
    info = lifecycle.stop(t)
    assert answers == [StopOutcome.MOVED, StopOutcome.UNKNOWN_RUN]
    assert info.status == "cancelled"
    task = row(t)
    assert task.status == "cancelled" and task.attempt == 2
    assert task.run.trigger == "retry" and task.run.status == "cancelled"


def test_7_2_15_a_stop_inside_the_retry_launch_window(h):
    t = h.spawn()
    h.fail(t, "flaky")
    stopped = {}
    on_retry_launch(h.queue, lambda tid: stopped.setdefault("info", lifecycle.stop(tid)))
    info = lifecycle.retry(t)
    assert stopped["info"].status == "cancelled"
    assert info.status == "cancelled"
    task = row(t)
    assert task.run.trigger == "retry" and task.run.status == "cancelled"
    assert store.claim(task.run_id, "w1") is None


def test_7_2_16_a_teardown_inside_the_spawn_launch_window(h):
    def teardown(run_id):
        h.queue.before_enqueue = None
        lifecycle.stop_tree(h.P)

    h.queue.before_enqueue = teardown
    info = lifecycle.spawn(h.P, "worker", "do it", label="job", parent_run=h.R)
    assert info.status == "cancelled"
    assert row(info.task_id).status == "cancelled"
    assert store.claim(info.run_id, "w1") is None


def test_7_2_17_a_graceful_stop_inside_the_launch_window(h, monkeypatch):
    t = h.spawn()
    h.fail(t, "flaky")
    answers = spy_request_stop(monkeypatch)
    stopped = {}
    on_retry_launch(
        h.queue, lambda tid: stopped.setdefault("info", lifecycle.stop(tid, graceful=True))
    )
    lifecycle.retry(t)
    assert answers == [StopOutcome.UNKNOWN_RUN]
    assert stopped["info"].status == "cancelled"
    task = row(t)
    assert task.status == "cancelled" and task.summary == "stopped"


def test_7_2_18_a_run_finishing_inside_the_launch_window_is_not_cancelled(h):
    t = h.spawn()
    h.fail(t, "flaky")
    on_retry_launch(h.queue, lambda tid: h.finish(tid, "completed", text="done"))
    info = lifecycle.retry(t)
    assert info.status == "completed"
    assert row(t).result == "done"
    assert list(Run.objects.exclude(stop_request="").values_list("id", flat=True)) == []


def test_7_2_19_a_fast_finish_is_delivered_only_on_the_model_path(h):
    # (a) through task_retry: the card carries the result, so the debt is settled.
    a = h.spawn()
    h.fail(a, "flaky")
    on_retry_launch(h.queue, lambda tid: h.finish(tid, "completed", text="done fast"))
    output = h.tool("task_retry").call({"task_id": a}, "call-1")
    assert "done fast" in output.text and not output.is_error
    assert [s.id for s in h.log.delivered] == [a]
    assert Wakeup.objects.get(task_id=a, run_id=row(a).run_id).state == "consumed"
    # (b) through lifecycle.retry: nobody told the model.
    b = h.spawn()
    h.fail(b, "flaky")
    on_retry_launch(h.queue, lambda tid: h.finish(tid, "completed", text="done fast"))
    info = lifecycle.retry(b)
    assert info.status == "completed" and info.result == "done fast"
    assert [s.id for s in h.log.delivered] == [a]
    assert Wakeup.objects.get(task_id=b, run_id=row(b).run_id).state == "pending"


def test_7_2_20_model_has_result_settles_only_what_the_model_was_handed(h):
    # (a) the model was told "working"; the row completed since: nothing is settled.
    t = h.spawn()
    h.start(t)
    told_working = lifecycle.status(t)
    assert told_working.status == "running"
    h.finish(t, "completed", text="done")
    lifecycle.model_has_result(told_working)
    assert Wakeup.objects.get(task_id=t).state == "pending"
    # (b) the model was handed the completed result: settled.
    lifecycle.model_has_result(lifecycle.status(t))
    assert Wakeup.objects.get(task_id=t).state == "consumed"
    # (c) an attempt-1 failure answered after a retry and a second failure settles nothing.
    u = h.spawn()
    h.fail(u, "first")
    first_info = lifecycle.status(u)
    assert first_info.status == "failed" and first_info.attempt == 1
    lifecycle.retry(u)
    h.fail(u, "second")
    lifecycle.model_has_result(first_info)
    newest = Wakeup.objects.get(task_id=u, run_id=row(u).run_id)
    assert newest.state == "pending" and newest.summary == "second"
    assert [s.id for s in h.log.delivered] == [t]


def test_7_2_21_a_stop_after_the_run_ended_keeps_the_real_outcome(h, monkeypatch):
    # [concurrent] the worker that recorded the ending applies it from another thread.
    t = h.spawn()
    h.start(t)
    task = row(t)
    outcome = RunOutcome(run_id=task.run_id, status="failed", error="the real failure")
    assert store.record_run_end(task.run_id, outcome)
    first_pass = threading.Event()
    answers = spy_request_stop(monkeypatch, after=lambda n: first_pass.set())

    def apply_late():
        try:
            assert first_pass.wait(5)
            time.sleep(0.1)  # staged: the ending lands 100 ms into the stop's settle wait
            lifecycle.on_run_finished(task.conversation_id, outcome)
        finally:
            connection.close()

    thread = threading.Thread(target=apply_late)
    thread.start()
    info = lifecycle.stop(t)
    thread.join(10)
    assert answers[0] is StopOutcome.ALREADY_FINISHED
    assert info.status == "failed"
    failed = row(t)
    assert failed.status == "failed" and failed.error == "the real failure"
    assert lifecycle.retry(t).attempt == 2


def test_7_2_22_an_outcome_that_never_lands_does_not_wedge_the_task(h, monkeypatch):
    t = h.spawn()
    h.start(t)
    run_id = row(t).run_id
    assert store.record_run_end(run_id, RunOutcome(run_id=run_id, status="completed", text="x"))
    answers = spy_request_stop(monkeypatch)
    began = time.monotonic()
    info = lifecycle.stop(t)
    elapsed = time.monotonic() - began
    assert elapsed < 3.0
    assert answers == [StopOutcome.ALREADY_FINISHED, StopOutcome.ALREADY_FINISHED]
    assert info.status == "cancelled" and row(t).status == "cancelled"


def test_7_2_23_retryable_is_about_the_task_not_the_parents_capacity(h):
    assert app_settings.MAX_ATTEMPTS == 3
    t = h.spawn()
    h.fail(t, "flaky")
    for _ in range(app_settings.MAX_CONCURRENT_PER_PARENT):
        h.spawn()
    task = row(t)
    # What a consumer derives as "retryable" holds, and yet the parent has no slot.
    assert task.status == "failed" and task.attempt_no() < app_settings.MAX_ATTEMPTS
    with pytest.raises(TaskLimit):
        lifecycle.retry(t)
    assert row(t).status == "failed" and row(t).attempt == 1


def test_a_retry_launch_failure_sends_the_callback_of_the_failure(user):
    """The failure the release writes is announced like any other: its callback is queued."""
    from agenttasks.broker import queue
    from agenttasks.types import RunOutcome

    with queue.use_backend(queue.RecordingQueue(run_jobs=False)) as recorded:
        task = lifecycle.create(
            owner=user, agent_id="worker", input="x", callback_url="https://93.184.216.34/cb"
        )
        store.claim(task.run_id, "w1")
        lifecycle.on_run_finished(
            task.conversation_id, RunOutcome(task.run_id, "failed", error="flaky")
        )
        recorded.jobs.clear()
        recorded.fail_with = RuntimeError("queue down")
        with pytest.raises(LaunchFailed):
            lifecycle.retry(task.id)
    released = row(task.id)
    assert released.status == "failed" and "retry could not start" in released.summary
    assert (
        "agenttasks.delivery.callbacks.send",
        (task.id, "failed", released.version),
    ) in recorded.jobs
