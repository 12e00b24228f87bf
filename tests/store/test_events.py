"""A run's own events read back (store.last_of_run) after appends on either database: the
SQL function's append on PostgreSQL and the ORM's on SQLite write what the retry compares."""

import pytest

from agenttasks import store

from ..factories import ConversationFactory, RunFactory

pytestmark = pytest.mark.django_db(transaction=True)

WRITTEN = ("message.assistant", "tool.result")


def test_the_latest_event_a_run_wrote_reads_back_as_it_was_appended(user):
    conversation = ConversationFactory(owner=user)
    run, other = RunFactory(conversation=conversation), RunFactory(conversation=conversation)
    reply = {"content": "ok", "toolCalls": [{"id": "c1"}], "usage": {"totalTokens": 3}}
    result = {"toolCallId": "c1", "content": "done", "isError": False, "metadata": None}
    store.append_events(
        conversation.id,
        [("message.assistant", reply, run.id, ""), ("tool.result", result, run.id, "")],
    )
    store.append_events(conversation.id, [("message.assistant", {"content": "x"}, other.id, "")])
    store.append_events(conversation.id, [("message.steer", {"content": "y"}, run.id, "")])
    assert store.last_of_run(conversation.id, run.id, WRITTEN) == ("tool.result", result)
    assert store.last_of_run(conversation.id, run.id, ("message.assistant",)) == (
        "message.assistant",
        reply,
    )
    assert store.last_of_run(conversation.id, RunFactory().id, WRITTEN) is None


def test_a_runs_count_of_steered_messages_taken(user):
    run = RunFactory(steers=2, steers_taken=1)
    assert store.steers_taken(run.id) == 1
    assert store.steers_taken("run_none") == 0
