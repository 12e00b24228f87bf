# ruff: noqa: F811  (the fixtures imported from tests.mcp_support are parameters here)
"""MCP's tasks extension when the worker running the task dies: the client keeps polling and
gets the result (docs/mcp.md#the-tasks-extension). A module of its own: its cluster's short
lease must not meet another cluster's runs."""

import asyncio
import os
import signal

import pytest
from fastmcp_tasks import call_tool_task

from agenttasks.models import Run, Task

from ..conftest import wait_for
from ..mcp_support import alice, server  # noqa: F401  (fixtures)
from .test_tasks_extension import client_for, text

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120), pytest.mark.both]
FAST_REAPER = {"LEASE_TIMEOUT": 3, "HEARTBEAT_INTERVAL": 1, "REAP_INTERVAL": 1}


def kill_the_worker_running(task_id: str) -> str:
    """SIGKILL the worker process executing the task's run; return the run's id."""

    def running():
        run = Task.objects.select_related("run").get(pk=task_id).run
        return run if run.status == "running" and run.worker else None

    run = wait_for(running, timeout=30, message="the task's run to start")
    os.kill(int(run.worker.rsplit(":", 1)[1]), signal.SIGKILL)  # django-q2 starts another
    return run.pk


def test_a_worker_killed_mid_task_changes_nothing_for_the_client(server, alice, start_cluster):
    start_cluster(workers=1, **FAST_REAPER)

    async def main():
        async with client_for(server, alice) as client:
            task = await call_tool_task(
                client, "sturdy", {"input": "nap", "metadata": {"seconds": 3}}
            )
            killed = await asyncio.to_thread(kill_the_worker_running, task.task_id)
            final = await task.wait(timeout=60)
            return task.task_id, killed, final, await task.result()

    task_id, killed, final, result = asyncio.run(main())
    assert final.status == "completed" and text(result) == "Slept 3s"
    lost = Run.objects.get(pk=killed)
    assert (lost.status, lost.error) == ("failed", "The server stopped while the task was running")
    row = Task.objects.get(pk=task_id)
    assert (row.status, row.attempt) == ("completed", 2)  # the policy's second attempt
