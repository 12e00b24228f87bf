"""Deliveries at least once (docs/rest.md#callbacks): a callback or push stays owed until its
receiver answered, a stopping worker lets the one in flight finish, what a killed worker cut short
is sent again with the same `X-Agenttasks-Delivery` id, and the reaper queues no second job for a
delivery whose job is still queued."""

import os
import signal
import threading
from datetime import timedelta

import pytest
from django.test.utils import override_settings
from django.utils import timezone
from django_q.models import OrmQ
from django_q.signing import SignedPackage

from agenttasks import lifecycle
from agenttasks.a2a import push
from agenttasks.broker import queue
from agenttasks.delivery import callbacks
from agenttasks.delivery import outbox as deliveries
from agenttasks.execution import reaper, worker
from agenttasks.models import A2APushConfig, Delivery, Event, Task

from ..conftest import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

HEADER = "X-Agenttasks-Delivery"
ALLOW = {"CALLBACK_ALLOWED_HOSTS": ["127.0.0.1"], "REQUEUE_AFTER": 60}
CLUSTER = {
    "CALLBACK_ALLOWED_HOSTS": ["127.0.0.1"],
    "HEARTBEAT_INTERVAL": 1,
    "LEASE_TIMEOUT": 3,
    "REAP_INTERVAL": 1,
    "REQUEUE_AFTER": 2,
    "CALLBACK_TIMEOUT": 5,
    "SHUTDOWN_GRACE": 10,
}


