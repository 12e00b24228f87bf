"""docs/rest.md#the-live-stream and docs/delegation.md#streaming: tokens as they are written.

A chat agent asks the fake model server (on loopback) for a streamed completion; a reader of the
conversation's events stream over real HTTP (Django's threaded WSGI live server) sees each piece
as a `message.delta` frame without `id:`, in order, then the stored `message.assistant`. Deltas
are not stored and not replayed; a `now` stop aborts the streamed request.
"""

import time

import httpx
import pytest

from agenttasks import lifecycle
from agenttasks.broker import deltas
from agenttasks.broker.listen import hub
from agenttasks.execution import worker
from agenttasks.models import Event, Run

from ..conftest import wait_for
from ..fake_model import LOOKUP, in_thread, refresh, stream_answer, streamed, task_for
from .test_api_events import Stream, open_stream

pytest_plugins = ["tests.fake_model"]
# Behaves otherwise on PostgreSQL: new events and deltas reach the stream through NOTIFY.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.both]

PIECES = [f"w{i} " for i in range(20)]


@pytest.fixture(params=["wsgi", "asgi"])
def any_server(request):
    """Django's threaded WSGI live server, and uvicorn (the async stream)."""
    return request.getfixturevalue(f"{request.param}_server")


@pytest.fixture
def token(as_alice):
    return as_alice.headers["HTTP_AUTHORIZATION"].split()[1]


def listening() -> None:
    """On PostgreSQL, wait until this process's listener takes the delta channel."""
    from django.db import connection

    if connection.vendor == "postgresql":
        wait_for(lambda: deltas.CHANNEL in hub.listening, message="LISTEN agenttasks_delta")


def read_until_reply(stream: Stream, deadline: float = 15.0) -> tuple[list[dict], dict]:
    """Frames up to the stored message.assistant that has text; return (frames, that message)."""
    frames = []
    end = time.monotonic() + deadline
    for message in stream.events():
        assert time.monotonic() < end, "no reply in time"
        if "data" not in message:
            continue
        frames.append(message)
        if message["event"] == "message.assistant" and message["data"]["data"].get("content"):
            return frames, message
    raise AssertionError(f"the stream ended before the reply: {frames}")


def follow(as_alice, wsgi_server, token, conversation_id, post):
    """Open the stream, then `post()`; return the frames up to the stored reply."""
    path = f"/conversations/{conversation_id}/events/stream"
    with httpx.Client(timeout=20) as client:
        response = open_stream(client, wsgi_server, path, token)
        try:
            assert response.status_code == 200
            stream = Stream(response)
            assert stream.next()["event"] == "snapshot"
            listening()
            post()
            return read_until_reply(stream)
        finally:
            response.close()


def test_a_reader_sees_the_deltas_in_order_then_the_stored_message(
    as_alice, workers, model, agents, any_server, token
):
    base = any_server
    agents("writer", model="m-writer")
    fake = model.script(lambda r: stream_answer(PIECES, gap=0.01))
    conversation = as_alice.post("/conversations", {"agentId": "writer"}).json()["conversation"]
    path = f"/conversations/{conversation['id']}/messages"
    frames, reply = follow(
        as_alice,
        base,
        token,
        conversation["id"],
        lambda: as_alice.post(path, {"message": "write"}),
    )
    sent = [f for f in frames if f["event"] == "message.delta"]
    # Every piece, in order; on PostgreSQL those that arrived together share one frame.
    assert "".join(f["data"]["delta"] for f in sent) == "".join(PIECES)
    assert 1 <= len(sent) <= len(PIECES)
    run_id = reply["data"]["runId"]
    for frame in sent:
        assert "id" not in frame and frame["data"] == {
            "runId": run_id,
            "delta": frame["data"]["delta"],
        }
    assert frames.index(reply) > frames.index(sent[-1])
    assert reply["data"]["data"]["content"] == "".join(PIECES) and "id" in reply
    (request,) = fake.of("m-writer")
    assert request.json["stream"] is True
    # Deltas are not stored, so a resumed reader does not get them again.
    assert not Event.objects.filter(type="message.delta").exists()
    with httpx.Client(timeout=20) as client:
        response = open_stream(
            client, base, f"/conversations/{conversation['id']}/events/stream?after=0", token
        )
        try:
            replayed, again = read_until_reply(Stream(response))
        finally:
            response.close()
    assert not [f for f in replayed if f["event"] == "message.delta"]
    assert again["data"] == reply["data"]
    # The run counted the usage the last chunk carried.
    assert Run.objects.get(pk=run_id).total_tokens == 2


