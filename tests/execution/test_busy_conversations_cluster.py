"""Busy conversations on a real cluster (docs/lifecycle.md#busy-conversations).

The chat agent streams from the fake model server over HTTP; a newer message with `interrupt`
stops it mid-reply. What it had streamed stays in the transcript, marked interrupted, and the
fake server sees it in the next run's request. Three enqueued messages run in the order written,
also when the cluster is SIGKILLed while the first one runs.
"""

import threading
import time

import pytest

from agenttasks import lifecycle
from agenttasks.models import Event, Run
from agenttasks.states import RunStatus

from ..conftest import wait_for
from ..fake_model import Reply, _frame, answer, hold

pytest_plugins = ["tests.fake_model"]
pytestmark = pytest.mark.django_db(transaction=True)

FAST_LEASES = {"HEARTBEAT_INTERVAL": 1, "LEASE_TIMEOUT": 3, "REAP_INTERVAL": 1}
WRITER = {"writer": {"runtime": "chat", "model": "m-writer", "stream": True}}


def last_user(request) -> str:
    return [m for m in request.messages if m["role"] == "user"][-1]["content"]


def partial_then_hang(request, streamed: threading.Event) -> Reply:
    """Stream two pieces of a reply, then nothing until the client goes (or 20 s)."""

    def frames():
        yield _frame({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
        for piece in ("Once ", "upon "):
            yield _frame({"choices": [{"index": 0, "delta": {"content": piece}}]})
        streamed.set()
        deadline = time.monotonic() + 20
        while not request.disconnected() and time.monotonic() < deadline:
            time.sleep(0.01)

    return Reply(headers={"Content-Type": "text/event-stream"}, chunks=frames(), label="partial")


def test_interrupt_keeps_the_partial_reply_and_the_new_run_sees_it(start_cluster, model, user):
    model.set(AGENTS=WRITER, **FAST_LEASES)
    streamed = threading.Event()
    server = model.script(
        lambda r: partial_then_hang(r, streamed) if last_user(r) == "write" else answer("Short.")
    )
    start_cluster(workers=1, **model.values)
    chat = lifecycle.create_conversation(owner=user, agent_id="writer")
    first, _ = lifecycle.post_message(chat.id, "write")
    assert streamed.wait(20), "the model never streamed"
    second, event = lifecycle.post_message(chat.id, "shorter, please", strategy="interrupt")
    assert (second.status, event) == (RunStatus.WAITING, None)
    wait_for(
        lambda: Run.objects.get(pk=second.id).status == RunStatus.COMPLETED,
        timeout=20,
        message="the new run answered",
    )
    assert Run.objects.get(pk=first.id).status == RunStatus.INTERRUPTED
    kept = Event.objects.get(conversation_id=chat.id, type="message.assistant", run_id=first.id)
    assert kept.data == {"content": "Once upon ", "interrupted": True}
    seen = [(m["role"], m["content"]) for m in server.of("m-writer")[-1].messages[-3:]]
    assert seen == [("user", "write"), ("assistant", "Once upon "), ("user", "shorter, please")]


def test_three_enqueued_messages_run_in_the_order_written(start_cluster, model, user):
    model.set(AGENTS={**WRITER, "writer": {**WRITER["writer"], "stream": False}}, **FAST_LEASES)
    server = model.script(lambda r: answer(f"re: {last_user(r)}"))
    start_cluster(workers=2, **model.values)
    chat = lifecycle.create_conversation(owner=user, agent_id="writer")
    lifecycle.post_message(chat.id, "one")
    for text in ("two", "three", "four"):
        lifecycle.post_message(chat.id, text, strategy="enqueue")
    wait_for(
        lambda: (
            Event.objects.filter(conversation_id=chat.id, type="message.assistant").count() == 4
        ),
        timeout=30,
        message="four answers",
    )
    rows = Event.objects.filter(
        conversation_id=chat.id, type__in=["message.user", "message.assistant"]
    ).order_by("seq")
    assert [e.data["content"] for e in rows] == [
        "one",
        "re: one",
        "two",
        "re: two",
        "three",
        "re: three",
        "four",
        "re: four",
    ]
    assert [last_user(r) for r in server.of("m-writer")] == ["one", "two", "three", "four"]


def test_enqueued_runs_survive_a_sigkill_of_the_cluster_and_run_in_order(
    start_cluster, model, user
):
    model.set(AGENTS={**WRITER, "writer": {**WRITER["writer"], "stream": False}}, **FAST_LEASES)
    answering = threading.Event()

    def script(request):
        if last_user(request) == "one" and not answering.is_set():
            return hold(lambda r: r.disconnected(), deadline=30)  # until the cluster dies
        return answer(f"re: {last_user(request)}")

    server = model.script(script)
    cluster = start_cluster(workers=1, **model.values)
    chat = lifecycle.create_conversation(owner=user, agent_id="writer")
    first, _ = lifecycle.post_message(chat.id, "one")
    for text in ("two", "three", "four"):
        lifecycle.post_message(chat.id, text, strategy="enqueue")
    wait_for(lambda: server.of("m-writer"), timeout=20, message="the first model request")
    cluster.kill()
    answering.set()
    start_cluster(workers=1, **model.values)
    wait_for(
        lambda: (
            Event.objects.filter(conversation_id=chat.id, type="message.assistant").count() == 3
        ),
        timeout=40,
        message="the enqueued messages answered after the restart",
    )
    assert Run.objects.get(pk=first.id).status == RunStatus.FAILED  # the reaper's orphan
    answered = Event.objects.filter(conversation_id=chat.id, type="message.assistant")
    assert [e.data["content"] for e in answered.order_by("seq")] == [
        "re: two",
        "re: three",
        "re: four",
    ]
