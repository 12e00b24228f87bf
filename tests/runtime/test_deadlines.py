"""Per-agent deadlines: `timeout_seconds`, DEFAULT_TIMEOUT, and django-q2's timeout in a job's thread."""

import time

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test.utils import override_settings
from django_q.exceptions import TimeoutException

from agenttasks import lifecycle, registry
from agenttasks.execution import worker
from agenttasks.models import Run, Task
from agenttasks.runtime.deadlines import killed_text

from ..agents import slow
from ..conftest import wait_for


def test_an_agent_timeout_defaults_to_default_timeout():
    agent = registry.build("a", runtime="callable", handler=slow)
    assert (agent.timeout_seconds, agent.timeout) == (None, 600)
    with override_settings(AGENTTASKS={"DEFAULT_TIMEOUT": 30}):
        assert agent.timeout == 30
    assert registry.build("b", runtime="callable", handler=slow, timeout_seconds=2).timeout == 2
    for bad in (0, -1, "10", True):
        with pytest.raises(ImproperlyConfigured, match="timeout_seconds has an invalid value"):
            registry.build("c", runtime="callable", handler=slow, timeout_seconds=bad)


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