def split_call(request):
    """A tool call whose id, name and arguments come in several chunks; then a streamed answer."""
    if request.has_tool_message:
        return stream_answer(["found ", "it: ", request.last_tool])
    return streamed(
        [
            {"role": "assistant", "content": None},
            {
                "tool_calls": [
                    {"index": 0, "id": "c1", "type": "function", "function": {"name": "look"}}
                ]
            },
            {"tool_calls": [{"index": 0, "function": {"name": "up", "arguments": '{"q"'}}]},
            {"tool_calls": [{"index": 0, "function": {"arguments": ': "te'}}]},
            {"tool_calls": [{"index": 0, "function": {"arguments": 'rm"}'}}]},
        ],
        finish="tool_calls",
    )


def test_a_tool_call_split_across_chunks(as_alice, workers, model, agents, wsgi_server, token):
    agents("searcher", model="m-search", tools=[LOOKUP])
    model.script(split_call)
    conversation = as_alice.post("/conversations", {"agentId": "searcher"}).json()["conversation"]
    path = f"/conversations/{conversation['id']}/messages"
    frames, reply = follow(
        as_alice,
        wsgi_server,
        token,
        conversation["id"],
        lambda: as_alice.post(path, {"message": "find it"}),
    )
    call = next(f for f in frames if f["event"] == "tool.call")["data"]["data"]
    assert (call["toolCallId"], call["toolName"], call["args"]) == ("c1", "lookup", {"q": "term"})
    result = next(f for f in frames if f["event"] == "tool.result")["data"]["data"]
    assert result["content"] == "data(term)"
    sent = [f["data"]["delta"] for f in frames if f["event"] == "message.delta"]
    assert "".join(sent) == "found it: data(term)"
    assert reply["data"]["data"]["content"] == "found it: data(term)"
    logged = Event.objects.get(
        conversation_id=conversation["id"], type="message.assistant", data__content=None
    )
    assert logged.data["toolCalls"] == [
        {
            "id": "c1",
            "type": "function",
            "function": {"name": "lookup", "arguments": '{"q": "term"}'},
        }
    ]


def test_a_stop_now_aborts_the_streamed_request(model, agents, user, recording_queue):
    model.set(HEARTBEAT_INTERVAL=1)
    agents("slow-writer", model="m-slow")
    server = model.script(lambda r: stream_answer(PIECES, gap=0.5))  # ten seconds in all
    task = task_for(user, "slow-writer")
    got: list[str] = []

    def reader(run_id, piece):
        got.append(piece)

    deltas.subscribe(task.conversation_id, reader)
    listening()
    try:
        runner = in_thread(worker.execute_run, task.run_id)
        wait_for(lambda: got, message="the first delta")
        stopped_at = time.monotonic()
        lifecycle.stop(task.id)
        runner.join(1 + 2)
        assert not runner.is_alive()
        assert time.monotonic() - stopped_at < 1 + 2
    finally:
        deltas.unsubscribe(task.conversation_id, reader)
    assert server.requests[0].answered.wait(5), "the server saw the client go"
    assert len("".join(got)) < len("".join(PIECES))
    assert refresh(task).status == "cancelled"
    assert not Event.objects.filter(
        conversation_id=task.conversation_id, type="message.assistant"
    ).exists()


def test_stream_must_be_a_boolean(agents):
    from django.core.exceptions import ImproperlyConfigured

    with pytest.raises(ImproperlyConfigured, match="stream must be True or False"):
        agents("bad", stream="yes")
