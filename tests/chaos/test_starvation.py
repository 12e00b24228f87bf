"""Chaos: a machine starved of CPU (busy processes beside the cluster, a short lease) makes no
false orphans: a live worker's heartbeat keeps its runs, and the reaper spares the runs of a
process that is demonstrably alive (docs/operating.md#the-reaper-and-a-backlog)."""

import multiprocessing
import os
import time

import pytest
from django.test.utils import override_settings

from agenttasks import lifecycle
from agenttasks.models import Run, Task
from agenttasks.store.endings import ORPHAN_TEXT

from ..conftest import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres, pytest.mark.chaos]

SETTINGS = {
    "MAX_ACTIVE_TASKS_PER_USER": 0,
    "LEASE_TIMEOUT": 2,
    "HEARTBEAT_INTERVAL": 0.5,
    "REAP_INTERVAL": 1,
}
# `make fuzz` starves the machine at full size (AGENTTASKS_SOAK=1): 2,000 runs beside 16 busy
# processes on 2 cores (a load near 19, as the field saw). `make test` keeps the shape smaller.
SOAK = bool(os.environ.get("AGENTTASKS_SOAK"))
HOGS = 16 if SOAK else 8
TASKS = 2000 if SOAK else 300


def spin(seconds: float) -> None:
    """Burn a CPU for `seconds`."""
    ends = time.monotonic() + seconds
    while time.monotonic() < ends:
        pass


@override_settings(AGENTTASKS=SETTINGS)
@pytest.mark.timeout(300)
def test_a_starved_machine_makes_no_false_orphans(start_cluster, user):
    start_cluster(workers=2, **SETTINGS)
    context = multiprocessing.get_context("spawn")
    hogs = [context.Process(target=spin, args=(240,), daemon=True) for _ in range(HOGS)]
    for hog in hogs:
        hog.start()
    try:
        ids = [
            lifecycle.create(
                owner=user, agent_id="slow", input=f"job {i}", metadata={"seconds": 1}
            ).id
            for i in range(TASKS)
        ]
        wait_for(
            lambda: not Task.objects.filter(pk__in=ids, status__in=["pending", "running"]).exists(),
            timeout=240,
            interval=0.5,
            message="the tasks to end",
        )
    finally:
        for hog in hogs:
            hog.terminate()
    orphaned = Run.objects.filter(error=ORPHAN_TEXT).count()
    assert orphaned == 0, orphaned
    assert Task.objects.filter(pk__in=ids, status="completed").count() == len(ids)
