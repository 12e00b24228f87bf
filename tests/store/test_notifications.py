"""A conversation's events and a task's settling notify only while their channel is listened to.

PostgreSQL commits the transactions that notify one at a time, so the triggers
(agenttasks/sql/notify_v2.sql) notify `agenttasks_events` and `agenttasks_task_ended` only while
some process's listener says it listens there (`ListenedChannel`), as the hub does while its
waiters wait. What a listener hears is read up to a marker notified after the writes: PostgreSQL
delivers notifications in commit order, so nothing the writes sent can come after it.
"""

import pytest
from django.db import connection
from django.utils import timezone

from agenttasks import store
from agenttasks.broker import listen
from agenttasks.broker.listen import (
    EVENTS_CHANNEL,
    TASK_ENDED_CHANNEL,
    conversation_key,
    hub,
    raw_connection,
    task_key,
)
from agenttasks.models import ListenedChannel
from agenttasks.types import Ending, NewTask

from ..conftest import wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

CHANNELS = (EVENTS_CHANNEL, TASK_ENDED_CHANNEL)
MARK = "mark"


@pytest.fixture
def listener():
    """A session of its own that LISTENs to both channels, as another process's would."""
    with raw_connection(connection.settings_dict) as conn:
        conn.execute("; ".join(f"LISTEN {channel}" for channel in CHANNELS))
        yield conn


def heard(listener) -> dict[str, list[str]]:
    """The payloads heard on each channel before a marker notified now."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_notify(%s, %s), pg_notify(%s, %s)",
            [EVENTS_CHANNEL, MARK, TASK_ENDED_CHANNEL, MARK],
        )
    payloads: dict[str, list[str]] = {channel: [] for channel in CHANNELS}
    marked: set[str] = set()
    for note in listener.notifies(timeout=10):
        if note.payload == MARK:
            marked.add(note.channel)
            if marked == set(CHANNELS):
                return payloads
        else:
            payloads[note.channel].append(note.payload)
    raise AssertionError(f"the markers never came: {marked}")


def a_task_that_ends(user):
    task = store.create_task(NewTask(owner=user, agent="worker", input="x"))
    store.claim(task.run_id, "w1")
    store.end(task.id, task.run_id, Ending("completed", result="done"))
    return task


def listened(channel: str) -> bool:
    return ListenedChannel.objects.filter(channel=channel, until__gt=timezone.now()).exists()


def test_nobody_listening_a_task_notifies_nothing(user, listener):
    ListenedChannel.objects.all().delete()
    assert not hub._needed() & set(CHANNELS)  # no waiter of this process says otherwise
    a_task_that_ends(user)
    assert heard(listener) == {EVENTS_CHANNEL: [], TASK_ENDED_CHANNEL: []}


def test_a_waiting_listener_hears_the_events_and_the_settling(user, listener):
    first = store.create_task(NewTask(owner=user, agent="worker", input="x"))
    with (
        hub.subscribe(conversation_key(first.conversation_id)),
        hub.subscribe(task_key(first.id)),
    ):
        wait_for(lambda: all(listened(c) for c in CHANNELS), message="the hub to say it listens")
        task = a_task_that_ends(user)
        payloads = heard(listener)
    assert payloads[TASK_ENDED_CHANNEL] == [task.id]
    assert payloads[EVENTS_CHANNEL] == [task.conversation_id] * 3  # create, claim, ending
    assert not hub._needed() & set(CHANNELS)  # no longer renewed: the rows lapse


def test_a_listener_says_it_again_while_its_waiters_wait(user, monkeypatch):
    """A stream followed longer than LISTENED_FOR keeps its notifications: the row is renewed."""
    monkeypatch.setattr(listen, "LISTENED_RENEW", 0.05)
    task = store.create_task(NewTask(owner=user, agent="worker", input="x"))
    with hub.subscribe(conversation_key(task.conversation_id)):
        wait_for(lambda: listened(EVENTS_CHANNEL), message="the hub to say it listens")
        ListenedChannel.objects.all().delete()  # as if its 30 s had passed
        # The renewal due before the patch may be up to LISTENED_RENEW's 5 s away.
        wait_for(lambda: listened(EVENTS_CHANNEL), timeout=15, message="the hub to say it again")
