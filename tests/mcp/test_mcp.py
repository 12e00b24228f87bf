# ruff: noqa: F811  (the fixtures imported from tests.mcp_support are parameters here)
"""MCP over the same durable tasks (docs/mcp.md): a live server, a real django-q2 cluster and the
real `mcp` client, on both protocol versions (2025-11-25 and 2026-07-28)."""

import httpx
import pytest
from django.contrib.admin.utils import quote
from django.test import Client

from ..mcp_support import (  # noqa: F401  (fixtures)
    MODES,
    PREFIX,
    alice,
    bob,
    cluster,
    host,
    server,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]


@pytest.mark.parametrize("mode", MODES)
def test_list_tools(host, mode):
    from agenttasks import registry
    from agenttasks.runtime.task_tools import task_tools

    from ..agents import echo

    registry.register("private", runtime="callable", handler=echo, mcp=False, replace=True)
    try:

        async def body(client):
            if mode == "legacy":
                instructions = client.instructions
            else:  # a pinned version adopts a discover result of its own: ask the server's
                instructions = (await client.session.send_discover(mode))["instructions"]
            return await client.list_tools(), client.protocol_version, instructions

        listed, version, instructions = host(mode).run(body)
    finally:
        registry.unregister("private")
    assert version == ("2025-11-25" if mode == "legacy" else mode)
    tools = {t.name: t for t in listed.tools}
    ours = {t.name: t for t in task_tools(None)}
    for name, spec in ours.items():  # the very tools our own models get
        assert tools[name].description == spec.description
        if name != "spawn_task":
            assert tools[name].input_schema == spec.parameters
        assert tools[name].output_schema is None
    # spawn_task as a host gets it: no current agent to fall back on, the served ones named.
    agent_name = tools["spawn_task"].input_schema["properties"]["agent_name"]
    assert "current agent" not in agent_name["description"]
    assert agent_name["description"].startswith("Agent to run the task with, one of: ")
    assert "echo" in agent_name["description"] and "private" not in agent_name["description"]
    spawn_properties = tools["spawn_task"].input_schema["properties"]
    assert set(spawn_properties) == set(ours["spawn_task"].parameters["properties"])
    assert tools["task_answer"].input_schema["required"] == ["action_id", "answer"]
    annotations = {name: tools[name].annotations for name in (*ours, "task_answer")}
    assert annotations["spawn_task"].read_only_hint is False
    assert annotations["task_status"].read_only_hint is True
    assert annotations["task_stop"].destructive_hint is True
    assert all(a is not None for a in annotations.values())
    echo_tool = tools["echo"]
    assert echo_tool.input_schema["required"] == ["input"]
    assert echo_tool.output_schema["required"] == ["taskId", "status"]
    assert echo_tool.annotations.read_only_hint is False
    # Served: exposed agents that did not opt out (`mcp: False`).
    assert {"echo", "slow", "asker", "approver", "boom"} <= set(tools)
    assert "internal" not in tools and "private" not in tools
    assert "spawn_task's agent_name is one of: " in instructions and "echo" in instructions


def test_the_index_lists_the_endpoint(server):
    index = httpx.get(f"{server}{PREFIX}/").json()
    assert index["mcp"] == PREFIX + "/mcp"


