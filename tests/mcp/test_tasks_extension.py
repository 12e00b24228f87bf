# ruff: noqa: F811  (the fixtures imported from tests.mcp_support are parameters here)
"""MCP's tasks extension (docs/mcp.md#the-tasks-extension), driven by a client nobody here
wrote: FastMCP's, with `fastmcp-tasks` (`call_tool_task` → `ToolTask`), on 2026-07-28."""

import asyncio

import httpx
import pytest
from fastmcp import Client
from fastmcp.client.transports import StreamableHttpTransport
from fastmcp.exceptions import ToolError
from fastmcp_tasks import call_tool_task
from mcp_types import ElicitResult

from agenttasks.models import Task

from ..conftest import wait_for
from ..mcp_support import alice, bob, cluster, server  # noqa: F401  (fixtures)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120), pytest.mark.both]
PATH = "/api/agents/mcp"
MODERN = "2026-07-28"


def client_for(server, user, mode=MODERN, answer=None) -> Client:
    headers = {"Authorization": f"Token {user.token}"}
    transport = StreamableHttpTransport(server + PATH, headers=headers)
    return Client(transport, mode=mode, elicitation_handler=answer, timeout=60)


def run(server, user, body, **kwargs):
    async def main():
        async with client_for(server, user, **kwargs) as client:
            return await body(client)

    return asyncio.run(main())


def text(result) -> str:
    return result.content[0].text


def test_the_server_advertises_the_extension(server, alice):
    async def body(client):
        return await client.list_tools()

    run(server, alice, body)  # the discover the client made
    raw = httpx.post(
        server + PATH,
        json={
            "jsonrpc": "2.0",
            "id": 1,
            "method": "server/discover",
            "params": {"_meta": envelope()},
        },
        headers=headers_for(alice, "server/discover"),
    ).json()
    assert raw["result"]["capabilities"]["extensions"] == {"io.modelcontextprotocol/tasks": {}}


def test_an_echo_call_as_a_task_completes_and_is_the_same_task_everywhere(server, alice, cluster):
    async def body(client):
        task = await call_tool_task(client, "echo", {"input": "hi"})
        first = await task.status()
        final = await task.wait(timeout=30)
        return task.task_id, first, final, await task.result()

    task_id, first, final, result = run(server, alice, body)
    assert first.status in ("working", "completed") and first.poll_interval_ms == 1000
    assert final.status == "completed" and text(result) == "Echo: hi"
    row = Task.objects.get(pk=task_id)
    assert (row.status, row.agent, row.owner_id) == ("completed", "echo", alice.pk)
    auth = {"Authorization": f"Token {alice.token}"}
    rest = httpx.get(f"{server}/api/agents/tasks/{task_id}", headers=auth).json()["task"]
    assert rest["status"] == "completed"


def test_a_plain_call_tool_still_returns_the_final_result(server, alice, cluster):
    async def body(client):
        return await client.call_tool("echo", {"input": "plain"})

    assert text(run(server, alice, body)) == "Echo: plain"


def test_a_slow_task_is_cancelled(server, alice, cluster):
    async def body(client):
        task = await call_tool_task(client, "slow", {"input": "nap", "metadata": {"seconds": 30}})
        await task.wait(state="working", timeout=10)
        await task.cancel()
        return await task.wait(timeout=30)

    assert run(server, alice, body).status == "cancelled"


def test_a_question_is_input_required_and_answered_through_elicitation(server, alice, cluster):
    asked = []

    async def answer(message, response_type, params, context):
        asked.append(params.requested_schema)
        return {"q1": "PDF"}

    async def body(client):
        task = await call_tool_task(client, "asker", {"input": "report"})
        waiting = await task.wait(state="input_required", timeout=30)
        return waiting, await task.result()

    waiting, result = run(server, alice, body, answer=answer)
    (key,) = waiting.input_requests
    assert key.startswith("act_")  # the keys are the server's: the pending actions' ids
    assert text(result) == "format: PDF"
    assert "q1" in asked[0]["properties"]


