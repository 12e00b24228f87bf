"""A comment or message to a busy task, by multitask strategy (docs/lifecycle.md#busy-tasks).

`reject` refuses it (today's 409); `enqueue` keeps it as a run of the task that waits its turn and
re-opens the task when it has ended; `interrupt` and `rollback` stop the current run and move the
task to the newer message's run without ending it; `steer` hands it to the run that is going.
Runs execute in this thread (the recording queue), or in a thread where a run must be executing.
"""

import time

import pytest
from django.db import models
from django.test import override_settings

from agenttasks import lifecycle, registry
from agenttasks.exceptions import ConversationBusy, InvalidField, TaskBusy
from agenttasks.execution import worker
from agenttasks.models import Comment, Event, PendingAction, Run, Task
from agenttasks.runtime.base import Reply
from agenttasks.states import RunStatus, TaskStatus

from ..conftest import run_threads, wait_for
from ..fake_model import in_thread, run_to_idle

pytestmark = pytest.mark.django_db(transaction=True)


def transcript(task: Task) -> list[tuple[str, str]]:
    rows = Event.objects.filter(
        conversation_id=task.conversation_id, type__in=["message.user", "message.assistant"]
    ).order_by("seq")
    return [(e.type.split(".")[1], e.data["content"]) for e in rows]


def statuses(task: Task) -> list[str]:
    """The task's status changes, in order (from its task.status events)."""
    rows = Event.objects.filter(conversation_id=task.conversation_id, type="task.status")
    return [e.data["to"] for e in rows.order_by("seq")]


def current(task: Task) -> Task:
    return Task.objects.select_related("run").get(pk=task.pk)


@pytest.fixture
def echo_task(user):
    return lifecycle.create(owner=user, agent_id="echo", input="go")


def test_reject_is_the_default_and_refuses_a_busy_task(echo_task, recording_queue):
    with pytest.raises(TaskBusy):
        lifecycle.send_to_task(echo_task.id, "more")
    with pytest.raises(ConversationBusy):
        lifecycle.post_message(echo_task.conversation_id, "more", strategy="reject")
    with pytest.raises(InvalidField) as refused:
        lifecycle.send_to_task(echo_task.id, "more", strategy="sideways")
    assert str(refused.value) == (
        "multitaskStrategy must be one of reject, enqueue, interrupt, rollback, steer"
    )
    assert Run.objects.filter(task_id=echo_task.id).count() == 1
    assert not Comment.objects.filter(task_id=echo_task.id).exists()


def test_enqueued_comments_re_open_the_task_in_the_order_written(echo_task, user, recording_queue):
    waiting = []
    for text in ("two", "three"):
        sent = lifecycle.send_to_task(echo_task.id, text, strategy="enqueue", author=user)
        assert (sent.run.status, sent.comment, sent.task.status) == (
            RunStatus.WAITING,
            None,
            TaskStatus.PENDING,
        )
        waiting.append(sent.run.id)
    # A message to the task's conversation may wait its turn too.
    run, event = lifecycle.post_message(echo_task.conversation_id, "four", strategy="enqueue")
    assert (run.status, event) == (RunStatus.WAITING, None)
    waiting.append(run.id)
    assert transcript(echo_task) == [("user", "go")]  # nothing enters before its turn
    assert run_to_idle(recording_queue) == [echo_task.run_id, *waiting]
    assert transcript(echo_task) == [
        ("user", "go"),
        ("assistant", "Echo: go"),
        ("user", "two"),
        ("assistant", "Echo: two"),
        ("user", "three"),
        ("assistant", "Echo: three"),
        ("user", "four"),
        ("assistant", "Echo: four"),
    ]
    task = current(echo_task)
    assert (task.status, task.result, task.run_id) == (TaskStatus.COMPLETED, "Echo: four", run.id)
    comments = Comment.objects.filter(task_id=task.id).order_by("created_at", "id")
    assert [(c.content, c.run_id) for c in comments] == list(
        zip(["two", "three", "four"], waiting, strict=True)
    )
    assert comments[0].author_id == user.pk
    # Each comment re-opened the ended task, as a comment posted then would have.
    assert statuses(echo_task).count(TaskStatus.COMPLETED) == 4


def test_an_enqueue_to_a_task_that_ended_re_opens_it_at_once(echo_task, recording_queue):
    run_to_idle(recording_queue)
    sent = lifecycle.send_to_task(echo_task.id, "again", strategy="enqueue")
    assert sent.comment is not None and sent.run.status == RunStatus.QUEUED
    assert sent.task.status == TaskStatus.PENDING
    assert recording_queue.run_ids[-1] == sent.run.id


