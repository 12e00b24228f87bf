"""docs/rest.md, scenarios 66–69: budgets, recovery, agents and documentation.

Scenario 66 runs the chat `frugal` agent against the scripted fake model server, on the
in-process worker pool. Scenario 67 runs on a real django-q2 cluster (a subprocess on the test
database) that the test kills with SIGKILL; the `approver` callable stands in for the chat `deployer`.
"""

import re
import threading

import pytest
from django.core.management import call_command

from agenttasks import registry
from agenttasks.broker import queue
from agenttasks.tools import tool

from .conftest import ALLOW_LOOPBACK, agenttasks, error, wait_for

pytestmark = pytest.mark.django_db(transaction=True)
pytest_plugins = ["tests.fake_model"]  # the `model` and `agents` fixtures of the chat runtime

ORPHAN = "The server stopped while the task was running"
OPERATION_IDS = {
    ("/tasks", "post"): "createTask",
    ("/tasks", "get"): "listTasks",
    ("/tasks/{taskId}", "get"): "getTask",
    ("/tasks/{taskId}/status", "get"): "getTaskStatus",
    ("/tasks/{taskId}/wait", "get"): "waitForTask",
    ("/tasks/{taskId}/result", "get"): "getTaskResult",
    ("/tasks/{taskId}/runs", "get"): "listTaskRuns",
    ("/tasks/{taskId}/comments", "post"): "addTaskComment",
    ("/tasks/{taskId}/comments", "get"): "getTaskComments",
    ("/tasks/{taskId}/cancel", "post"): "cancelTask",
    ("/tasks/{taskId}/retry", "post"): "retryTask",
    ("/conversations", "get"): "listConversations",
    ("/conversations", "post"): "createConversation",
    ("/conversations/{conversationId}", "get"): "getConversation",
    ("/conversations/{conversationId}", "patch"): "updateConversation",
    ("/conversations/{conversationId}", "delete"): "deleteConversation",
    ("/conversations/{conversationId}/messages", "get"): "listMessages",
    ("/conversations/{conversationId}/messages", "post"): "postMessage",
    ("/conversations/{conversationId}/events", "get"): "listEvents",
    ("/conversations/{conversationId}/events/stream", "get"): "streamEvents",
    ("/conversations/{conversationId}/actions", "get"): "listActions",
    ("/conversations/{conversationId}/actions/{actionId}", "post"): "resolveAction",
    ("/files/{fileId}", "get"): "getFile",
    ("/files/{fileId}/content", "get"): "getFileContent",
    ("/agents", "get"): "listAgents",
    ("/agents/{agentId}", "get"): "getAgent",
}
SCHEMAS = {
    "Task",
    "TaskResult",
    "Comment",
    "Conversation",
    "Message",
    "Event",
    "PendingAction",
    "Run",
    "File",
    "Agent",
    "Error",
}


@tool(description="Do nothing.")
def noop(ctx, args):
    return "ok"


def test_rest_12_66_budgets(model, agents, as_alice, workers, receiver):
    """The chat `frugal` (max_tokens 50, 30 tokens a call) on the fake model server."""
    from ..fake_model import answer, calls

    agents(
        "frugal",
        model="m-frugal",
        tools=["tests.api.test_api_misc.noop"],
        budget={"max_tokens": 50},
    )
    thirty = {"prompt_tokens": 20, "completion_tokens": 10, "total_tokens": 30}
    seen: dict = {}
    lock = threading.Lock()

    def script(request):
        with lock:
            n = seen[request.first_user] = seen.get(request.first_user, 0) + 1
        if request.first_user == "cut short" or n == 1:  # noop twice, would reply third
            return calls((f"c{n}", "noop", {}), usage=thirty)
        return answer("done within budget", usage=thirty)

    model.script(script)
    with agenttasks(**ALLOW_LOOPBACK):
        cut = as_alice.create("frugal", "cut short", callbackUrl=receiver.url)
        failed = as_alice.wait_status(cut["id"], "failed")
        wait_for(lambda: receiver.bodies(), message="the failed callback")
    assert failed["error"] == "The max_tokens budget (50) was reached"
    assert seen["cut short"] == 2  # stopped after the second call (60 tokens)
    (body,) = receiver.bodies()
    assert (body["status"], body["error"]) == ("failed", failed["error"])
    crossing = as_alice.create("frugal", "cross it")
    as_alice.wait_status(crossing["id"], "completed")
    result = as_alice.get(f"/tasks/{crossing['id']}/result").json()["result"]
    assert result["content"] == "done within budget" and seen["cross it"] == 2
    # The turn that only called `noop` is in the transcript (a message.assistant event with null
    # content), not among the messages.
    logged = as_alice.events(crossing["conversationId"])
    assert [e["data"]["content"] for e in logged if e["type"] == "message.assistant"] == [
        None,
        "done within budget",
    ]
    messages = as_alice.get(f"/conversations/{crossing['conversationId']}/messages").json()[
        "messages"
    ]
    assert [(m["role"], m["content"]) for m in messages] == [
        ("user", "cross it"),
        ("assistant", "done within budget"),
    ]