def test_a_legacy_clarification_is_input_required_and_answered_as_a_comment(server, alice, cluster):
    asked = []

    async def answer(message, response_type, params, context):
        asked.append((message, params.requested_schema))
        return {"answer": "PDF"}

    async def body(client):
        task = await call_tool_task(client, "clarify", {"input": "report"})
        waiting = await task.wait(state="input_required", timeout=30)
        return task.task_id, waiting, await task.result()

    task_id, waiting, result = run(server, alice, body, answer=answer)
    (key,) = waiting.input_requests
    assert key.startswith("run_")  # the run that asked: a later question is another run
    assert text(result) == "Done in PDF"
    message, schema = asked[0]
    assert message == "Which format?" and schema["required"] == ["answer"]
    comments = Task.objects.get(pk=task_id).comments.values_list("role", "content")
    assert ("user", "PDF") in list(comments)


@pytest.mark.parametrize("approved", [True, False])
def test_an_approval_is_approved_or_declined(server, alice, cluster, approved):
    async def answer(message, response_type, params, context):
        if approved:
            return {"approved": True}
        return ElicitResult(action="decline")

    async def body(client):
        task = await call_tool_task(client, "approver", {"input": "prod"})
        return await task.result()

    if approved:
        assert text(run(server, alice, body, answer=answer)) == "deployed to prod"
    else:
        # A declined approval is a denial (as REST's `approved: false`): the agent goes on.
        assert text(run(server, alice, body, answer=answer)) == "not deployed"


def test_a_failed_agent_ends_completed_with_an_error_result(server, alice, cluster):
    async def body(client):
        task = await call_tool_task(client, "boom", {"input": "x"}, raise_on_error=False)
        final = await task.wait(timeout=30)
        return final, await task.result()

    final, result = run(server, alice, body)
    assert final.status == "completed" and final.result["isError"] is True
    assert result.is_error and "kaboom" in text(result)


def test_a_legacy_client_never_gets_a_task(server, alice, cluster):
    async def body(client):
        plain = await client.call_tool("echo", {"input": "old"})
        with pytest.raises(ToolError):
            await call_tool_task(client, "echo", {"input": "old"})
        return plain

    assert text(run(server, alice, body, mode="legacy")) == "Echo: old"


def envelope(extension: bool = True) -> dict:
    capabilities = {"extensions": {"io.modelcontextprotocol/tasks": {}}} if extension else {}
    return {
        "io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientCapabilities": capabilities,
    }


def headers_for(user, method: str, name: str | None = None) -> dict:
    headers = {
        "Authorization": f"Token {user.token}",
        "MCP-Protocol-Version": MODERN,
        "Mcp-Method": method,
        "Accept": "application/json, text/event-stream",
    }
    if name is not None:
        headers["Mcp-Name"] = name
    return headers


def rpc(server, user, method, params, *, name=None, extension=True) -> dict:
    body = {
        "jsonrpc": "2.0",
        "id": 7,
        "method": method,
        "params": {**params, "_meta": envelope(extension)},
    }
    return httpx.post(server + PATH, json=body, headers=headers_for(user, method, name)).json()


def test_another_users_or_unknown_or_malformed_task_requests_are_protocol_errors(
    server, alice, bob, cluster
):
    async def body(client):
        task = await call_tool_task(client, "echo", {"input": "mine"})
        return task.task_id

    task_id = run(server, alice, body)
    wait_for(lambda: Task.objects.get(pk=task_id).status == "completed", timeout=30)
    for method in ("tasks/get", "tasks/cancel"):
        refused = rpc(server, bob, method, {"taskId": task_id}, name=task_id)
        assert refused["error"]["code"] == -32602, refused
    assert rpc(server, alice, "tasks/get", {"taskId": "task_nobody"})["error"]["code"] == -32602
    assert rpc(server, alice, "tasks/get", {})["error"]["code"] == -32602
    assert rpc(server, alice, "tasks/get", {"taskId": 5})["error"]["code"] == -32602
    wrong = rpc(server, alice, "tasks/get", {"taskId": task_id}, name="task_other")
    assert wrong["error"]["code"] == -32020  # HEADER_MISMATCH
    undeclared = rpc(server, alice, "tasks/get", {"taskId": task_id}, extension=False)
    assert undeclared["error"]["code"] == -32021
    bad_update = rpc(server, alice, "tasks/update", {"taskId": task_id, "inputResponses": []})
    assert bad_update["error"]["code"] == -32602
    stale = rpc(server, alice, "tasks/update", {"taskId": task_id, "inputResponses": {"act_x": {}}})
    assert stale["result"] == {"resultType": "complete"}  # an unknown key is ignored
    got = rpc(server, alice, "tasks/get", {"taskId": task_id}, name=task_id)["result"]
    assert got["status"] == "completed" and got["result"]["content"][0]["text"] == "Echo: mine"
    assert got["ttlMs"] > 0 and got["taskId"] == task_id and got["resultType"] == "complete"