def test_without_the_extra_the_app_loads_and_serves_no_mcp_route():
    import os
    import subprocess
    import sys

    from ..cluster import ROOT

    script = (
        "import sys; sys.modules['mcp_types'] = None\n"  # as if mcp-types were not installed
        "import django; django.setup()\n"
        "from django.urls import resolve\n"
        "from agenttasks import mcp, models\n"
        "print(mcp.available(), resolve('/api/agents/mcp').url_name)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "project.settings"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "route-not-found"]


@pytest.mark.parametrize("mode", MODES)
def test_spawn_echo_and_poll_it_to_completion(host, alice, cluster, mode):
    from ..mcp_support import card, text

    async def body(client):
        started = await client.call_tool(
            "spawn_task", {"agent_name": "echo", "input": "hi", "label": ""}
        )
        task_id = card(started)["task_id"]
        done = await client.call_tool("task_status", {"task_id": task_id, "wait_seconds": 30})
        return started, done

    started, done = host(mode).run(body)
    assert not started.is_error and card(started)["status"] == "working", text(started)
    assert card(done)["status"] == "completed", text(done)
    assert card(done)["result"] == "Echo: hi"
    # The task is an agenttasks task: the REST API and the admin show it.
    task_id = card(done)["task_id"]
    auth = {"Authorization": f"Token {alice.token}"}
    rest = httpx.get(f"{host(mode).server}{PREFIX}/tasks/{task_id}", headers=auth).json()["task"]
    assert (rest["status"], rest["summary"]) == ("completed", "Echo: hi")
    listed = httpx.get(f"{host(mode).server}{PREFIX}/tasks", headers=auth).json()["tasks"]
    assert [t["id"] for t in listed] == [task_id]
    alice.is_staff = alice.is_superuser = True
    alice.save()
    admin = Client()
    admin.force_login(alice)
    page = admin.get(f"/admin/agenttasks/task/{quote(task_id)}/change/")
    assert page.status_code == 200 and "Echo: hi" in page.content.decode()


@pytest.mark.parametrize("mode", MODES)
def test_slow_agent_with_a_progress_token(host, cluster, mode):
    from ..mcp_support import text

    seen = []

    async def progress(value, total, message):
        seen.append((value, total, message))

    result = host(mode).call(
        "slow",
        {"input": "nap", "metadata": {"seconds": 1.5, "steps": 3}},
        progress_callback=progress,
    )
    assert not result.is_error, text(result)
    assert text(result) == "Slept 1.5s"
    assert result.structured_content["status"] == "completed"
    assert seen == [
        (1, 3, "step 1/3 (sleep)"),
        (2, 3, "step 2/3 (sleep)"),
        (3, 3, "step 3/3 (sleep)"),
    ]


@pytest.mark.parametrize("mode", MODES)
def test_asker_answered_through_elicitation(host, cluster, mode):
    from mcp.types import ElicitResult

    from ..mcp_support import text

    asked = []

    async def elicit(context, params):
        asked.append(params)
        return ElicitResult(action="accept", content={"q1": "PDF"})

    result = host(mode, elicitation_callback=elicit).call("asker", {"input": "report"})
    assert text(result) == "format: PDF", text(result)
    (params,) = asked
    assert params.message == "Which format?"
    assert params.requested_schema["properties"]["q1"]["enum"] == ["PDF", "HTML"]
    assert params.requested_schema["required"] == ["q1"]


@pytest.mark.parametrize("mode", MODES)
def test_asker_answered_with_task_answer_without_elicitation(host, cluster, mode):
    import re

    from ..mcp_support import card, text

    async def body(client):
        asked = await client.call_tool("asker", {"input": "report"})
        action_id = re.search(r"- (act_\S+) \(question q1\): Which format\?", text(asked))[1]
        task_id = asked.structured_content["taskId"]
        answered = await client.call_tool(
            "task_answer", {"action_id": action_id, "answer": {"answers": {"q1": "PDF"}}}
        )
        done = await client.call_tool("task_status", {"task_id": task_id, "wait_seconds": 30})
        return asked, answered, done

    asked, answered, done = host(mode).run(body)
    assert not asked.is_error and asked.structured_content["status"] == "waiting_for_input"
    assert card(asked)["status"] == "input_required"
    assert "Options: PDF, HTML." in text(asked) and "task_answer" in text(asked)
    assert not answered.is_error and text(answered).startswith("action act_"), text(answered)
    assert card(done)["result"] == "format: PDF"


@pytest.mark.parametrize("mode", MODES)
def test_a_client_cancel_stops_the_task(host, cluster, mode):
    import anyio

    from agenttasks.models import Task

    from ..conftest import wait_for

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

    host(mode).run(body)
    task = Task.objects.get(agent="slow")
    # The worker takes the stop at its next heartbeat (HEARTBEAT_INTERVAL, 5 s, on SQLite).
    wait_for(
        lambda: Task.objects.get(pk=task.pk).status == "cancelled",
        timeout=30,
        message="the cancelled call's task is cancelled",
    )


@pytest.mark.parametrize("mode", MODES)
def test_task_stop_on_a_finished_task_gives_the_contracts_text(host, cluster, mode):
    from ..mcp_support import card, text

    async def body(client):
        started = await client.call_tool(
            "spawn_task", {"agent_name": "echo", "input": "hi", "label": "greet"}
        )
        task_id = card(started)["task_id"]
        await client.call_tool("task_status", {"task_id": task_id, "wait_seconds": 30})
        return task_id, await client.call_tool("task_stop", {"task_id": task_id, "graceful": False})

    task_id, stopped = host(mode).run(body)
    assert stopped.is_error
    assert text(stopped) == f"task_id: {task_id}\nstatus: completed\nlabel: greet\nresult: Echo: hi"


@pytest.mark.parametrize("mode", MODES)
def test_another_users_task_is_not_found_on_every_tool(host, alice, bob, cluster, mode):
    from agenttasks.models import PendingAction, Task

    from ..conftest import wait_for
    from ..mcp_support import card, text

    async def spawn(client):
        out = []
        for agent in ("echo", "asker"):
            started = await client.call_tool(
                "spawn_task", {"agent_name": agent, "input": "mine", "label": ""}
            )
            out.append(card(started)["task_id"])
        return out

    echo_id, asker_id = host(mode).run(spawn)
    wait_for(
        lambda: Task.objects.get(pk=asker_id).status == "waiting_for_input",
        timeout=30,
        message="the asker waits",
    )
    action_id = PendingAction.objects.get(task_id=asker_id).id

    async def intrude(client):
        return [
            await client.call_tool("task_status", {"task_id": echo_id, "wait_seconds": 0}),
            await client.call_tool("task_retry", {"task_id": echo_id}),
            await client.call_tool("task_stop", {"task_id": asker_id, "graceful": False}),
            await client.call_tool(
                "task_answer", {"action_id": action_id, "answer": {"answers": {"q1": "PDF"}}}
            ),
            await client.call_tool("task_status", {"task_id": "", "wait_seconds": 0}),
        ]

    *refused, listing = host(mode, user=bob).run(intrude)
    assert [(r.is_error, text(r)) for r in refused] == [
        (True, "tasks: not found"),
        (True, "tasks: not found"),
        (True, "tasks: not found"),
        (True, f"Action not found: {action_id}"),
    ]
    assert text(listing) == "no tasks in this conversation"
    assert Task.objects.get(pk=asker_id).status == "waiting_for_input"


def test_a_callers_tasks_are_reachable_by_id_from_its_next_session(host, cluster):
    """A host that opens a session per call (2025-11-25) finds its tasks again by id."""
    from agenttasks.models import PendingAction, Task

    from ..conftest import wait_for
    from ..mcp_support import card, text

    async def spawn(client):
        ids = []
        for agent in ("echo", "asker"):
            started = await client.call_tool(
                "spawn_task", {"agent_name": agent, "input": "mine", "label": ""}
            )
            ids.append(card(started)["task_id"])
        return ids

    echo_id, asker_id = host("legacy").run(spawn)
    wait_for(
        lambda: Task.objects.get(pk=asker_id).status == "waiting_for_input",
        timeout=30,
        message="the asker waits",
    )
    action_id = PendingAction.objects.get(task_id=asker_id).id

    async def later(client):
        return [
            await client.call_tool("task_status", {"task_id": echo_id, "wait_seconds": 10}),
            await client.call_tool(
                "task_answer", {"action_id": action_id, "answer": {"answers": {"q1": "PDF"}}}
            ),
            await client.call_tool("task_status", {"task_id": asker_id, "wait_seconds": 10}),
            await client.call_tool("task_retry", {"task_id": echo_id}),
            await client.call_tool("task_stop", {"task_id": echo_id, "graceful": False}),
            await client.call_tool("task_status", {"task_id": "", "wait_seconds": 0}),
        ]

    echo, answered, asker, retry, stop, listing = host("legacy").run(later)
    assert card(echo)["status"] == "completed", text(echo)
    assert not answered.is_error, text(answered)
    assert card(asker)["status"] == "completed" and card(asker)["result"] == "format: PDF"
    # Found, and refused for what they are: echo completed, so there is nothing to resume or stop.
    assert retry.is_error and "not found" not in text(retry), text(retry)
    assert "not found" not in text(stop), text(stop)
    assert text(listing) == "no tasks in this conversation"  # the listing stays per session


@pytest.mark.parametrize("mode", MODES)
def test_anonymous_calls_are_refused_as_rest_refuses_them(host, server, mode, settings):
    import httpx

    from agenttasks.models import Task

    from ..mcp_support import PREFIX, Host, post, refusal

    rest = httpx.get(f"{server}{PREFIX}/tasks")
    raw = post(server, {"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
    assert rest.status_code == raw.status_code == 401
    assert raw.headers["WWW-Authenticate"] == rest.headers["WWW-Authenticate"]
    assert raw.json()["error"]["message"] == rest.json()["error"]["message"]
    assert raw.json()["error"]["data"]["code"] == rest.json()["error"]["code"]
    anonymous = refusal(lambda: host(mode, user=None).run(lambda client: client.list_tools()))
    assert anonymous.error.message == "Authentication required"
    forged = Host(server, "not-a-token", mode)
    assert refusal(lambda: forged.run(lambda c: c.list_tools())).error.message == "Invalid token."
    settings.AGENTTASKS = {**settings.AGENTTASKS, "ALLOW_ANONYMOUS": True}
    started = host(mode, user=None).call(
        "spawn_task", {"agent_name": "echo", "input": "hi", "label": ""}
    )
    assert not started.is_error
    assert Task.objects.get().owner_id is None


@pytest.mark.parametrize("mode", MODES)
def test_a_finished_task_wakes_no_run_and_task_status_delivers_it(host, cluster, mode, settings):
    import anyio

    from agenttasks.models import Run, Task, Wakeup

    from ..mcp_support import card, text

    settings.AGENTTASKS = {**settings.AGENTTASKS, "STREAM_KEEPALIVE_SECONDS": 1}
    notices = []

    async def logged(params):
        notices.append(params)

    async def body(client):
        started = await client.call_tool(
            "spawn_task", {"agent_name": "echo", "input": "ping", "label": "pinger"}
        )
        task_id = card(started)["task_id"]
        if mode == "legacy":  # the session's stream carries the news
            with anyio.fail_after(30):
                while not notices:
                    await anyio.sleep(0.05)
        else:  # nothing carries it: the task ends, and it waits to be pulled
            with anyio.fail_after(30):
                while not await anyio.to_thread.run_sync(
                    lambda: Wakeup.objects.filter(task_id=task_id).exists()
                ):
                    await anyio.sleep(0.05)
        first = await client.call_tool("task_status", {"task_id": "", "wait_seconds": 0})
        again = await client.call_tool("task_status", {"task_id": "", "wait_seconds": 0})
        return task_id, first, again

    task_id, first, again = host(mode, logging_callback=logged).run(body)
    line = f'[task-notification] Task "pinger" ({task_id}) completed. Result: Echo: ping'
    if mode == "legacy":
        (notice,) = notices
        assert notice.level == "notice" and notice.logger == "agenttasks"
        assert notice.data["text"].startswith(line) and notice.data["taskIds"] == [task_id]
    assert text(first).startswith(line + "\n")
    assert f"- {task_id}: completed · pinger — Echo: ping" in text(first)
    assert "[task-notification]" not in text(again)
    assert Wakeup.objects.get(task_id=task_id).state == "consumed"
    parent = Task.objects.get(pk=task_id).parent_conversation_id
    assert not Run.objects.filter(conversation_id=parent).exists()


@pytest.mark.parametrize("mode", MODES)
def test_an_approval_is_a_boolean_with_a_comment(host, cluster, mode):
    from mcp.types import ElicitResult

    from agenttasks.models import PendingAction

    from ..mcp_support import text

    asked = []

    async def elicit(context, params):
        asked.append(params)
        return ElicitResult(action="accept", content={"approved": False, "comment": "not today"})

    result = host(mode, elicitation_callback=elicit).call("approver", {"input": "prod"})
    assert text(result) == "not deployed"
    (params,) = asked
    assert params.message == 'Allow deploy with arguments {"env": "prod"}?'  # the action's prompt
    schema = params.requested_schema
    assert schema["properties"]["approved"]["type"] == "boolean"
    assert schema["properties"]["comment"]["type"] == "string"
    assert schema["required"] == ["approved"]
    action = PendingAction.objects.get()
    assert (action.status, action.resolution["comment"]) == ("denied", "not today")


@pytest.mark.parametrize("mode", MODES)
def test_a_declined_question_leaves_the_task_waiting_for_task_answer(host, cluster, mode):
    from mcp.types import ElicitResult

    from agenttasks.models import Task

    from ..mcp_support import card, text

    async def elicit(context, params):
        return ElicitResult(action="decline")

    result = host(mode, elicitation_callback=elicit).call("asker", {"input": "report"})
    assert not result.is_error
    assert card(result)["status"] == "input_required"
    assert "The person declined to answer" in text(result)
    assert "(question q1): Which format? Options: PDF, HTML." in text(result)
    assert Task.objects.get().status == "waiting_for_input"


@pytest.mark.parametrize("mode", MODES)
def test_a_call_that_outlives_the_timeout_answers_with_the_task(host, cluster, mode, settings):
    from ..mcp_support import card, text

    settings.AGENTTASKS = {**settings.AGENTTASKS, "MCP_CALL_TIMEOUT": 1}

    async def body(client):
        early = await client.call_tool("slow", {"input": "nap", "metadata": {"seconds": 3}})
        task_id = early.structured_content["taskId"]
        done = await client.call_tool("task_status", {"task_id": task_id, "wait_seconds": 30})
        return early, done

    early, done = host(mode).run(body)
    assert not early.is_error
    assert early.structured_content["status"] in ("pending", "running")
    assert card(early)["status"] == "working"
    assert "this call waited 1 s (MCP_CALL_TIMEOUT)" in text(early)
    assert "task_status" in text(early)
    assert (card(done)["status"], card(done)["result"]) == ("completed", "Slept 3s")


@pytest.mark.parametrize("mode", MODES)
def test_a_failed_task_is_an_error_result_and_task_retry_resumes_it(host, cluster, mode):
    from ..mcp_support import card, text

    async def body(client):
        failed = await client.call_tool("boom", {"input": "go"})
        retried = await client.call_tool(
            "task_retry", {"task_id": failed.structured_content["taskId"]}
        )
        return failed, retried

    failed, retried = host(mode).run(body)
    assert failed.is_error
    assert (card(failed)["status"], card(failed)["result"]) == ("failed", "kaboom"), text(failed)
    assert failed.structured_content["error"] == "kaboom"
    assert not retried.is_error, text(retried)
    # Resumed as attempt 2; boom fails again at once, so the card may already say so.
    assert card(retried)["attempt"] == "2" and card(retried)["status"] in ("working", "failed")


def readme_example() -> str:
    """The client example of the README's MCP section."""
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme.split("\n## MCP\n", 1)[1].split("\n## ", 1)[0]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


def test_the_readme_client_example_runs(server, alice, cluster, capsys):
    code = readme_example()
    assert len(code.strip().splitlines()) <= 12
    code = code.replace("http://127.0.0.1:8000", server).replace("<key>", alice.token)
    exec(compile(code, "README.md", "exec"), {})
    assert capsys.readouterr().out.strip() == "completed Echo: hi"