def alive(pid: int) -> bool:
    """Whether a process runs (a zombie nobody reaped yet has ended)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def outcomes(task) -> list[str]:
    return list(
        Event.objects.filter(
            conversation_id=task.conversation_id, type__startswith="callback."
        ).values_list("type", flat=True)
    )


def ended_owing(user, receiver, *, push_config=False) -> Task:
    """An echo task that ended with its callback (and a push) owed and no job run yet."""
    with queue.use_backend(queue.RecordingQueue(run_jobs=False)):
        task = lifecycle.create(owner=user, agent_id="echo", input="x", callback_url=receiver.url)
        if push_config:
            A2APushConfig.objects.create(task=task, url=receiver.url, token="t1")
        worker.execute_run(task.run_id)
    return Task.objects.read(task.id)


def in_thread(call, *args) -> threading.Thread:
    thread = threading.Thread(target=call, args=args)
    thread.start()
    return thread


# --- settled only after the answer ---------------------------------------------------------------


@override_settings(AGENTTASKS=ALLOW)
def test_a_callback_stays_owed_until_its_receiver_answers(user, receiver):
    task = ended_owing(user, receiver)
    receiver.delay = 1.5
    sending = in_thread(callbacks.send, task.id, "completed", task.version)
    wait_for(lambda: receiver.requests, message="the POST in flight")
    # The receiver has not answered: the callback is still owed (a crash now would re-send it).
    assert Delivery.objects.filter(task=task).count() == 1
    # The same job delivered again meanwhile does not POST a second time.
    assert callbacks.send(task.id, "completed", task.version) is None
    sending.join(10)
    assert len(receiver.requests) == 1
    assert outcomes(task) == ["callback.delivered"]
    assert not Delivery.objects.exists()
    assert receiver.requests[0]["headers"][HEADER] == deliveries.delivery_id(task.id, task.version)


@override_settings(AGENTTASKS=ALLOW)
def test_a_push_stays_owed_until_its_receiver_answers(user, receiver):
    task = ended_owing(user, receiver, push_config=True)
    config = A2APushConfig.objects.get(task=task)
    receiver.delay = 1.5
    sending = in_thread(push.deliver, config.pk, "completed", task.version)
    wait_for(lambda: receiver.requests, message="the push in flight")
    assert Delivery.objects.filter(config=config).count() == 1
    assert push.deliver(config.pk, "completed", task.version) == []
    sending.join(10)
    (request,) = receiver.requests
    assert request["headers"][HEADER] == deliveries.delivery_id(task.id, task.version, config.pk)
    assert not Delivery.objects.filter(config=config).exists()
    # The callback is owed still: each target is settled on its own.
    assert Delivery.objects.filter(task=task, config=None).count() == 1


@override_settings(AGENTTASKS=ALLOW)
def test_a_failed_attempt_is_recorded_then_settled(user, receiver):
    task = ended_owing(user, receiver)
    receiver.status = 500
    callbacks.send(task.id, "completed", task.version)
    assert outcomes(task) == ["callback.failed"]
    assert not Delivery.objects.exists()  # no retries for a callback: its failure settles it


# --- stops and kills ------------------------------------------------------------------------------


def test_a_graceful_stop_lets_the_callback_in_flight_finish(start_cluster, user, receiver):
    receiver.delay = 2
    with override_settings(AGENTTASKS=CLUSTER):
        cluster = start_cluster(workers=1, **CLUSTER)
        task = lifecycle.create(owner=user, agent_id="echo", input="x", callback_url=receiver.url)
        wait_for(lambda: receiver.requests, timeout=30, message="the callback in flight")
        (pid,) = cluster.worker_pids()
        os.kill(pid, signal.SIGTERM)  # a stop: the worker gives what it holds SHUTDOWN_GRACE
        wait_for(lambda: not alive(pid), timeout=20, message="the worker's exit")
    # It exited once the receiver had answered and the outcome was recorded.
    assert outcomes(task) == ["callback.delivered"]
    assert not Delivery.objects.filter(task=task).exists()
    assert len(receiver.requests) == 1


def test_a_callback_a_killed_worker_cut_short_is_sent_again_with_its_id(
    start_cluster, user, receiver
):
    receiver.delay = 2
    with override_settings(AGENTTASKS=CLUSTER):
        cluster = start_cluster(workers=1, **CLUSTER)
        task = lifecycle.create(owner=user, agent_id="echo", input="x", callback_url=receiver.url)
        wait_for(lambda: receiver.requests, timeout=30, message="the callback in flight")
        (pid,) = cluster.worker_pids()
        os.kill(pid, signal.SIGKILL)
        receiver.delay = 0
        # Its lease lapses (CALLBACK_TIMEOUT + a margin), then the reaper queues it again.
        wait_for(lambda: len(receiver.requests) >= 2, timeout=60, interval=0.2, message="re-send")
        wait_for(lambda: outcomes(task), timeout=10, message="the outcome")
    first, again = receiver.requests[:2]
    assert first["headers"][HEADER] == again["headers"][HEADER]
    assert first["json"]["taskId"] == again["json"]["taskId"] == task.id
    assert outcomes(task) == ["callback.delivered"]
    wait_for(lambda: not Delivery.objects.exists(), message="nothing owed")


# --- the reaper and jobs still queued ------------------------------------------------------------


def delivery_jobs() -> list[tuple]:
    """The callback and push jobs waiting in django-q2's ORM broker."""
    jobs = []
    for payload in OrmQ.objects.values_list("payload", flat=True):
        package = SignedPackage.loads(payload)
        if package["func"] in (deliveries.CALLBACK_JOB, deliveries.PUSH_JOB):
            jobs.append((package["func"], *package["args"]))
    return jobs


def overdue_now():
    Delivery.objects.update(due_at=timezone.now() - timedelta(seconds=3600))


@override_settings(AGENTTASKS=ALLOW)
def test_the_reaper_queues_no_second_job_for_a_delivery_still_queued(user, receiver, real_queue):
    tasks = []
    for i in range(5):
        task = lifecycle.create(
            owner=user, agent_id="echo", input=f"x{i}", callback_url=receiver.url
        )
        worker.execute_run(task.run_id)  # ends here; its callback job waits in the broker
        tasks.append(task)
    assert len(delivery_jobs()) == 5
    for _ in range(3):  # a backlog: no cluster takes the jobs, pass after pass
        overdue_now()
        reaper.reap()
        assert len(delivery_jobs()) == 5
    # A job that is gone (lost with the broker) is queued again, once.
    OrmQ.objects.all().delete()
    overdue_now()
    reaper.reap()
    reaper.reap()
    assert sorted(job[1] for job in delivery_jobs()) == sorted(t.id for t in tasks)
    assert receiver.requests == []
