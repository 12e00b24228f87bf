"""Scaling out: two cluster processes (two nodes) on one Redis broker and one PostgreSQL.

A web node creates the tasks; two worker nodes share the Redis queue. Every task is executed
exactly once, and when one node is SIGKILLed mid-run the other recovers its work: the run it was
executing fails as an orphan, and the jobs it had taken but not started run on the survivor.
"""

import json
import os
import subprocess
import sys

import pytest

from agenttasks.execution.worker import slots_per_process
from agenttasks.models import Event, Run, Task

from ..cluster import ROOT, Cluster, database_env
from ..conftest import wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

REDIS_URL = os.environ.get("AGENTTASKS_TEST_REDIS", "redis://127.0.0.1:6379/0")
ORPHAN = "The server stopped while the task was running"
NODE_SETTINGS = {
    "LEASE_TIMEOUT": 3,
    "HEARTBEAT_INTERVAL": 1,
    "REAP_INTERVAL": 1,
    "REQUEUE_AFTER": 3,
    "MAX_ACTIVE_TASKS_PER_USER": 0,
}

CREATE = """
import json, sys
import django
django.setup()
from django.contrib.auth import get_user_model
from agenttasks import lifecycle
owner = get_user_model().objects.get(pk=int(sys.argv[1]))
ids = []
for spec in json.loads(sys.argv[2]):
    task = lifecycle.create(owner=owner, **spec)
    ids.append(task.id)
print(json.dumps(ids))
"""


@pytest.fixture
def redis_env():
    """The environment of every node: the Redis broker, a queue of this test's own."""
    redis = pytest.importorskip("redis")
    try:
        redis.Redis.from_url(REDIS_URL).ping()
    except redis.exceptions.ConnectionError:
        pytest.skip(f"no Redis at {REDIS_URL} (.ci/run starts one)")
    return {"Q_BROKER": "redis", "REDIS_URL": REDIS_URL, "Q_NAME": f"agenttasks-{os.getpid()}"}


def create(env: dict, owner, specs: list[dict]) -> list[str]:
    """Create tasks from a web node: a process of its own that enqueues on Redis."""
    done = subprocess.run(
        [sys.executable, "-c", CREATE, str(owner.pk), json.dumps(specs)],
        cwd=ROOT,
        env={
            **os.environ,
            **database_env(),
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "AGENTTASKS_TEST_SETTINGS": json.dumps({"MAX_ACTIVE_TASKS_PER_USER": 0}),
            **env,
        },
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def node_of(run: Run, nodes: list[Cluster]) -> Cluster | None:
    """The node whose worker process holds (or held) the run."""
    pid = int(run.worker.split(":")[1]) if run.worker else None
    return next((node for node in nodes if pid in node.started_worker_pids()), None)


def test_two_nodes_execute_each_task_once_and_survive_a_kill(user, redis_env):
    nodes = [
        Cluster(workers=2, settings=NODE_SETTINGS, env=redis_env).start(),
        Cluster(workers=2, settings=NODE_SETTINGS, env=redis_env).start(),
    ]
    try:
        slow = create(
            redis_env, user, [{"agent_id": "slow", "input": "s", "metadata": {"seconds": 60}}]
        )
        echoes = create(
            redis_env, user, [{"agent_id": "echo", "input": f"m{i}"} for i in range(500)]
        )
        running = wait_for(
            lambda: (
                (t := Task.objects.select_related("run").get(pk=slow[0])).status == "running" and t
            ),
            timeout=60,
            message="the slow task running on a node",
        )
        victim = node_of(running.run, nodes)
        assert victim is not None, running.run.worker
        survivor = nodes[1 - nodes.index(victim)]
        wait_for(
            lambda: Task.objects.filter(pk__in=echoes, status="completed").count() >= 50,
            timeout=60,
            message="the backlog under way on both nodes",
        )
        victim.kill()

        def settled():
            return not Task.objects.filter(pk__in=[*slow, *echoes]).live().exists()

        wait_for(settled, timeout=120, interval=0.5, message="every task settled on the survivor")
        orphan = Task.objects.get(pk=slow[0])
        assert (orphan.status, orphan.error) == ("failed", ORPHAN)
        for task in Task.objects.filter(pk__in=echoes).select_related("run"):
            # Executed exactly once: one run, started once. A run the victim was executing when
            # it died is failed as an orphan; everything else completed.
            assert Run.objects.filter(task=task).count() == 1, task.id
            assert Event.objects.filter(task_id=task.id, type="run.started").count() == 1
            if task.status != "completed":
                assert (task.status, task.error) == ("failed", ORPHAN), task.id
                assert node_of(task.run, [victim, survivor]) is victim
        completed = Task.objects.filter(pk__in=echoes, status="completed").count()
        # At most the runs the victim's two workers held in flight (their slots) were cut short.
        assert completed >= len(echoes) - 2 * slots_per_process()
        assert survivor.process.poll() is None
        assert "Traceback" not in survivor.log()
    finally:
        for node in nodes:
            node.kill()
