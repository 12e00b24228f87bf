"""The ORM broker whose idle pusher waits for a notification of new jobs (agenttasks.broker.orm):
a job enqueued from another connection wakes a waiting dequeue at once, and an idle pusher reads
its queue once an IDLE_WAIT instead of every `poll` seconds."""

import threading
import time

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django_q.conf import Conf
from django_q.models import OrmQ

from agenttasks.broker import orm

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def broker():
    made = orm.ListeningORM(list_key="listening-test")
    yield made
    made._drop_listener()
    OrmQ.objects.filter(key="listening-test").delete()


def enqueue_elsewhere(broker, payload: str) -> None:
    """Enqueue a job on a connection of its own, as a web process does."""

    def body():
        try:
            broker.enqueue(payload)
        finally:
            connection.close()

    thread = threading.Thread(target=body)
    thread.start()
    thread.join(10)


def test_an_idle_dequeue_returns_as_soon_as_a_job_is_enqueued(broker, monkeypatch):
    if connection.vendor != "postgresql":
        pytest.skip("LISTEN/NOTIFY is PostgreSQL's")
    monkeypatch.setattr(orm, "IDLE_WAIT", 0.1)
    assert broker.dequeue() is None  # nothing queued: it listens from now on
    monkeypatch.setattr(orm, "IDLE_WAIT", 30.0)
    waited: list[float] = []

    def wait():
        started = time.monotonic()
        waited.append(broker.dequeue())
        waited.append(time.monotonic() - started)
        connection.close()

    waiting = threading.Thread(target=wait)
    waiting.start()
    time.sleep(0.3)  # let it settle into its wait (the test measures that the wait ends early)
    enqueue_elsewhere(broker, "a job")
    waiting.join(10)
    assert waited and waited[0] is None and waited[1] < 5, waited  # woken, not timed out
    assert [payload for _, payload in broker.dequeue()] == ["a job"]


def test_an_idle_pusher_reads_its_queue_once_an_idle_wait(broker, monkeypatch):
    if connection.vendor != "postgresql":
        pytest.skip("LISTEN/NOTIFY is PostgreSQL's")
    monkeypatch.setattr(orm, "IDLE_WAIT", 0.5)
    started = time.monotonic()
    with CaptureQueriesContext(connection) as reads:
        while time.monotonic() - started < 2.0:
            assert broker.dequeue() is None
    # About 2.0 / 0.5 reads, where polling every Conf.POLL (0.05 s) would make about 40.
    assert 3 <= len(reads) <= 6, [q["sql"] for q in reads]


def test_without_postgresql_it_polls_as_django_q2s_broker(broker):
    if connection.vendor == "postgresql":
        pytest.skip("the fallback of other databases")
    broker.enqueue("a job")
    assert [payload for _, payload in broker.dequeue()] == ["a job"]
    started = time.monotonic()
    assert broker.dequeue() is None
    assert time.monotonic() - started >= Conf.POLL * 0.9  # it slept a poll
