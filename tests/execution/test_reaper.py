"""The reaper's command and its schedule."""

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.utils import timezone
from django_q.models import Schedule

from agenttasks import store
from agenttasks.broker import queue
from agenttasks.models import Run, Task
from agenttasks.types import NewTask

from ..conftest import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

ORPHAN = "The server stopped while the task was running"


def orphaned(user, agent="echo"):
    task = store.create_task(NewTask(owner=user, agent=agent, input="x"))
    store.claim(task.run_id, "gone")
    Run.objects.filter(pk=task.run_id).update(heartbeat_at=timezone.now() - timedelta(hours=1))
    return task


def test_dry_run_reports_and_changes_nothing(user):
    task = orphaned(user)
    out = StringIO()
    call_command("agenttasks_reap", "--dry-run", stdout=out)
    assert f'orphans: 1 ["{task.id}"]' in out.getvalue()
    assert Task.objects.get(pk=task.id).status == "running"


def test_a_pass_fails_the_orphan(user):
    task = orphaned(user)
    out = StringIO()
    call_command("agenttasks_reap", stdout=out)
    assert f'failed: 1 ["{task.id}"]' in out.getvalue()
    failed = Task.objects.get(pk=task.id)
    assert (failed.status, failed.error) == ("failed", ORPHAN)
    out = StringIO()
    call_command("agenttasks_reap", stdout=out)
    assert out.getvalue().strip() == "failed: 0"


def test_a_pass_tries_an_orphan_again_when_its_agents_retry_policy_allows(user):
    task = orphaned(user, agent="sturdy")
    out = StringIO()
    call_command("agenttasks_reap", stdout=out)
    assert out.getvalue().strip() == "failed: 0"
    retried = Task.objects.get(pk=task.id)
    assert (retried.status, retried.attempt, retried.error) == ("pending", 2, "")
    lost = Run.objects.get(pk=task.run_id)
    assert (lost.status, lost.error) == ("failed", ORPHAN)
    nxt = retried.run
    assert nxt.trigger == "retry" and nxt.not_before is not None and ORPHAN in nxt.input
    # Its second attempt lost too: the policy is spent, and the task fails as any orphan does.
    store.claim(nxt.pk, "gone")
    Run.objects.filter(pk=nxt.pk).update(heartbeat_at=timezone.now() - timedelta(hours=1))
    out = StringIO()
    call_command("agenttasks_reap", stdout=out)
    assert f'failed: 1 ["{task.id}"]' in out.getvalue()
    assert Task.objects.get(pk=task.id).error == ORPHAN


def test_the_schedule_is_installed_once(db):
    queue.install_schedule("agenttasks reaper", "agenttasks.execution.reaper.reap")
    queue.install_schedule("agenttasks reaper", "agenttasks.execution.reaper.reap")
    (schedule,) = Schedule.objects.filter(name="agenttasks reaper")
    assert (schedule.func, schedule.schedule_type, schedule.repeats) == (
        "agenttasks.execution.reaper.reap",
        Schedule.MINUTES,
        -1,
    )


def test_a_cluster_installs_the_schedule_itself(start_cluster):
    start_cluster(workers=1)
    wait_for(
        lambda: Schedule.objects.filter(
            name="agenttasks reaper", func="agenttasks.execution.reaper.reap"
        ).exists(),
        timeout=20,
        message="the reaper's schedule",
    )


def test_the_dry_run_lists_what_the_pass_then_settles(user):
    """The preview and the pass read the same sweep QuerySets (store.sweeps)."""
    from agenttasks.execution import reaper
    from agenttasks.models import Wakeup

    from ..factories import ConversationFactory, WakeupFactory

    task = orphaned(user)
    agentless = WakeupFactory(conversation=ConversationFactory(owner=user, agent=""))
    preview = reaper.preview()
    assert preview["orphans"] == [task.id]
    # An MCP client's conversation has no agent to wake: neither the preview nor the pass wakes it.
    assert agentless.conversation_id not in preview["owed_conversations"]
    reaper.reap()
    assert Task.objects.get(pk=task.id).status == "failed"
    assert Wakeup.objects.get(pk=agentless.pk).state == "pending"
    assert reaper.preview()["orphans"] == []


@pytest.mark.postgres
def test_the_runs_of_a_process_demonstrably_alive_are_spared_until_its_grace_ends(user):
    """A starved process beats late: its row is recent and its listener connected, so its silent
    runs are not orphans until LIVE_GRACE leases passed (docs/operating.md#the-reaper-and-a-backlog)."""
    from django.db import connections

    from agenttasks.broker.listen import listener_name, raw_connection
    from agenttasks.models import WorkerProcess
    from agenttasks.store.sweeps import LIVE_GRACE

    process = "starved-host:4242"
    task = store.create_task(NewTask(owner=user, agent="echo", input="x"))
    store.claim(task.run_id, process)
    lease = timedelta(seconds=30)  # LEASE_TIMEOUT's default
    now = timezone.now()
    Run.objects.filter(pk=task.run_id).update(heartbeat_at=now - 2 * lease)  # its lease expired
    WorkerProcess.objects.create(
        id=process, node="starved-host", slots=4, started_at=now - 4 * lease, seen_at=now - lease
    )
    listener = raw_connection(connections["default"].settings_dict, listener_name(process))
    try:
        assert store.fail_orphans() == []  # alive: its row is recent and it listens
        assert Task.objects.get(pk=task.id).status == "running"
        Run.objects.filter(pk=task.run_id).update(
            heartbeat_at=now - (LIVE_GRACE * lease + timedelta(seconds=1))
        )
        assert [t.id for t in store.fail_orphans()] == [task.id]  # silent for its whole grace
        second = store.create_task(NewTask(owner=user, agent="echo", input="y"))
        store.claim(second.run_id, process)
        Run.objects.filter(pk=second.run_id).update(heartbeat_at=now - 2 * lease)
        assert store.fail_orphans() == []
    finally:
        listener.close()
    # Its listener gone (a killed process's session ends with it): its silent runs are orphans.
    wait_for(lambda: [t.id for t in store.fail_orphans()] == [second.id], timeout=10)
