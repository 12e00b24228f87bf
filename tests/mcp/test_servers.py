# ruff: noqa: F811  (the fixtures imported from tests.mcp_support are parameters here)
"""The MCP endpoint under ASGI (uvicorn) and under WSGI as the README serves it (gunicorn):
progress on a call's stream, elicitation across requests, and a 2026-07-28 call cancelled by
closing its stream."""

import anyio
import pytest
from mcp.types import ElicitResult

from agenttasks.models import Task

from ..conftest import wait_for
from ..mcp_support import (  # noqa: F401  (fixtures)
    MODERN,
    MODES,
    Host,
    alice,
    asgi_server,
    cluster,
    gunicorn_server,
    text,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]


def exercise(url: str, token: str, mode: str) -> None:
    """A call with progress, then a question answered through elicitation."""
    seen = []

    async def progress(value, total, message):
        seen.append((value, total))

    async def elicit(context, params):
        return ElicitResult(action="accept", content={"q1": "HTML"})

    host = Host(url, token, mode, elicitation_callback=elicit)
    slept = host.call(
        "slow", {"input": "nap", "metadata": {"seconds": 1, "steps": 2}}, progress_callback=progress
    )
    assert text(slept) == "Slept 1s" and seen == [(1, 2), (2, 2)]
    assert text(host.call("asker", {"input": "report"})) == "format: HTML"


def cancel_by_closing(url: str, token: str) -> None:
    """A 2026-07-28 call whose client goes away: its task is cancelled."""

    async def body(client):
        started = anyio.Event()

        async def progress(value, total, message):
            started.set()

        async def call():
            await client.call_tool(
                "slow",
                {"input": "long", "metadata": {"seconds": 60, "progress": True}},
                progress_callback=progress,
            )

        async with anyio.create_task_group() as group:
            group.start_soon(call)
            with anyio.fail_after(30):
                await started.wait()
            group.cancel_scope.cancel()

    Host(url, token, MODERN).run(body)
    wait_for(
        lambda: Task.objects.get(agent="slow", input="long").status == "cancelled",
        timeout=15,
        message="the abandoned call's task is cancelled",
    )


@pytest.mark.parametrize("mode", MODES)
def test_calls_under_asgi(asgi_server, alice, cluster, mode):
    exercise(asgi_server, alice.token, mode)


def test_closing_the_stream_cancels_under_asgi(asgi_server, alice, cluster):
    cancel_by_closing(asgi_server, alice.token)


@pytest.mark.parametrize("mode", MODES)
def test_calls_under_gunicorn(gunicorn_server, alice, cluster, mode):
    exercise(gunicorn_server, alice.token, mode)


def test_closing_the_stream_cancels_under_gunicorn(gunicorn_server, alice, cluster):
    cancel_by_closing(gunicorn_server, alice.token)


def test_the_session_stream_stays_open_under_asgi_and_carries_the_wake_up(
    asgi_server, alice, cluster
):
    from ..mcp_support import LEGACY, card

    notices = []

    async def logged(params):
        notices.append(params)

    async def body(client):
        started = await client.call_tool(
            "spawn_task", {"agent_name": "echo", "input": "ping", "label": "pinger"}
        )
        with anyio.fail_after(30):
            while not notices:
                await anyio.sleep(0.05)
        return card(started)["task_id"]

    task_id = Host(asgi_server, alice.token, LEGACY, logging_callback=logged).run(body)
    (notice,) = notices
    assert notice.data["taskIds"] == [task_id]
    assert notice.data["text"].startswith(
        f'[task-notification] Task "pinger" ({task_id}) completed.'
    )
