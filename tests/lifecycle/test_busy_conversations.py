"""A message to a busy conversation, by multitask strategy (docs/lifecycle.md#busy-conversations).

`reject` refuses it (today's 409); `enqueue` stores it at once as a run that waits its turn and
starts, in the order written, when the conversation is idle; its message enters the transcript
then. Runs execute in this thread (the recording queue); the races are real threads.
"""

import time

import pytest
from django.db import models
from django.test import override_settings

from agenttasks import lifecycle, registry, store
from agenttasks.exceptions import ConversationBusy, InvalidField, RunNotWaiting
from agenttasks.execution import worker
from agenttasks.models import Event, File, PendingAction, Run, Task
from agenttasks.runtime.base import Reply
from agenttasks.states import RunStatus

from ..conftest import run_threads, wait_for
from ..fake_model import in_thread, run_to_idle

pytestmark = pytest.mark.django_db(transaction=True)


def transcript(conversation_id: str) -> list[tuple[str, str]]:
    rows = Event.objects.filter(
        conversation_id=conversation_id, type__in=["message.user", "message.assistant"]
    ).order_by("seq")
    return [(e.type.split(".")[1], e.data["content"]) for e in rows]


@pytest.fixture
def chat(user):
    return lifecycle.create_conversation(owner=user, agent_id="echo")


def test_reject_is_the_default_and_refuses_a_busy_conversation(chat, recording_queue):
    first, _ = lifecycle.post_message(chat.id, "one")
    with pytest.raises(ConversationBusy) as refused:
        lifecycle.post_message(chat.id, "two")
    assert refused.value.run_id == first.id
    with pytest.raises(ConversationBusy):
        lifecycle.post_message(chat.id, "two", strategy="reject")
    assert Run.objects.filter(conversation_id=chat.id).count() == 1


def test_enqueued_messages_run_in_the_order_written_and_enter_the_transcript_then(
    chat, recording_queue
):
    first, _ = lifecycle.post_message(chat.id, "one")
    waiting = []
    for text in ("two", "three", "four"):
        run, event = lifecycle.post_message(chat.id, text, strategy="enqueue")
        assert (run.status, event) == (RunStatus.WAITING, None)
        waiting.append(run.id)
    assert recording_queue.run_ids == [first.id]  # no job for a waiting run
    assert transcript(chat.id) == [("user", "one")]  # not in the transcript yet
    # A message with the default strategy is refused while runs wait, too.
    with pytest.raises(ConversationBusy):
        lifecycle.post_message(chat.id, "five")
    assert run_to_idle(recording_queue) == [first.id, *waiting]
    assert transcript(chat.id) == [
        ("user", "one"),
        ("assistant", "Echo: one"),
        ("user", "two"),
        ("assistant", "Echo: two"),
        ("user", "three"),
        ("assistant", "Echo: three"),
        ("user", "four"),
        ("assistant", "Echo: four"),
    ]
    ran = Run.objects.filter(pk__in=waiting)
    assert set(ran.values_list("status", flat=True)) == {RunStatus.COMPLETED}
    assert all(message is None for message in ran.values_list("message", flat=True))


def test_an_enqueue_to_an_idle_conversation_starts_at_once(chat, recording_queue):
    run, event = lifecycle.post_message(chat.id, "one", strategy="enqueue")
    assert run.status == RunStatus.QUEUED and event.data["content"] == "one"
    assert recording_queue.run_ids == [run.id]


def test_a_waiting_run_can_be_cancelled_and_its_message_is_never_posted(chat, recording_queue):
    first, _ = lifecycle.post_message(chat.id, "one")
    dropped, _ = lifecycle.post_message(chat.id, "two", strategy="enqueue")
    kept, _ = lifecycle.post_message(chat.id, "three", strategy="enqueue")
    cancelled = lifecycle.cancel_waiting(dropped.id)
    assert cancelled.status == RunStatus.CANCELLED and cancelled.ended_at is not None
    with pytest.raises(RunNotWaiting):
        lifecycle.cancel_waiting(dropped.id)
    with pytest.raises(RunNotWaiting):
        lifecycle.cancel_waiting(first.id)  # it is queued: a started run is not cancelled here
    assert run_to_idle(recording_queue) == [first.id, kept.id]
    assert [text for _, text in transcript(chat.id)] == ["one", "Echo: one", "three", "Echo: three"]


def test_a_strategy_the_write_cannot_follow_is_refused_and_writes_nothing(
    chat, user, recording_queue
):
    lifecycle.post_message(chat.id, "one")
    with pytest.raises(InvalidField) as refused:
        lifecycle.post_message(chat.id, "two", strategy="sideways")
    assert (str(refused.value), refused.value.field) == (
        "multitaskStrategy must be one of reject, enqueue, interrupt, rollback, steer",
        "multitaskStrategy",
    )
    assert Run.objects.filter(conversation_id=chat.id).count() == 1


