"""Continuations: scenarios 7.3.1–7.3.14 of docs/lifecycle.md, on the harness described there.

CONTINUE maps the kind `sequence` to `tests.hooks.sequence`, whose answers each test scripts.
The worker's RunContext is built from the run row (trigger, input, task link) and the task row
(kind, state) read after the claim; where a scenario speaks of "the run's context", the tests
assert those rows.
"""

import logging

import pytest
from django.db import DatabaseError
from django.test import override_settings

from agenttasks import lifecycle, store
from agenttasks.models import Run, Task, Wakeup
from agenttasks.states import TERMINAL
from agenttasks.types import ActionRequest, Continuation, RunOutcome

from .. import hooks
from ..harness import fail, finish, row, runs_of

pytestmark = pytest.mark.django_db(transaction=True)

CONTINUE = {"sequence": "tests.hooks.sequence"}
APPROVAL = ActionRequest(kind="approval", tool_name="deploy", tool_call_id="call-9", args={})


@pytest.fixture(autouse=True)
def _continue_setting():
    hooks.reset()
    with override_settings(AGENTTASKS={"CONTINUE": CONTINUE}):
        yield
    hooks.reset()


@pytest.fixture
def h(parent, parent_run, recording_queue, signal_log):
    """The scenarios' harness bound to P, R, the recording queue and the signal log."""
    return Harness(parent, parent_run, recording_queue, signal_log)


class Harness:
    def __init__(self, parent, parent_run, queue, log):
        self.P, self.R, self.queue, self.log = parent, parent_run, queue, log

    def spawn(self, kind="sequence", state=None):
        info = lifecycle.spawn(
            self.P, "worker", "do it", label="job", parent_run=self.R, kind=kind, state=state
        )
        return info.task_id

    def start(self, t):
        return store.claim(row(t).run_id, "w1")

    finish = staticmethod(finish)
    fail = staticmethod(fail)

    def finished(self, t):
        return [s for s in self.log.finished if s.id == t]

    def delivered(self, t):
        return [s for s in self.log.delivered if s.id == t]


def test_7_3_1_runs_chain_under_one_task(h):
    hooks.script[:] = [
        Continuation("next", {"step": 2}),
        Continuation("next", {"step": 3}),
        None,
    ]
    t = h.spawn(state={"step": 1})
    task = row(t)
    assert (task.kind, task.state) == ("sequence", {"step": 1})
    # The first run's context is built from these rows: its task is t, of kind `sequence`.
    first = task.run
    assert (first.task_id, first.trigger, first.input) == (t, "initial", "do it")

    task = h.finish(t, "completed", text="one")
    assert lifecycle.status(t).status == "pending"
    second = task.run
    assert second.id != first.id and second.task_id == t
    assert task.state == {"step": 2} and task.attempt == 1 and task.continuations == 1
    assert (second.trigger, second.input, second.status) == ("continuation", "next", "queued")
    assert not h.finished(t) and not Wakeup.objects.filter(task_id=t).exists()

    task = h.finish(t, "completed", text="two")
    third = task.run
    assert third.id not in (first.id, second.id)
    assert (task.state, task.continuations, third.input) == ({"step": 3}, 2, "next")
    assert not h.finished(t) and not Wakeup.objects.filter(task_id=t).exists()

    task = h.finish(t, "completed", text="three")
    assert (task.status, task.result, task.run_id) == ("completed", "three", third.id)
    assert task.attempt == 1 and task.state == {"step": 3}
    finished = h.finished(t)
    assert len(finished) == 1 and finished[0].run_id == third.id
    wakeup = Wakeup.objects.get(task_id=t)
    assert wakeup.run_id == third.id and wakeup.status == "completed"
    assert [c["run_id"] for c in hooks.calls] == [first.id, second.id, third.id]


def test_7_3_2_a_hook_error_fails_the_task(h):
    hooks.script[:] = [RuntimeError("the sequence is looping")]
    t = h.spawn(state={"step": 1})
    task = h.finish(t, "completed", text="one")
    assert (task.status, task.summary) == ("failed", "the sequence is looping")
    finished = h.finished(t)
    assert len(finished) == 1 and finished[0].status == "failed"
    assert finished[0].summary == "the sequence is looping"
    assert len(runs_of(t)) == 1


def test_7_3_3_a_continuation_launch_failure_fails_the_task(h):
    hooks.script[:] = [Continuation("next", {"step": 2})]
    t = h.spawn(state={"step": 1})
    first_run = row(t).run_id
    h.queue.fail_with = RuntimeError("queue down")
    task = h.finish(t, "completed", text="one")
    assert task.status == "failed" and task.run_id != first_run
    assert task.run.trigger == "continuation" and task.run.status == "failed"
    assert task.summary.startswith("could not start the next run: ")
    assert task.summary == "could not start the next run: queue down"
    finished = h.finished(t)
    assert len(finished) == 1 and finished[0].run_id == task.run_id