def test_the_docs_example_runs(server, alice, cluster, capsys):
    from ..cluster import ROOT

    doc = (ROOT / "docs" / "mcp.md").read_text()
    section = doc[doc.index("## The tasks extension") :]
    snippet = section.split("```python\n", 1)[1].split("```", 1)[0]
    snippet = snippet.replace("http://127.0.0.1:8000", server).replace("<key>", alice.token)
    exec(compile(snippet, "docs/mcp.md", "exec"), {})
    task_id, reply = capsys.readouterr().out.strip().split(" ", 1)
    assert task_id.startswith("task_") and reply == "Echo: hi"


def test_notifications_tasks_arrive_for_a_listened_task(server, alice, bob, cluster):
    import json

    async def body(client):
        task = await call_tool_task(client, "slow", {"input": "nap", "metadata": {"seconds": 1}})
        return task.task_id

    task_id = run(server, alice, body)
    others = run(server, bob, lambda c: call_tool_task(c, "echo", {"input": "theirs"}))
    params = {"notifications": {"taskIds": [task_id, others.task_id]}, "_meta": envelope()}
    request = {"jsonrpc": "2.0", "id": 9, "method": "subscriptions/listen", "params": params}
    seen = []
    with httpx.stream(
        "POST",
        server + PATH,
        json=request,
        headers=headers_for(alice, "subscriptions/listen"),
        timeout=60,
    ) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            message = json.loads(line[len("data: ") :])
            seen.append(message)
            if message["params"].get("status") == "completed":
                break
    ack, *notes = seen
    assert ack["method"] == "notifications/subscriptions/acknowledged"
    assert ack["params"]["notifications"]["taskIds"] == [task_id]  # bob's is not alice's
    assert {n["method"] for n in notes} == {"notifications/tasks"}
    assert all(n["params"]["taskId"] == task_id for n in notes)
    assert notes[-1]["params"]["result"]["content"][0]["text"] == "Slept 1s"


def test_a_clarification_answered_by_tasks_update_is_checked_and_its_key_goes_stale(
    server, alice, cluster
):
    async def body(client):
        return (await call_tool_task(client, "clarify", {"input": "report"})).task_id

    task_id = run(server, alice, body)
    asking = wait_for(
        lambda: Task.objects.filter(pk=task_id, status="waiting_for_input").first(), timeout=30
    )
    key = asking.run_id

    def update(response):
        params = {"taskId": task_id, "inputResponses": {key: response}}
        return rpc(server, alice, "tasks/update", params, name=task_id)

    assert update("HTML")["error"]["code"] == -32602  # not an elicitation result
    assert update({"action": "decline"})["result"] == {"resultType": "complete"}
    assert Task.objects.get(pk=task_id).status == "waiting_for_input"  # a decline answers nothing
    assert update({"action": "accept", "content": {"answer": "HTML"}})["result"]
    wait_for(lambda: Task.objects.get(pk=task_id).status == "completed", timeout=30)
    assert update({"action": "accept", "content": {"answer": "PDF"}})["result"]  # stale: ignored
    got = rpc(server, alice, "tasks/get", {"taskId": task_id})["result"]
    assert got["result"]["content"][0]["text"] == "Done in HTML"
    assert Task.objects.get(pk=task_id).comments.filter(role="user").count() == 1