def test_a_release_lost_to_a_crash_is_made_by_the_reaper_pass(chat, recording_queue):
    first, _ = lifecycle.post_message(chat.id, "one")
    waiting, _ = lifecycle.post_message(chat.id, "two", strategy="enqueue")
    # The run ends, but the job that would release the next one is lost.
    recording_queue.run_jobs = False
    run_to_idle(recording_queue)
    assert Run.objects.get(pk=waiting.id).status == RunStatus.WAITING
    recording_queue.run_jobs = True
    lifecycle.recover()
    assert Run.objects.get(pk=waiting.id).status == RunStatus.QUEUED
    assert run_to_idle(recording_queue) == [waiting.id]
    assert transcript(chat.id)[-1] == ("assistant", "Echo: two")


def test_deleting_the_conversation_cancels_its_waiting_runs(chat, recording_queue):
    lifecycle.post_message(chat.id, "one")
    waiting, _ = lifecycle.post_message(chat.id, "two", strategy="enqueue")
    store.stop_runs([chat.id])
    assert Run.objects.get(pk=waiting.id).status == RunStatus.CANCELLED


@pytest.mark.parametrize("round_no", range(20))
def test_racing_messages_of_mixed_strategies_start_one_run(chat, recording_queue, round_no):
    strategies = ["reject", "enqueue", "reject", "enqueue", "enqueue", "reject"]

    def send(i):
        return lifecycle.post_message(chat.id, f"m{i}", strategy=strategies[i])

    results = run_threads(send, len(strategies))
    started = [r for r in results if isinstance(r, tuple) and r[0].status == RunStatus.QUEUED]
    waiting = [r for r in results if isinstance(r, tuple) and r[0].status == RunStatus.WAITING]
    refused = [r for r in results if isinstance(r, ConversationBusy)]
    assert len(started) == 1, results
    assert len(started) + len(waiting) + len(refused) == len(strategies), results
    assert all(strategies[int(r[0].input[1:])] == "enqueue" for r in waiting)
    assert Run.objects.filter(conversation_id=chat.id, status=RunStatus.QUEUED).count() == 1
    run_to_idle(recording_queue)
    users = [text for role, text in transcript(chat.id) if role == "user"]
    assert len(users) == 1 + len(waiting)  # every accepted message ran, once


# --- interrupt and rollback ----------------------------------------------------------------------


def blocker(ctx):
    """Run until told to stop (a run that is executing when a newer message comes)."""
    while True:
        ctx.check_cancelled()
        time.sleep(0.02)


@pytest.fixture
def blocking_chat(user):
    registry.register("blocker", runtime="callable", handler=blocker, replace=True)
    yield lifecycle.create_conversation(owner=user, agent_id="blocker")
    registry.unregister("blocker")


def read_back(chat_id: str) -> dict:
    """What the conversation's reads show: messages, events, actions, files, children."""
    return {
        "events": list(Event.objects.filter(conversation_id=chat_id).values_list("type", "run_id")),
        "actions": PendingAction.objects.filter(conversation_id=chat_id).count(),
        "files": File.objects.filter(conversation_id=chat_id).count(),
        "children": Task.objects.filter(parent_conversation_id=chat_id).count(),
    }


@pytest.mark.parametrize("strategy", ["interrupt", "rollback"])
def test_a_queued_run_is_stopped_at_once_and_the_new_message_starts(
    chat, recording_queue, strategy
):
    first, _ = lifecycle.post_message(chat.id, "one")
    second, event = lifecycle.post_message(chat.id, "two", strategy=strategy)
    assert (second.status, event.data["content"]) == (RunStatus.QUEUED, "two")
    ended = Run.objects.get(pk=first.id)
    expected = RunStatus.INTERRUPTED if strategy == "interrupt" else RunStatus.ROLLED_BACK
    assert ended.status == expected and ended.ended_at is not None
    run_to_idle(recording_queue)  # the first run's job finds it ended and does nothing
    if strategy == "interrupt":
        assert transcript(chat.id) == [("user", "one"), ("user", "two"), ("assistant", "Echo: two")]
    else:
        assert transcript(chat.id) == [("user", "two"), ("assistant", "Echo: two")]
        assert not Event.objects.filter(conversation_id=chat.id, run_id=first.id).exists()