def test_7_3_4_an_ending_writes_the_final_state(h):
    hooks.script[:] = [Continuation(state={"final": True})]
    t = h.spawn(state={"step": 1})
    task = h.finish(t, "completed", text="all done")
    assert (task.status, task.state, task.result) == ("completed", {"final": True}, "all done")
    (snapshot,) = h.finished(t)
    assert snapshot.status == "completed" and snapshot.state == {"final": True}

    hooks.script[:] = [Continuation(state={"steps": 3}, error="budget exhausted: 3 of 3 steps")]
    u = h.spawn(state={"step": 1})
    task = h.finish(u, "completed", text="step three")
    assert task.status == "failed"
    assert task.summary == "budget exhausted: 3 of 3 steps"
    assert task.state == {"steps": 3}
    (snapshot,) = h.finished(u)
    assert snapshot.status == "failed" and snapshot.state == {"steps": 3}
    assert len(runs_of(t)) == 1 and len(runs_of(u)) == 1


def test_7_3_5_a_paused_row_is_not_advanced(h):
    hooks.script[:] = [Continuation("next", {"step": 2})]
    t = h.spawn(state={"step": 1})
    task = h.finish(t, "input_required", actions=(APPROVAL,))
    assert task.status == "waiting_for_input" and task.run.status == "paused"
    x = task.run_id
    task = h.finish(t, "completed", text="done anyway", run_id=x)
    assert (task.status, task.run_id, task.result) == ("completed", x, "done anyway")
    assert hooks.calls == []
    assert len(h.finished(t)) == 1 and len(runs_of(t)) == 1


def test_7_3_6_continuing_needs_a_run_id(h, caplog):
    hooks.script[:] = [Continuation("next", {"step": 2})]
    t = h.spawn(state={"step": 1})
    h.start(t)
    current = row(t).run_id
    with caplog.at_level(logging.WARNING, logger="agenttasks.lifecycle"):
        task = h.finish(t, "completed", text="done", run_id=None)
    assert (task.status, task.run_id, task.result) == ("completed", current, "done")
    assert hooks.calls == []
    assert (
        "task outcome without a run id: Continue not consulted; a job of several runs needs "
        "run identity"
    ) in caplog.messages
    assert len(runs_of(t)) == 1


def test_7_3_7_an_advance_failure_fails_the_task(h, monkeypatch):
    hooks.script[:] = [Continuation("next", {"step": 2})]
    t = h.spawn(state={"step": 1})
    finished_run = row(t).run_id

    def broken_advance(*args, **kwargs):
        raise DatabaseError("connection lost")

    monkeypatch.setattr(store, "advance", broken_advance)
    task = h.finish(t, "completed", text="one")
    assert (task.status, task.run_id) == ("failed", finished_run)
    assert "could not advance" in task.summary
    # The database's own text goes to the log, not into the task.
    assert task.summary == "could not advance to the next run: A database error occurred"
    assert task.state == {"step": 1}
    finished = h.finished(t)
    assert len(finished) == 1 and finished[0].status == "failed"
    assert len(runs_of(t)) == 1


def test_7_3_8_cancellations_and_stale_runs_are_skipped(h):
    hooks.script[:] = [Continuation("next", {"step": 2})] * 2
    t = h.spawn(state={"step": 1})
    h.start(t)
    # run_old: a run of this task that the task no longer names.
    Run.objects.create(
        id="run_old",
        conversation_id=row(t).conversation_id,
        task_id=t,
        agent="worker",
        trigger="initial",
        status="running",
    )
    before = row(t)
    task = h.finish(t, "completed", text="stale", run_id="run_old")
    assert hooks.calls == []
    assert (task.status, task.run_id, task.state, task.result, task.continuations) == (
        before.status,
        before.run_id,
        before.state,
        before.result,
        before.continuations,
    )
    assert task.updated_at == before.updated_at
    assert not h.finished(t) and not Wakeup.objects.filter(task_id=t).exists()

    task = h.finish(t, "cancelled")
    assert (task.status, task.run_id) == ("cancelled", before.run_id)
    assert hooks.calls == []
    assert not h.finished(t) and len(h.delivered(t)) == 1


def test_7_3_9_a_retry_carries_kind_and_state(h):
    t = h.spawn(state={"step": 2})
    h.fail(t, "flaky")
    info = lifecycle.retry(t)
    task = row(t)
    # The retry run's context is built from these rows.
    assert task.run.task_id == t and info.task_id == t
    assert (task.kind, task.state) == ("sequence", {"step": 2})
    assert (info.kind, info.state) == ("sequence", {"step": 2})
    assert task.run.trigger == "retry"  # is_retry
    assert task.attempt == 2


