"""Chaos: restart PostgreSQL while tasks run; everything recovers without an operator."""

import json
import subprocess
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest
from django.db import InterfaceError, OperationalError, connection
from django.test.utils import override_settings

from agenttasks import lifecycle
from agenttasks.exceptions import TaskError
from agenttasks.models import Event, Run, Task

from ..conftest import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres, pytest.mark.chaos]

SETTINGS = {
    "MAX_ACTIVE_TASKS_PER_USER": 0,
    "LEASE_TIMEOUT": 4,
    "HEARTBEAT_INTERVAL": 1,
    "REAP_INTERVAL": 1,
    "REQUEUE_AFTER": 5,
    "MAX_ATTEMPTS": 20,
}


def restart_postgres() -> None:
    version = sorted(p.name for p in Path("/etc/postgresql").iterdir())[0]
    subprocess.run(
        ["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", "restart", "-m", "fast"],
        check=True,
        capture_output=True,
        timeout=120,
    )


def tolerant(read):
    """Evaluate `read`, reconnecting when the database connection is broken."""

    def attempt():
        try:
            return read()
        except (OperationalError, InterfaceError):
            connection.close()
            return None

    return attempt


@override_settings(AGENTTASKS=SETTINGS)
def test_database_restart(start_cluster, user, live_server):
    start_cluster(workers=2, **SETTINGS)
    ids = []
    for i in range(150):
        agent = "slow" if i % 5 == 0 else "echo"
        metadata = {"seconds": 2} if agent == "slow" else None
        ids.append(
            lifecycle.create(owner=user, agent_id=agent, input=f"job {i}", metadata=metadata).id
        )
    wait_for(
        lambda: Task.objects.filter(pk__in=ids, status="running").exists(), message="work in flight"
    )
    restart_postgres()
    restarted_at = time.monotonic()
    connection.close()

    def settled():
        for task in Task.objects.filter(pk__in=ids, status="failed"):
            try:
                lifecycle.retry(task.id)  # the runs the restart broke are failed by the reaper
            except TaskError:
                pass
        return not Task.objects.filter(pk__in=ids).exclude(status="completed").exists()

    wait_for(
        tolerant(settled),
        timeout=180,
        interval=0.5,
        message="every task completed after the restart",
    )
    recovered = time.monotonic() - restarted_at

    # The web server answers again without anyone restarting it.
    answer = wait_for(
        lambda: (
            (r := httpx.get(f"{live_server.url}/admin/login/", timeout=5)).status_code == 200 and r
        ),
        timeout=30,
        message="the web server to answer",
    )
    assert answer.status_code == 200
    not_terminal = Task.objects.exclude(status__in=("completed", "failed", "cancelled")).count()
    lost = Task.objects.filter(pk__in=ids).exclude(status="completed").count()
    own = dict(Task.objects.filter(pk__in=ids).values_list("id", "conversation_id"))
    finals = Counter(
        (e.task_id, e.data["runId"])
        for e in Event.objects.filter(
            task_id__in=ids, type="task.status", data__to__in=["completed", "failed"]
        )
        if own[e.task_id] == e.conversation_id
    )
    duplicates = sum(1 for n in finals.values() if n > 1)
    assert (not_terminal, lost, duplicates) == (0, 0, 0)
    broken = Run.objects.filter(task_id__in=ids, status="failed").count()
    print(
        json.dumps(
            {
                "tasks": len(ids),
                "restarts": 1,
                "recovered_after_s": round(recovered, 1),
                "runs_failed_by_the_restart": broken,
                "lost": lost,
                "duplicates_found": duplicates,
            }
        )
    )