def test_rest_12_67_recovery(start_cluster, as_alice, gates, receiver):
    cluster_settings = {**ALLOW_LOOPBACK, "HEARTBEAT_INTERVAL": 1, "REAP_INTERVAL": 3600}
    cluster = start_cluster(**cluster_settings)
    with agenttasks(**ALLOW_LOOPBACK):
        gate = gates.new()
        held = as_alice.create("gate", "hold", metadata=gate, callbackUrl=receiver.url)
        approval = as_alice.create("approver", "prod")
        as_alice.wait_status(held["id"], "running", timeout=30)
        as_alice.wait_status(approval["id"], "waiting_for_input", timeout=30)
    cluster.kill()  # the worker dies while the run is at its gate
    # The recording queue sends the failed callback from this process (no cluster is left).
    with queue.use_backend(queue.RecordingQueue()), agenttasks(**ALLOW_LOOPBACK, LEASE_TIMEOUT=1):

        def reaped():
            call_command("agenttasks_reap")
            return as_alice.status(held["id"])["status"] == "failed"

        wait_for(reaped, timeout=15, interval=0.5, message="the reaper failed the orphan")
    body = as_alice.status(held["id"])
    assert body["error"] == ORPHAN
    events = as_alice.events(held["conversationId"])
    (ending,) = [e for e in events if e["type"] == "task.status" and e["data"]["to"] == "failed"]
    assert (ending["data"]["from"], ending["data"]["reason"]) == ("running", "lease expired")
    wait_for(lambda: receiver.bodies(), message="the failed callback")
    assert [(b["status"], b["error"]) for b in receiver.bodies()] == [("failed", ORPHAN)]
    assert as_alice.status(approval["id"])["status"] == "waiting_for_input"


@pytest.fixture
def frugal():
    """A chat agent with a token budget, registered for the listing only (it never runs here)."""
    registry.register("frugal", runtime="chat", budget={"max_tokens": 50}, replace=True)
    yield
    registry.unregister("frugal")


def test_rest_12_68_agents(as_alice, frugal):
    agents = as_alice.get("/agents").json()["agents"]
    ids = [a["id"] for a in agents]
    assert ids == sorted(ids) and "internal" not in ids
    for agent in agents:
        assert {"id", "name", "runtime", "files", "hitl", "metadata"} <= set(agent)
    by_id = {a["id"]: a for a in agents}
    assert by_id["docs"]["files"] == {
        "enabled": True,
        "allowedTypes": ["application/pdf", "text/*"],
        "maxSize": 1024,
        "maxCount": 2,
        "retentionDays": 7,
    }
    assert by_id["strict-approver"]["hitl"] == {"timeoutMinutes": 60, "onTimeout": "cancel"}
    assert by_id["frugal"]["budget"]["maxTokens"] == 50
    echo = as_alice.get("/agents/echo")
    assert echo.status_code == 200 and echo.json() == {"agent": by_id["echo"]}
    for missing in ("internal", "nope"):
        error(as_alice.get(f"/agents/{missing}"), 404, "NOT_FOUND", f"Agent not found: {missing}")


def test_rest_12_69_documentation_offline(anonymous):
    from drf_spectacular.validation import validate_schema

    from agenttasks import __version__

    response = anonymous.get("/docs/openapi.json")
    assert response.status_code == 200 and response["Content-Type"] == "application/json"
    document = response.json()
    validate_schema(document)
    assert document["openapi"].startswith("3.")
    assert (document["info"]["title"], document["info"]["version"]) == ("agenttasks", __version__)
    assert document["servers"] == [{"url": "/api/agents"}]
    for (path, method), operation_id in OPERATION_IDS.items():
        assert document["paths"][path][method]["operationId"] == operation_id, (path, method)
    assert {"/docs", "/docs/openapi.json"} <= set(document["paths"])
    assert SCHEMAS <= set(document["components"]["schemas"])
    tasks_ops = [
        op
        for path, ops in document["paths"].items()
        if path.startswith("/tasks")
        for op in ops.values()
    ]
    assert all(op["tags"] == ["Tasks"] for op in tasks_ops)
    page = anonymous.get("/docs")
    assert page.status_code == 200 and page["Content-Type"].startswith("text/html")
    html = page.content.decode()
    links = re.findall(r'(?:src|href)="([^"]*)"', html)
    assert links and all(link.startswith("/") and not link.startswith("//") for link in links)
    assert "http://" not in html and "https://" not in html
    for link in links:
        asset = anonymous.get(link)
        assert asset.status_code == 200, link
        content = b"".join(asset.streaming_content) if asset.streaming else asset.content
        assert content
    with agenttasks(SERVE_DOCS=False):
        for path in ("/docs", "/docs/openapi.json"):
            error(anonymous.get(path), 404, "NOT_FOUND", f"Route not found: GET /api/agents{path}")
