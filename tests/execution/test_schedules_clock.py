"""Schedules on real clusters (docs/lifecycle.md#schedules): a schedule every 2 s fires on its
clock, one task per tick with two clusters running, and stops when paused."""

import pytest

from agenttasks.lifecycle import schedules
from agenttasks.models import ScheduleTick, Task
from agenttasks.states import TickOutcome

from ..conftest import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

CLOCK = {"SCHEDULER_INTERVAL": 0.2, "MAX_ACTIVE_TASKS_PER_USER": 0}


def ticks(schedule) -> list[ScheduleTick]:
    return list(ScheduleTick.objects.filter(schedule=schedule).order_by("due_at"))


def test_a_schedule_every_2_s_fires_once_per_tick_with_two_clusters_and_stops_when_paused(
    start_cluster, user
):
    start_cluster(workers=1, **CLOCK)
    start_cluster(workers=1, **CLOCK)
    schedule = schedules.create_schedule(owner=user, agent_id="echo", input="tick", interval=2)
    witness = schedules.create_schedule(owner=user, agent_id="echo", input="witness", interval=2)
    wait_for(lambda: len(ticks(schedule)) >= 3, timeout=30, message="three ticks")
    schedules.pause_schedule(schedule.id)
    fired = ticks(schedule)
    # The witness ticks twice more after the pause: time enough for the paused one to tick too.
    seen = len(ticks(witness))
    wait_for(lambda: len(ticks(witness)) >= seen + 2, timeout=30, message="the witness ticks")

    # A tick that fired before the pause landed may still act; none is due after it.
    after = ticks(schedule)
    assert len(after) <= len(fired) + 1
    paused_at = type(schedule).objects.get(pk=schedule.pk).paused_at
    assert all(t.due_at <= paused_at for t in after)
    assert {t.outcome for t in after} == {TickOutcome.CREATED}
    dues = [t.due_at for t in after]
    assert len(set(dues)) == len(dues)  # one tick per due time
    assert all((b - a).total_seconds() % 2 == 0 for a, b in zip(dues, dues[1:], strict=False))
    tasks = Task.objects.filter(schedule=schedule)
    assert sorted(tasks.values_list("id", flat=True)) == sorted(t.task_id for t in after)
    wait_for(
        lambda: set(tasks.values_list("status", flat=True)) == {"completed"},
        timeout=30,
        message="the scheduled tasks to run",
    )
