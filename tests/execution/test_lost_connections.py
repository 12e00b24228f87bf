"""A run's ending survives a lost database connection, whatever path writes it (issue: hardening,
third pass, item 1): the driver's `reconnecting` retries a lost connection even when a lookup on
the way wrapped it in another error (`meta_for`'s SpawnError)."""

import pytest
from django.db import connection, connections

from agenttasks import lifecycle
from agenttasks.models import Event, Run
from agenttasks.runtime.driver import reconnecting
from agenttasks.states import RunStatus
from agenttasks.types import RunOutcome

from ..factories import ConversationFactory, RunFactory

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]


def lose_the_connection() -> None:
    """End this process's database session from another one, as a restart would: the next
    statement on it fails with a lost connection."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (backend,) = cursor.fetchone()
    other = connections.create_connection("default")
    try:
        with other.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [backend])
    finally:
        other.close()


def test_a_conversation_turns_ending_is_recorded_across_a_lost_connection(user):
    conversation = ConversationFactory(owner=user)
    run = RunFactory(conversation=conversation, status=RunStatus.RUNNING)
    outcome = RunOutcome(run.id, "completed", text="the answer")
    lose_the_connection()  # meta_for's lookup, the first statement, finds it gone
    reconnecting(lambda: lifecycle.on_run_finished(conversation.id, outcome))
    ended = Run.objects.get(pk=run.id)
    assert (ended.status, ended.output) == ("completed", "the answer")
    reply = Event.objects.get(conversation_id=conversation.id, type="message.assistant")
    assert reply.data["content"] == "the answer"
