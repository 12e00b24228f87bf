# ruff: noqa: F811  (the fixtures imported from tests.mcp_support are parameters here)
"""MCP over stdio (docs/mcp.md#stdio): the SDK's stdio client starts `manage.py agenttasks_mcp`,
spawns a task and reads its result, on both protocol versions, against a real cluster."""

import asyncio
import os
import sys

import pytest
from mcp import Client, StdioServerParameters

from ..cluster import ROOT, database_env
from ..mcp_support import MODES, alice, card, cluster, text  # noqa: F401  (fixtures)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]


def stdio_server(username: str) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable,
        args=["manage.py", "agenttasks_mcp", "--user", username],
        cwd=str(ROOT),
        env={
            **database_env(),
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
        },
    )


@pytest.mark.parametrize("mode", MODES)
def test_stdio_spawns_a_task_and_reads_its_result(alice, cluster, mode):
    async def body():
        async with Client(stdio_server("alice"), mode=mode) as client:
            started = await client.call_tool(
                "spawn_task", {"agent_name": "echo", "input": "over stdio", "label": ""}
            )
            task_id = card(started)["task_id"]
            done = await client.call_tool("task_status", {"task_id": task_id, "wait_seconds": 30})
            direct = await client.call_tool("echo", {"input": "direct"})
            return client.protocol_version, started, done, direct

    version, started, done, direct = asyncio.run(body())
    assert version == ("2025-11-25" if mode == "legacy" else mode)
    assert not started.is_error, text(started)
    assert (card(done)["status"], card(done)["result"]) == ("completed", "Echo: over stdio")
    assert text(direct) == "Echo: direct"
    from agenttasks.models import Task

    assert {t.owner_id for t in Task.objects.all()} == {alice.pk}


def test_an_unknown_user_is_refused(transactional_db):
    import subprocess

    out = subprocess.run(
        [sys.executable, "manage.py", "agenttasks_mcp", "--user", "nobody"],
        cwd=ROOT,
        env={**os.environ, **database_env(), "DJANGO_SETTINGS_MODULE": "tests.settings"},
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert out.returncode != 0 and "No active user 'nobody'" in out.stderr


def test_stdio_answers_a_tasks_extension_call_with_a_task(alice, cluster):
    from fastmcp import Client as FastMCPClient
    from fastmcp.client.transports import StdioTransport
    from fastmcp_tasks import call_tool_task

    params = stdio_server("alice")
    transport = StdioTransport(params.command, params.args, env=params.env, cwd=params.cwd)

    async def body():
        async with FastMCPClient(transport, mode="2026-07-28", timeout=60) as client:
            task = await call_tool_task(client, "echo", {"input": "a task over stdio"})
            return task.task_id, await task.wait(timeout=30), await task.result()

    task_id, final, result = asyncio.run(body())
    assert task_id.startswith("task_") and final.status == "completed"
    assert text(result) == "Echo: a task over stdio"