def test_a_person_who_stops_the_task_stops_what_waits_behind_it(echo_task, recording_queue):
    sent = lifecycle.send_to_task(echo_task.id, "later", strategy="enqueue")
    lifecycle.cancel(echo_task.id)
    run_to_idle(recording_queue)
    lifecycle.recover()
    assert Run.objects.get(pk=sent.run.id).status == RunStatus.CANCELLED
    assert current(echo_task).status == TaskStatus.CANCELLED
    assert not Comment.objects.filter(task_id=echo_task.id).exists()


@pytest.mark.parametrize("strategy", ["interrupt", "rollback"])
def test_a_queued_run_is_stopped_and_the_task_moves_to_the_newer_message(
    echo_task, recording_queue, strategy
):
    first = echo_task.run_id
    sent = lifecycle.send_to_task(echo_task.id, "instead", strategy=strategy)
    assert sent.comment is not None and sent.run.status == RunStatus.QUEUED
    expected = RunStatus.INTERRUPTED if strategy == "interrupt" else RunStatus.ROLLED_BACK
    assert Run.objects.get(pk=first).status == expected
    task = current(echo_task)
    assert (task.status, task.run_id) == (TaskStatus.PENDING, sent.run.id)
    run_to_idle(recording_queue)  # the first run's job finds it ended and does nothing
    assert transcript(echo_task) == [
        ("user", "go"),  # a task's input stays, even through a rollback
        ("user", "instead"),
        ("assistant", "Echo: instead"),
    ]
    assert current(echo_task).status == TaskStatus.COMPLETED
    assert TaskStatus.CANCELLED not in statuses(echo_task)  # it never ended on the way


@pytest.mark.parametrize("strategy", ["interrupt", "rollback"])
def test_a_pending_approval_is_cancelled_with_a_reason_or_forgotten(
    user, recording_queue, strategy
):
    task = lifecycle.create(owner=user, agent_id="approver", input="prod")
    run_to_idle(recording_queue)
    assert current(task).status == TaskStatus.WAITING_FOR_INPUT
    action = PendingAction.objects.get(task_id=task.id)
    with pytest.raises(ConversationBusy):  # reject: the action waits for its answer
        lifecycle.post_message(task.conversation_id, "staging")
    sent = lifecycle.send_to_task(task.id, "staging", strategy=strategy)
    assert current(task).status == TaskStatus.PENDING and sent.run.status == RunStatus.QUEUED
    if strategy == "interrupt":
        action.refresh_from_db()
        assert action.status == "cancelled"
        resolved = Event.objects.get(conversation_id=task.conversation_id, type="action.resolved")
        assert resolved.data["reason"] == "interrupted"
    else:
        assert not PendingAction.objects.filter(pk=action.id).exists()
        assert not Event.objects.filter(
            conversation_id=task.conversation_id, type__startswith="action."
        ).exists()


def blocker(ctx):
    """Run until told to stop when asked to block; answer at once otherwise."""
    while ctx.input == "block":
        ctx.check_cancelled()
        time.sleep(0.02)
    return Reply(content=f"done: {ctx.input}")


@pytest.fixture
def blocking_task(user):
    registry.register("blocker", runtime="callable", handler=blocker, replace=True)
    yield lifecycle.create(owner=user, agent_id="blocker", input="block")
    registry.unregister("blocker")


@pytest.mark.parametrize("strategy", ["interrupt", "rollback"])
def test_a_running_run_is_told_to_stop_and_its_end_hands_the_task_over(
    blocking_task, recording_queue, strategy
):
    task, first = blocking_task, blocking_task.run_id
    with override_settings(AGENTTASKS={"HEARTBEAT_INTERVAL": 0.2}):
        thread = in_thread(worker.execute_run, first)
        wait_for(lambda: Run.objects.get(pk=first).status == RunStatus.RUNNING)
        sent = lifecycle.send_to_task(task.id, "instead", strategy=strategy)
        assert (sent.run.status, sent.comment) == (RunStatus.WAITING, None)
        assert current(task).status == TaskStatus.RUNNING  # until its run has stopped
        thread.join(10)
    assert not thread.is_alive()
    expected = RunStatus.INTERRUPTED if strategy == "interrupt" else RunStatus.ROLLED_BACK
    assert Run.objects.get(pk=first).status == expected
    moved = current(task)
    assert (moved.status, moved.run_id) == (TaskStatus.PENDING, sent.run.id)
    assert recording_queue.run_ids[-1] == sent.run.id
    run_to_idle(recording_queue)
    assert transcript(task) == [
        ("user", "block"),
        ("user", "instead"),
        ("assistant", "done: instead"),
    ]
    assert current(task).status == TaskStatus.COMPLETED
    assert TaskStatus.CANCELLED not in statuses(task)
    finished = Event.objects.filter(conversation_id=task.conversation_id, type="run.finished")
    assert [e.data["status"] for e in finished.filter(run_id=first)] == (
        ["interrupted"] if strategy == "interrupt" else []
    )