@pytest.mark.parametrize("strategy", ["interrupt", "rollback"])
def test_a_pending_approval_is_cancelled_with_a_reason_or_forgotten(
    user, recording_queue, strategy
):
    chat = lifecycle.create_conversation(owner=user, agent_id="approver")
    first, _ = lifecycle.post_message(chat.id, "prod")
    run_to_idle(recording_queue)
    action = PendingAction.objects.get(run_id=first.id)
    second, _ = lifecycle.post_message(chat.id, "staging", strategy=strategy)
    assert second.status == RunStatus.QUEUED
    if strategy == "interrupt":
        assert Run.objects.get(pk=first.id).status == RunStatus.INTERRUPTED
        action.refresh_from_db()
        assert action.status == "cancelled"
        resolved = Event.objects.get(conversation_id=chat.id, type="action.resolved")
        assert resolved.data == {
            "actionId": action.id,
            "kind": "approval",
            "status": "cancelled",
            "reason": "interrupted",
        }
        assert ("user", "prod") in transcript(chat.id)
    else:
        assert Run.objects.get(pk=first.id).status == RunStatus.ROLLED_BACK
        assert not PendingAction.objects.filter(pk=action.id).exists()
        assert read_back(chat.id) == {
            "events": [("message.user", second.id)],
            "actions": 0,
            "files": 0,
            "children": 0,
        }
    with pytest.raises(ConversationBusy):  # the new run holds the conversation now
        lifecycle.post_message(chat.id, "more")


@pytest.mark.parametrize("strategy", ["interrupt", "rollback"])
def test_a_running_run_is_told_to_stop_and_the_new_one_waits_for_its_end(
    blocking_chat, recording_queue, strategy
):
    chat = blocking_chat
    first, _ = lifecycle.post_message(chat.id, "one")
    with override_settings(AGENTTASKS={"HEARTBEAT_INTERVAL": 0.2}):
        thread = in_thread(worker.execute_run, first.id)
        wait_for(lambda: Run.objects.get(pk=first.id).status == RunStatus.RUNNING)
        second, event = lifecycle.post_message(chat.id, "two", strategy=strategy)
        assert (second.status, event) == (RunStatus.WAITING, None)
        thread.join(10)
    assert not thread.is_alive()
    expected = RunStatus.INTERRUPTED if strategy == "interrupt" else RunStatus.ROLLED_BACK
    assert Run.objects.get(pk=first.id).status == expected
    # Its ending released the new run, whose message is in the transcript now.
    assert Run.objects.get(pk=second.id).status == RunStatus.QUEUED
    assert recording_queue.run_ids[-1] == second.id
    users = [text for role, text in transcript(chat.id) if role == "user"]
    assert users == (["one", "two"] if strategy == "interrupt" else ["two"])
    finished = Event.objects.filter(conversation_id=chat.id, type="run.finished", run_id=first.id)
    assert [e.data["status"] for e in finished] == (
        ["interrupted"] if strategy == "interrupt" else []
    )


def test_a_rollback_forgets_the_files_and_tasks_of_the_run_and_waiting_runs(user, recording_queue):
    chat = lifecycle.create_conversation(owner=user, agent_id="approver")
    first, _ = lifecycle.post_message(chat.id, "prod")
    waiting, _ = lifecycle.post_message(chat.id, "later", strategy="enqueue")
    File.objects.create(
        conversation=chat,
        owner=user,
        name="a.txt",
        mime_type="text/plain",
        size=1,
        sha256="0",
        storage_name="agenttasks/x",
    )
    brought = File.objects.get(conversation=chat)
    message = Event.objects.get(conversation_id=chat.id, run_id=first.id, type="message.user")
    message.data = {**message.data, "files": [brought.ref()]}
    message.save()
    child = lifecycle.create(owner=user, agent_id="echo", input="child")
    Task.objects.filter(pk=child.id).update(parent_conversation=chat, parent_run=first)
    second, _ = lifecycle.post_message(chat.id, "again", strategy="rollback")
    assert Run.objects.get(pk=waiting.id).status == RunStatus.CANCELLED  # never posted
    assert read_back(chat.id) == {
        "events": [("message.user", second.id)],
        "actions": 0,
        "files": 0,
        "children": 0,
    }
    assert not Task.objects.filter(pk=child.id).exists()  # its tree was stopped and deleted
    assert Run.objects.get(pk=first.id).status == RunStatus.ROLLED_BACK  # kept for operators


# --- steer ---------------------------------------------------------------------------------------


def listener(ctx):
    """A callable agent that takes steering: it answers what it was told, steered messages too."""
    return Reply(content="heard: " + ", ".join([ctx.input, *ctx.steered()]))


def deaf(ctx):
    """Registered steerable, but never reads what is steered to it."""
    return Reply(content=f"only: {ctx.input}")


