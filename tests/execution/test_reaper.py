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


def orphaned(user):
    task = store.create_task(NewTask(owner=user, agent="echo", input="x"))
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