def test_a_stopped_run_whose_newer_message_was_cancelled_ends_the_task(
    blocking_task, recording_queue
):
    task, first = blocking_task, blocking_task.run_id
    with override_settings(AGENTTASKS={"HEARTBEAT_INTERVAL": 0.2}):
        thread = in_thread(worker.execute_run, first)
        wait_for(lambda: Run.objects.get(pk=first).status == RunStatus.RUNNING)
        sent = lifecycle.send_to_task(task.id, "instead", strategy="interrupt")
        lifecycle.cancel_waiting(sent.run.id)
        thread.join(10)
    ended = current(task)
    assert (ended.status, ended.stop_reason) == (TaskStatus.CANCELLED, "stopped")
    assert Run.objects.get(pk=first).status == RunStatus.INTERRUPTED


# --- steer ---------------------------------------------------------------------------------------


def listener(ctx):
    return Reply(content="heard: " + ", ".join([ctx.input, *ctx.steered()]))


def deaf(ctx):
    return Reply(content=f"only: {ctx.input}")


@pytest.fixture
def steerable(user):
    registry.register("listener", runtime="callable", handler=listener, steerable=True)
    registry.register("deaf", runtime="callable", handler=deaf, steerable=True)
    yield lambda agent: lifecycle.create(owner=user, agent_id=agent, input="go")
    for agent in ("listener", "deaf"):
        registry.unregister(agent)


def test_a_steered_comment_is_read_by_the_tasks_run(steerable, recording_queue):
    task = steerable("listener")
    sent = lifecycle.send_to_task(task.id, "also this", strategy="steer")
    assert sent.run.id == task.run_id and sent.event.type == "message.steer"
    assert run_to_idle(recording_queue) == [task.run_id]  # no run of its own
    assert transcript(task) == [
        ("user", "go"),
        ("user", "also this"),
        ("assistant", "heard: go, also this"),
    ]
    assert current(task).result == "heard: go, also this"


def test_a_steered_comment_the_run_never_read_re_opens_the_task(steerable, recording_queue):
    task = steerable("deaf")
    lifecycle.send_to_task(task.id, "also this", strategy="steer")
    executed = run_to_idle(recording_queue)
    assert len(executed) == 2 and executed[0] == task.run_id
    assert transcript(task)[-2:] == [("user", "also this"), ("assistant", "only: also this")]
    assert current(task).status == TaskStatus.COMPLETED
    assert not Run.objects.filter(steers__gt=models.F("steers_taken")).exists()


def test_where_the_task_cannot_be_steered_the_agents_fallback_applies(
    echo_task, user, recording_queue
):
    sent = lifecycle.send_to_task(echo_task.id, "more", strategy="steer")  # echo: not steerable
    assert (sent.run.status, sent.event) == (RunStatus.WAITING, None)  # fallback: enqueue
    delegate = Task.objects.filter(pk=echo_task.pk).update(kind="delegate")
    assert delegate == 1
    with pytest.raises(TaskBusy):  # a delegate task is its caller's: refused whatever the strategy
        lifecycle.send_to_task(echo_task.id, "more", strategy="interrupt")


@pytest.mark.parametrize("round_no", range(20))
def test_racing_comments_of_every_strategy_leave_the_task_one_run(
    steerable, recording_queue, round_no
):
    task = steerable("listener")
    strategies = ["reject", "enqueue", "interrupt", "rollback", "steer", "enqueue"]

    def send(i):
        return lifecycle.send_to_task(task.id, f"m{i}", strategy=strategies[i])

    results = run_threads(send, len(strategies))
    refused = {strategies[i]: r for i, r in enumerate(results) if isinstance(r, BaseException)}
    assert all(isinstance(r, TaskBusy) for r in refused.values()), refused
    assert set(refused) <= {"reject"}  # only reject refuses a busy task
    going = Run.objects.filter(task_id=task.id, status__in=["queued", "running"])
    assert going.count() == 1, list(Run.objects.values_list("input", "status"))
    assert current(task).run_id == going.get().id
    run_to_idle(recording_queue)
    assert not Run.objects.filter(task_id=task.id).unfinished().exists()
    assert current(task).status == TaskStatus.COMPLETED
    assert not Run.objects.filter(steers__gt=models.F("steers_taken")).exists()
