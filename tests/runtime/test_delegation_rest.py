"""Escalation end to end over the REST API: a delegated child asks for approval, the caller's task
shows it with its path, a person answers through the caller's conversation
(`POST /conversations/{id}/actions/{actionId}`), and the child resumes, then its caller."""

import pytest

from agenttasks.lifecycle import escalation
from agenttasks.models import Task

from ..fake_model import SECRET, answer, calls, run_to_idle

pytest_plugins = ["tests.fake_model"]  # the `model`, `agents` and `rest` fixtures
pytestmark = pytest.mark.django_db(transaction=True)


def parent_script(request):
    if not request.has_tool_message:
        return calls(("p1", "task", {"agent": "asker", "prompt": "fetch the secret"}))
    return answer("parent got: " + request.last_tool)


def asker_script(request):
    if not request.has_tool_message:
        return calls(("s1", "secret", {}))
    return answer("asker-done: " + request.last_tool)


def test_an_escalated_approval_answered_over_rest_resumes_the_child_then_the_caller(
    model, agents, user, rest, recording_queue
):
    agents("approverParent", model="m-parent", team=["asker"])
    agents("asker", model="m-asker", tools=[SECRET])
    model.script(lambda r: parent_script(r) if r.model == "m-parent" else asker_script(r))
    status, body = rest("post", "/tasks", {"agentId": "approverParent", "input": "go"})
    assert status == 201, body
    parent_id = body["task"]["id"]
    run_to_idle(recording_queue)

    status, body = rest("get", f"/tasks/{parent_id}")
    assert (status, body["task"]["status"]) == (200, "waiting_for_input")
    parent = Task.objects.get(pk=parent_id)
    child = Task.objects.get(kind="delegate")
    ((action, path),) = escalation.pending_actions(parent.conversation_id)
    assert path == [parent.conversation_id, child.conversation_id]
    (shown,) = body["pendingActions"]
    assert (shown["id"], shown["kind"], shown["prompt"]) == (
        action.id,
        "approval",
        "approve secret access?",
    )
    assert (shown["path"], shown["conversationId"]) == (path, child.conversation_id)

    # Answered through the caller's conversation, the first id of the action's path.
    status, body = rest(
        "post", f"/conversations/{parent.conversation_id}/actions/{action.id}", {"approved": True}
    )
    assert status == 200, body
    assert (body["action"]["status"], body["task"]["status"]) == ("approved", "pending")
    run_to_idle(recording_queue)

    status, body = rest("get", f"/tasks/{child.id}")
    assert (body["task"]["status"], body["task"].get("kind")) == ("completed", "delegate")
    status, body = rest("get", f"/tasks/{parent_id}")
    assert body["task"]["status"] == "completed"
    assert body["result"]["content"] == "parent got: asker-done: secret-token"
