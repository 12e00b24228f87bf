"""Per-agent deadlines: `timeout_seconds`, DEFAULT_TIMEOUT, the system check, django-q2's kill."""

import threading
import time
from datetime import timedelta

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test.utils import override_settings
from django.utils import timezone
from django_q.exceptions import TimeoutException

from agenttasks import lifecycle, registry, store, worker
from agenttasks.checks import check_deadlines
from agenttasks.deadlines import killed_text
from agenttasks.models import Run, Task

from .agents import slow
from .conftest import wait_for


def test_an_agent_timeout_defaults_to_default_timeout():
    agent = registry.build("a", runtime="callable", handler=slow)
    assert (agent.timeout_seconds, agent.timeout) == (None, 600)
    with override_settings(AGENTTASKS={"DEFAULT_TIMEOUT": 30}):
        assert agent.timeout == 30
    assert registry.build("b", runtime="callable", handler=slow, timeout_seconds=2).timeout == 2
    for bad in (0, -1, "10", True):
        with pytest.raises(ImproperlyConfigured, match="timeout_seconds has an invalid value"):
            registry.build("c", runtime="callable", handler=slow, timeout_seconds=bad)


def test_the_check_warns_when_django_q2_would_kill_first():
    registry.register("quick", runtime="callable", handler=slow, timeout_seconds=60, replace=True)
    try:
        with override_settings(Q_CLUSTER={"timeout": 600, "retry": 660}):
            warned = {m.msg.split("'")[1] for m in check_deadlines() if m.id == "agenttasks.W009"}
            assert "slow" in warned and "quick" not in warned  # 600 s is not below 600 s
        with override_settings(Q_CLUSTER={"timeout": 660, "retry": 720}):
            assert check_deadlines() == []
        with override_settings(Q_CLUSTER={"timeout": 30, "retry": 60}):
            (message, *_) = [m for m in check_deadlines() if "'quick'" in m.msg]
            assert "its timeout (60 s) is not below Q_CLUSTER['timeout'] (30 s)" in message.msg
    finally:
        registry.unregister("quick")


@pytest.mark.django_db(transaction=True)
def test_a_run_past_its_deadline_fails_in_process(user):
    """The agent's own timeout_seconds stops a run executing in this process."""
    registry.register("sleepy", runtime="callable", handler=slow, timeout_seconds=1, replace=True)
    try:
        task = lifecycle.create(owner=user, agent_id="sleepy", input="x", metadata={"seconds": 30})
        begun = time.monotonic()
        worker.execute_run(task.run_id)
        elapsed = time.monotonic() - begun
        task = Task.objects.get(pk=task.id)
        assert (task.status, task.error, task.summary) == (
            "failed",
            "Timed out after 1 s",
            "Timed out after 1 s",
        )
        run = Run.objects.get(pk=task.run_id)
        assert (run.status, run.error) == ("failed", "Timed out after 1 s")
        assert elapsed < 5
    finally:
        registry.unregister("sleepy")


def _killed(ctx):
    raise TimeoutException("Task exceeded maximum timeout value (660 seconds)")


@pytest.mark.django_db(transaction=True)
def test_a_django_q2_kill_says_so(user):
    registry.register("killed", runtime="callable", handler=_killed, replace=True)
    try:
        task = lifecycle.create(owner=user, agent_id="killed", input="x")
        with override_settings(Q_CLUSTER={"timeout": 660, "retry": 720}):
            worker.execute_run(task.run_id)  # django-q2's SIGALRM raises in the job's thread
            expected = killed_text()
        task = Task.objects.get(pk=task.id)
        assert (task.status, task.error) == ("failed", expected)
        assert expected.startswith("Stopped by django-q2 after its timeout of 660 s")
        assert "The server stopped" not in task.error
    finally:
        registry.unregister("killed")


def test_7_slow_task_with_a_2_s_deadline_fails_and_the_worker_goes_on(
    start_cluster, user, receiver
):
    settings = {"DEFAULT_TIMEOUT": 2, "CALLBACK_ALLOWED_HOSTS": ["127.0.0.1"]}
    with override_settings(AGENTTASKS=settings):
        cluster = start_cluster(workers=1, **settings)
        began = time.monotonic()
        task = lifecycle.create(
            owner=user,
            agent_id="slow",
            input="x",
            metadata={"seconds": 60},
            callback_url=receiver.url,
        )
        wait_for(
            lambda: Task.objects.get(pk=task.id).status == "failed",
            timeout=20,
            message="the slow task to fail",
        )
        failed_after = time.monotonic() - began
        failed = Task.objects.get(pk=task.id)
        assert failed.error == "Timed out after 2 s"
        wait_for(lambda: receiver.bodies(), timeout=10, message="the callback")
        (body,) = receiver.bodies()
        assert (body["taskId"], body["status"], body["error"]) == (
            task.id,
            "failed",
            "Timed out after 2 s",
        )
        # The only worker takes new work.
        after = lifecycle.create(owner=user, agent_id="echo", input="next")
        wait_for(
            lambda: Task.objects.get(pk=after.id).status == "completed",
            timeout=20,
            message="the next task to complete",
        )
        assert len(cluster.started_worker_pids()) == 1  # not a reincarnated worker
    assert failed_after < 10


@pytest.mark.django_db(transaction=True)
def test_a_worker_django_q2_killed_outright_is_reported_plainly(user):
    """The heartbeat leaves its last words as django-q2's timeout comes; the reaper uses them."""
    with override_settings(Q_CLUSTER={"timeout": 1, "retry": 60}):
        task = lifecycle.create(owner=user, agent_id="slow", input="x", metadata={"seconds": 3})
        expected = killed_text()
        runner = threading.Thread(target=worker.execute_run, args=(task.run_id,))
        runner.start()
        wait_for(
            lambda: Run.objects.get(pk=task.run_id).error == expected,
            timeout=5,
            message="the last words at django-q2's timeout",
        )
        runner.join(10)
    # Here django-q2 did not kill it (no cluster): the run's own ending replaces the words.
    done = Task.objects.get(pk=task.id)
    assert (done.status, done.error) == ("completed", "")

    # A worker that was killed: its run holds the words and its lease expired.
    killed = lifecycle.create(owner=user, agent_id="echo", input="killed")
    orphan = lifecycle.create(owner=user, agent_id="echo", input="orphan")
    for t in (killed, orphan):
        store.claim(t.run_id, "gone")
    store.record_last_words(killed.run_id, "gone", expected)
    Run.objects.filter(pk__in=[killed.run_id, orphan.run_id]).update(
        heartbeat_at=timezone.now() - timedelta(minutes=5)
    )
    lifecycle.recover()
    assert Task.objects.get(pk=killed.id).error == expected
    assert Task.objects.get(pk=orphan.id).error == "The server stopped while the task was running"
