"""The isolation matrix: every endpoint × {owner, another user, anonymous, anonymous with
ALLOW_ANONYMOUS, anonymous with ALLOW_ANONYMOUS_LIST}.

Each case asserts the status (and the error code of a refusal) and that nothing the owner (alice)
has changed: her tasks, conversations, events, actions, comments, runs and files. The owner's
resources are built through the lifecycle and the store (no worker needed).
"""

from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.authtoken.models import Token

from agenttasks import lifecycle, store
from agenttasks.models import Comment, Conversation, Event, File, PendingAction, Run, Task
from agenttasks.types import ActionRequest, RunOutcome

from ..factories import UserFactory
from .conftest import Api, agenttasks, b64

pytestmark = pytest.mark.django_db(transaction=True)

PRINCIPALS = ["owner", "other", "anonymous", "anonymous_allowed", "anonymous_list"]

# (name, method, path template, body, owner's status)
ENDPOINTS = [
    ("createTask", "POST", "/tasks", {"agentId": "echo", "input": "x"}, 201),
    ("listTasks", "GET", "/tasks", None, 200),
    ("getTask", "GET", "/tasks/{task}", None, 200),
    ("getTaskStatus", "GET", "/tasks/{task}/status", None, 200),
    ("waitForTask", "GET", "/tasks/{task}/wait?timeout=0", None, 200),
    ("getTaskResult", "GET", "/tasks/{task}/result", None, 200),
    ("listTaskRuns", "GET", "/tasks/{task}/runs", None, 200),
    ("addTaskComment", "POST", "/tasks/{task}/comments", {"content": "more"}, 201),
    ("getTaskComments", "GET", "/tasks/{task}/comments", None, 200),
    ("cancelTask", "POST", "/tasks/{task}/cancel", None, 409),  # a completed task
    ("retryTask", "POST", "/tasks/{task}/retry", None, 409),  # not failed
    ("listConversations", "GET", "/conversations", None, 200),
    ("createConversation", "POST", "/conversations", {"agentId": "echo"}, 201),
    ("getConversation", "GET", "/conversations/{conversation}", None, 200),
    ("updateConversation", "PATCH", "/conversations/{conversation}", {"title": "t"}, 200),
    ("deleteConversation", "DELETE", "/conversations/{conversation}", None, 204),
    ("listMessages", "GET", "/conversations/{conversation}/messages", None, 200),
    ("postMessage", "POST", "/conversations/{conversation}/messages", {"message": "m"}, 202),
    ("listEvents", "GET", "/conversations/{conversation}/events", None, 200),
    (
        "streamEvents",
        "GET",
        "/conversations/{conversation}/events/stream?until=terminal",
        None,
        200,
    ),
    ("listActions", "GET", "/conversations/{paused}/actions", None, 200),
    ("resolveAction", "POST", "/conversations/{paused}/actions/{action}", {"approved": True}, 200),
    ("getFile", "GET", "/files/{file}", None, 200),
    ("getFileContent", "GET", "/files/{file}/content", None, 200),
    ("listAgents", "GET", "/agents", None, 200),
    ("getAgent", "GET", "/agents/echo", None, 200),
    ("docs", "GET", "/docs", None, 200),
    ("openapi", "GET", "/docs/openapi.json", None, 200),
]
LISTS = {"listTasks", "listConversations", "listAgents", "getAgent"}
CREATES = {"createTask", "createConversation"}
DOCS = {"docs", "openapi"}


def expected(principal: str, name: str, owner_status: int) -> tuple[int, str | None]:
    """The status (and error code) a principal gets on alice's resources."""
    if name in DOCS:
        return 200, None
    if principal == "owner":
        return owner_status, None
    if principal == "anonymous" or (principal == "anonymous_list" and name != "listTasks"):
        return 401, "identity_required"
    if principal == "anonymous_list":
        return 200, None
    if name in CREATES:
        return 201, None
    if name in LISTS:
        return 200, None
    return 403, "FORBIDDEN"


def owners_world(owner) -> dict:
    """Everything alice owns, as comparable values."""
    conversations = Conversation.objects.filter(owner=owner)
    ids = list(conversations.values_list("id", flat=True))
    return {
        "tasks": sorted(
            Task.objects.filter(owner=owner).values_list(
                "id", "status", "run_id", "attempt", "updated_at", "summary"
            )
        ),
        "conversations": sorted(
            conversations.values_list("id", "title", "metadata", "last_seq", "updated_at")
        ),
        "events": Event.objects.filter(conversation_id__in=ids).count(),
        "runs": sorted(Run.objects.filter(conversation_id__in=ids).values_list("id", "status")),
        "actions": sorted(
            PendingAction.objects.filter(conversation_id__in=ids).values_list("id", "status")
        ),
        "comments": Comment.objects.filter(task__owner=owner).count(),
        "files": sorted(File.objects.filter(owner=owner).values_list("id", "name")),
    }


@pytest.fixture
def world(alice, as_alice):
    """Alice's completed task with a file, and a task of hers paused on an approval."""
    created = as_alice.create(
        "docs", "hello", files=[{"name": "a.txt", "content": b64(b"abc"), "mimeType": "text/plain"}]
    )
    task = Task.objects.read(created["id"])
    store.claim(task.run_id, "test")
    lifecycle.on_run_finished(
        task.conversation_id,
        RunOutcome(
            task.run_id, "completed", text="Echo: hello", task_result={"content": "Echo: hello"}
        ),
    )
    paused = lifecycle.create(owner=alice, agent_id="approver", input="prod")
    store.claim(paused.run_id, "test")
    request = ActionRequest(
        kind="approval",
        tool_name="deploy",
        tool_call_id="call-1",
        args={"env": "prod"},
        deadline=timezone.now() + timedelta(hours=1),
    )
    lifecycle.on_run_finished(
        paused.conversation_id, RunOutcome(paused.run_id, "input_required", actions=(request,))
    )
    action = PendingAction.objects.get(task_id=paused.id)
    return {
        "task": task.id,
        "conversation": task.conversation_id,
        "paused": paused.conversation_id,
        "action": action.id,
        "file": created["files"][0]["id"],
    }


def client_for(principal: str, as_alice) -> Api:
    if principal == "owner":
        return as_alice
    if principal == "other":
        bob = UserFactory(username="bob")
        return Api(bob, Token.objects.create(user=bob).key)
    return Api()


SETTINGS = {
    "anonymous_allowed": {"ALLOW_ANONYMOUS": True},
    "anonymous_list": {"ALLOW_ANONYMOUS_LIST": True},
}


@pytest.mark.parametrize("principal", PRINCIPALS)
@pytest.mark.parametrize(
    "name, method, path, body, owner_status", ENDPOINTS, ids=[e[0] for e in ENDPOINTS]
)
def test_isolation(world, alice, as_alice, principal, name, method, path, body, owner_status):
    api = client_for(principal, as_alice)
    before = owners_world(alice)
    url = path.format(**world)
    with agenttasks(**SETTINGS.get(principal, {})):
        if method == "GET":
            response = api.get(url)
        else:
            response = api.request(method, url, body)
        if response.streaming:
            b"".join(response.streaming_content)
    status, code = expected(principal, name, owner_status)
    assert response.status_code == status, (response.status_code, response.content[:300])
    if code is not None:
        assert response.json()["error"]["code"] == code
    if principal != "owner":
        assert owners_world(alice) == before
        if name in LISTS - {"listAgents", "getAgent"} and status == 200:
            assert response.json()["total"] == 0  # nothing of alice's is listed