@pytest.fixture
def steerable(user):
    registry.register("listener", runtime="callable", handler=listener, steerable=True)
    registry.register("deaf", runtime="callable", handler=deaf, steerable=True)
    registry.register("refuser", runtime="callable", handler=deaf, steer_fallback="reject")
    yield lambda agent: lifecycle.create_conversation(owner=user, agent_id=agent)
    for agent in ("listener", "deaf", "refuser"):
        registry.unregister(agent)


def test_a_steered_message_is_written_at_once_and_taken_in_by_the_run(steerable, recording_queue):
    chat = steerable("listener")
    first, _ = lifecycle.post_message(chat.id, "one")
    run, event = lifecycle.post_message(chat.id, "two", strategy="steer")
    assert run.id == first.id and (event.type, event.run_id) == ("message.steer", first.id)
    assert event.data == {"content": "two", "origin": "steer"}
    assert transcript(chat.id) == [("user", "one")]  # not in the transcript before it is read
    assert run_to_idle(recording_queue) == [first.id]  # no run of its own
    assert transcript(chat.id) == [
        ("user", "one"),
        ("user", "two"),
        ("assistant", "heard: one, two"),
    ]
    taken = Event.objects.get(conversation_id=chat.id, type="message.user", data__origin="steer")
    assert (taken.run_id, taken.data["steerId"]) == (first.id, event.id)
    assert taken.seq > event.seq


def test_a_steered_message_the_run_never_read_gets_a_run_of_its_own(steerable, recording_queue):
    chat = steerable("deaf")
    first, _ = lifecycle.post_message(chat.id, "one")
    lifecycle.post_message(chat.id, "two", strategy="steer")
    executed = run_to_idle(recording_queue)
    assert len(executed) == 2 and executed[0] == first.id
    assert transcript(chat.id) == [
        ("user", "one"),
        ("assistant", "only: one"),
        ("user", "two"),
        ("assistant", "only: two"),
    ]


def test_where_no_run_can_be_steered_the_agents_fallback_applies(steerable, user, recording_queue):
    echo = lifecycle.create_conversation(owner=user, agent_id="echo")  # callable: not steerable
    lifecycle.post_message(echo.id, "one")
    run, event = lifecycle.post_message(echo.id, "two", strategy="steer")
    assert (run.status, event) == (RunStatus.WAITING, None)  # steer_fallback: enqueue
    refuser = steerable("refuser")
    lifecycle.post_message(refuser.id, "one")
    with pytest.raises(ConversationBusy):
        lifecycle.post_message(refuser.id, "two", strategy="steer")
    paused = lifecycle.create_conversation(owner=user, agent_id="approver")
    lifecycle.post_message(paused.id, "prod")
    run_to_idle(recording_queue)
    run, event = lifecycle.post_message(paused.id, "staging", strategy="steer")
    assert (run.status, event) == (RunStatus.WAITING, None)  # a paused run cannot read it


@pytest.mark.parametrize("round_no", range(20))
def test_racing_messages_of_every_strategy_leave_one_run_going(
    steerable, recording_queue, round_no
):
    chat = steerable("listener")
    lifecycle.post_message(chat.id, "first")
    strategies = ["reject", "enqueue", "interrupt", "rollback", "steer", "enqueue"]

    def send(i):
        return lifecycle.post_message(chat.id, f"m{i}", strategy=strategies[i])

    results = run_threads(send, len(strategies))
    refused = {strategies[i]: r for i, r in enumerate(results) if isinstance(r, BaseException)}
    assert all(isinstance(r, ConversationBusy) for r in refused.values()), refused
    assert set(refused) <= {"reject"}  # only reject refuses a busy conversation
    going = Run.objects.filter(conversation_id=chat.id, status__in=["queued", "running"])
    assert going.count() == 1, list(Run.objects.values_list("input", "status"))
    run_to_idle(recording_queue)
    assert not Run.objects.filter(conversation_id=chat.id).unfinished().exists()
    # Each accepted message was answered or stopped for a newer one; none is left unread.
    assert not Run.objects.filter(steers__gt=models.F("steers_taken")).exists()


def test_what_was_steered_to_an_interrupted_run_is_in_the_transcript_of_the_newer_one(
    steerable, recording_queue
):
    chat = steerable("listener")
    first, _ = lifecycle.post_message(chat.id, "one")
    lifecycle.post_message(chat.id, "two", strategy="steer")
    newer, _ = lifecycle.post_message(chat.id, "three", strategy="interrupt")
    assert Run.objects.get(pk=first.id).status == RunStatus.INTERRUPTED
    run_to_idle(recording_queue)
    assert transcript(chat.id) == [
        ("user", "one"),
        ("user", "two"),
        ("user", "three"),
        ("assistant", "heard: three"),
    ]
    assert not Run.objects.filter(conversation_id=chat.id, status=RunStatus.WAITING).exists()
