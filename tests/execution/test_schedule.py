"""The reaper's django-q2 schedule: exactly one, whatever the number of workers and clusters."""

import pytest
from django_q.models import Schedule

from agenttasks.broker import queue
from agenttasks.execution import reaper

from ..conftest import run_threads, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

INSTALLED = "queue.schedule_ready"


def schedules() -> list[Schedule]:
    return list(Schedule.objects.filter(name=reaper.SCHEDULE_NAME).order_by("id"))


def installed(clusters) -> int:
    """How many worker processes have finished installing the schedule (a debug log line)."""
    return sum(line.count(INSTALLED) for cluster in clusters for line in list(cluster.lines))


def start(start_cluster, count: int, workers: int = 4):
    clusters = [
        start_cluster(workers=workers, env={"AGENTTASKS_LOG": "DEBUG"}) for _ in range(count)
    ]
    wait_for(
        lambda: installed(clusters) >= count * workers,
        timeout=60,
        message="every worker installed the schedule",
    )
    return clusters


def test_four_workers_install_one_schedule(start_cluster):
    start(start_cluster, 1)
    (schedule,) = schedules()
    assert (schedule.func, schedule.schedule_type, schedule.repeats) == (
        "agenttasks.execution.reaper.reap",
        Schedule.MINUTES,
        -1,
    )


def test_two_clusters_keep_one_schedule_and_remove_duplicates(start_cluster):
    for _ in range(3):  # what earlier versions left behind
        Schedule.objects.create(
            name=reaper.SCHEDULE_NAME,
            func="agenttasks.execution.reaper.reap",
            schedule_type=Schedule.MINUTES,
            minutes=1,
            repeats=-1,
        )
    first = schedules()[0].pk
    start(start_cluster, 2)
    assert [s.pk for s in schedules()] == [first]


def test_concurrent_installs_make_one_schedule():
    """Eight processes' worth of installs at the same instant, a few rounds (threads, each with
    its own database connection)."""
    for _ in range(5):
        Schedule.objects.filter(name=reaper.SCHEDULE_NAME).delete()
        results = run_threads(
            lambda i: queue.install_schedule(
                reaper.SCHEDULE_NAME, "agenttasks.execution.reaper.reap"
            ),
            8,
        )
        assert results == [None] * 8
        assert len(schedules()) == 1
