"""Deliveries owed: an ending records its callback and pushes, so a lost enqueue loses nothing."""

from datetime import timedelta

import pytest
from django.test.utils import override_settings
from django.utils import timezone

from agenttasks import lifecycle
from agenttasks.broker import queue
from agenttasks.delivery import outbox as deliveries
from agenttasks.execution import reaper, worker
from agenttasks.models import A2APushConfig, Delivery, Task

pytestmark = pytest.mark.django_db(transaction=True)

SETTINGS = {"CALLBACK_ALLOWED_HOSTS": ["127.0.0.1"], "REQUEUE_AFTER": 60}


class BrokenBroker(queue.RecordingQueue):
    """Record runs; every other enqueue fails (the broker or the database went away)."""

    def enqueue(self, func, *args):
        if func != queue.EXECUTE_RUN:
            raise ConnectionError("the broker is gone")
        super().enqueue(func, *args)


def ended_with_jobs_lost(user, receiver) -> Task:
    """An echo task with a callback and a push config, ended while no job could be enqueued."""
    task = lifecycle.create(owner=user, agent_id="echo", input="x", callback_url=receiver.url)
    A2APushConfig.objects.create(task=task, url=receiver.url, token="t1")
    with queue.use_backend(BrokenBroker()):
        worker.execute_run(task.run_id)  # claims, runs and ends it here (the SQL ending on PG)
    task = Task.objects.read(task.id)
    assert task.status == "completed" and task.callback_version == 0
    return task


def overdue_now():
    """Let REQUEUE_AFTER pass for every delivery owed."""
    Delivery.objects.update(due_at=timezone.now() - timedelta(seconds=61))


@override_settings(AGENTTASKS=SETTINGS)
def test_a_lost_enqueue_is_recorded_with_the_ending_and_the_reaper_delivers_it_once(user, receiver):
    task = ended_with_jobs_lost(user, receiver)
    assert receiver.requests == []
    owed = Delivery.objects.filter(task=task)
    assert sorted((d.config_id is None, d.status, d.version) for d in owed) == [
        (False, "completed", task.version),
        (True, "completed", task.version),
    ]
    assert reaper.preview()["overdue_deliveries"] == []  # not yet: the jobs may still come

    overdue_now()
    assert sorted(reaper.preview()["overdue_deliveries"]) == sorted(d.pk for d in owed)
    with queue.use_backend(queue.RecordingQueue()):  # the broker is back; jobs run here
        reaper.reap()
        overdue_now()
        reaper.reap()  # nothing owed is left: nothing is sent twice
    callback = [r for r in receiver.requests if "X-A2A-Notification-Token" not in r["headers"]]
    pushes = [r for r in receiver.requests if "X-A2A-Notification-Token" in r["headers"]]
    assert [r["json"]["status"] for r in callback] == ["completed"]
    assert len(pushes) == 1 and pushes[0]["headers"]["X-A2A-Notification-Token"] == "t1"
    assert pushes[0]["json"]["statusUpdate"]["taskId"] == task.id
    assert not Delivery.objects.exists()
    assert Task.objects.read(task.id).callback_version == task.version


@override_settings(AGENTTASKS=SETTINGS)
def test_a_job_sent_again_while_the_first_still_waits_sends_once(user, receiver):
    task = ended_with_jobs_lost(user, receiver)
    jobs = [deliveries.job_of(d) for d in Delivery.objects.order_by("pk")]
    with queue.use_backend(queue.RecordingQueue()):
        overdue_now()
        reaper.reap()
        for func, *args in jobs:  # the first jobs turn up after all (a slow broker)
            queue.enqueue_now(func, *args)
    assert len(receiver.requests) == 2  # the callback and the push, once each
    assert not Delivery.objects.filter(task=task).exists()


@override_settings(AGENTTASKS=SETTINGS)
def test_an_overdue_delivery_is_sent_again_with_a_backoff(user, receiver):
    ended_with_jobs_lost(user, receiver)
    with queue.use_backend(BrokenBroker()):
        overdue_now()
        reaper.reap()  # the broker is still gone: nothing changes
        assert set(Delivery.objects.values_list("attempts", flat=True)) == {0}
    with queue.use_backend(queue.RecordingQueue(run_jobs=False)) as recorded:
        reaper.reap()  # queued, not yet run
        assert len(recorded.jobs) == 2
        reaper.reap()  # not due again yet
        assert len(recorded.jobs) == 2
        Delivery.objects.update(due_at=timezone.now() - timedelta(seconds=61))
        reaper.reap()
        assert len(recorded.jobs) == 4
        assert set(Delivery.objects.values_list("attempts", flat=True)) == {2}
        # The second time it is due again after two REQUEUE_AFTERs, not one.
        due = Delivery.objects.values_list("due_at", flat=True)
        assert all(d - timezone.now() > timedelta(seconds=55) for d in due)


@override_settings(AGENTTASKS=SETTINGS)
def test_a_delivered_ending_leaves_nothing_owed(user, receiver, recording_queue):
    task = lifecycle.create(owner=user, agent_id="echo", input="x", callback_url=receiver.url)
    A2APushConfig.objects.create(task=task, url=receiver.url)
    worker.execute_run(task.run_id)
    assert len(receiver.requests) == 2
    assert not Delivery.objects.exists()


@override_settings(AGENTTASKS=SETTINGS)
def test_a_task_without_callback_or_push_owes_nothing(user, recording_queue):
    task = lifecycle.create(owner=user, agent_id="echo", input="x")
    worker.execute_run(task.run_id)
    assert Task.objects.read(task.id).status == "completed"
    assert not Delivery.objects.exists()


@override_settings(AGENTTASKS=SETTINGS)
def test_a_pause_and_a_cancel_each_owe_a_callback(user, receiver):
    with queue.use_backend(BrokenBroker()):
        task = lifecycle.create(
            owner=user, agent_id="approver", input="prod", callback_url=receiver.url
        )
        worker.execute_run(task.run_id)
        assert Task.objects.read(task.id).status == "waiting_for_input"
        lifecycle.cancel(task.id)
    owed = Delivery.objects.filter(task=task).order_by("version")
    assert [d.status for d in owed] == ["waiting_for_input", "cancelled"]
    with queue.use_backend(queue.RecordingQueue()):
        overdue_now()
        reaper.reap()
    # Each status the task entered is owed its own POST, oldest first.
    assert [r["json"]["status"] for r in receiver.requests] == ["waiting_for_input", "cancelled"]
    assert not Delivery.objects.exists()