def test_7_3_10_a_stop_inside_the_continuation_launch(h):
    hooks.script[:] = [Continuation("next", {"step": 2})]
    t = h.spawn(state={"step": 1})
    first_run = row(t).run_id
    stopped = {}

    def stop_in_launch(run_id):
        h.queue.before_enqueue = None
        stopped["info"] = lifecycle.stop(t)
        stopped["run_id"] = run_id

    h.queue.before_enqueue = stop_in_launch
    task = h.finish(t, "completed", text="one")
    assert stopped["info"].status == "cancelled"
    advanced = stopped["run_id"]
    assert advanced != first_run
    assert (task.status, task.run_id) == ("cancelled", advanced)
    runs = runs_of(t)
    assert [r.id for r in runs] == [first_run, advanced]
    assert runs[1].status == "cancelled" and runs[1].trigger == "continuation"
    assert not h.finished(t)
    assert len(h.delivered(t)) == 1


def test_7_3_11_a_continuation_without_state_keeps_the_recorded_one(h):
    hooks.script[:] = [Continuation("next")]
    t = h.spawn(state={"step": 1})
    first_run = row(t).run_id
    task = h.finish(t, "completed", text="one")
    assert task.status == "pending" and task.run_id != first_run
    # The second run's context is built from the task row: the recorded state.
    assert task.state == {"step": 1}
    assert (task.run.trigger, task.run.input, task.run.task_id) == ("continuation", "next", t)
    assert store.claim(task.run_id, "w1")
    assert row(t).state == {"step": 1}


def test_7_3_12_no_continuation_after_a_graceful_stop(h):
    hooks.script[:] = [Continuation("next", {"step": 2})]
    t = h.spawn(state={"step": 1})
    task = h.finish(t, "failed", error="stopped mid-step", graceful=True)
    assert hooks.calls == []
    assert task.status in TERMINAL
    assert len(runs_of(t)) == 1


def test_7_3_13_a_late_pause_in_the_hook_window_does_not_strand_the_row(h, monkeypatch):
    pauses: list = []
    real_pause = store.pause

    def spy_pause(*args, **kwargs):
        answer = real_pause(*args, **kwargs)
        pauses.append(answer)
        return answer

    monkeypatch.setattr(store, "pause", spy_pause)
    seen: list[str] = []

    def pause_then_continue(task, outcome):
        late = RunOutcome(run_id=outcome.run_id, status="input_required", actions=(APPROVAL,))
        lifecycle.on_run_finished(task.conversation_id, late)
        seen.append(Task.objects.get(pk=task.id).status)
        return Continuation("next", {"step": 2})

    hooks.script[:] = [pause_then_continue]
    t = h.spawn(state={"step": 1})
    first_run = row(t).run_id
    task = h.finish(t, "completed", text="one")
    assert pauses == [None]
    assert seen == ["running"]
    assert task.status == "pending" and task.run_id != first_run
    assert task.state == {"step": 2} and task.continuations == 1
    statuses = task.conversation.events.filter(type="task.status").values_list("data", flat=True)
    assert "waiting_for_input" not in [d["to"] for d in statuses]
    assert len(runs_of(t)) == 2


@override_settings(AGENTTASKS={"CONTINUE": CONTINUE, "MAX_CONTINUATIONS": 2})
def test_7_3_14_the_ceiling_ends_an_endless_chain(h):
    answered = []

    def always_continue(task, outcome):
        answered.append(len(answered) + 1)
        return Continuation("again", {"n": len(answered)})

    hooks.fallback = always_continue
    t = h.spawn(state={"n": 0})
    task = h.finish(t, "completed", text="one")
    assert (task.status, task.continuations, task.state) == ("pending", 1, {"n": 1})
    task = h.finish(t, "completed", text="two")
    assert (task.status, task.continuations, task.state) == ("pending", 2, {"n": 2})
    task = h.finish(t, "completed", text="three")
    assert task.status == "failed"
    assert task.summary == "stopped after 3 runs: the task's continuation ceiling (2) was reached"
    assert task.state == {"n": 2}  # the hook's third answer ({"n": 3}) was not written
    assert answered == [1, 2, 3]
    assert len(runs_of(t)) == 3
    assert len(h.finished(t)) == 1

    info = lifecycle.retry(t)
    assert info.status == "pending" and row(t).continuations == 0
    task = h.finish(t, "completed", text="four")
    assert (task.status, task.continuations, task.run.trigger) == ("pending", 1, "continuation")
    assert task.attempt == 2 and task.state == {"n": 4}
    assert len(runs_of(t)) == 5


def test_the_default_ceiling_is_50_continuations(h):
    """Without MAX_CONTINUATIONS a chain gets 50 continuations: 51 runs, the last one failed."""
    hooks.fallback = lambda task, outcome: Continuation("again", {"n": task.continuations + 1})
    t = h.spawn(state={"n": 0})
    for step in range(1, 51):
        task = h.finish(t, "completed", text=f"run {step}")
        assert (task.status, task.continuations) == ("pending", step)
    task = h.finish(t, "completed", text="run 51")
    assert task.status == "failed"
    assert task.summary == "stopped after 51 runs: the task's continuation ceiling (50) was reached"
    assert task.state == {"n": 50}
    assert len(runs_of(t)) == 51
    assert len(h.finished(t)) == 1
