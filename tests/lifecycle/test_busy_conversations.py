"""A message to a busy conversation, by multitask strategy (docs/lifecycle.md#busy-conversations).

`reject` refuses it (today's 409); `enqueue` stores it at once as a run that waits its turn and
starts, in the order written, when the conversation is idle; its message enters the transcript
then. Runs execute in this thread (the recording queue); the races are real threads.
"""

import pytest

from agenttasks import lifecycle, store
from agenttasks.exceptions import ConversationBusy, InvalidField, RunNotWaiting
from agenttasks.models import Event, Run
from agenttasks.states import RunStatus

from ..conftest import run_threads
from ..fake_model import run_to_idle

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
        "multitaskStrategy must be one of reject, enqueue on a conversation",
        "multitaskStrategy",
    )
    task = lifecycle.create(owner=user, agent_id="echo", input="go")
    with pytest.raises(InvalidField, match="must be one of reject on a task's conversation"):
        lifecycle.post_message(task.conversation_id, "more", strategy="enqueue")
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
