"""docs/rest.md, scenarios 29–38: approvals and questions.

The scenarios name chat agents (`deployer`, `strict`, `asker`); most run with the callable test
agents of the same observable behaviour over REST:
`approver` asks approval for `deploy {"env": <input>}` and replies `deployed to prod` /
`not deployed`; `strict-approver` is the same with `hitl.on_timeout = "cancel"`; `asker` asks
`q1` "Which format?" (PDF, HTML). A callable handler writes no `tool.call` / `tool.result`
events (those are the chat loop's), so those assertions are replaced by the action events.
Agents run on the in-process worker pool; timeouts are applied by `manage.py agenttasks_reap`.
"""

from datetime import timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone

from agenttasks.models import Event, PendingAction
from agenttasks.tools import tool

from ..conftest import run_threads
from .conftest import ALLOW_LOOPBACK, agenttasks, error, wait_for

pytestmark = pytest.mark.django_db(transaction=True)
pytest_plugins = ["tests.fake_model"]  # the chat runtime's `model` and `agents` fixtures


def paused(api, agent="approver", text="prod", **fields):
    task = api.create(agent, text, **fields)
    api.wait_status(task["id"], "waiting_for_input")
    detail = api.task(task["id"])
    (action,) = detail["pendingActions"]
    return detail["task"], action


def answer(api, task, action, body):
    return api.post(f"/conversations/{task['conversationId']}/actions/{action['id']}", body)


def expire(action_id):
    PendingAction.objects.filter(pk=action_id).update(
        deadline=timezone.now() - timedelta(seconds=1)
    )


def test_rest_12_29_approval_requested(as_alice, workers, receiver):
    with agenttasks(**ALLOW_LOOPBACK):
        task, action = paused(as_alice, callbackUrl=receiver.url)
    assert (action["kind"], action["toolName"], action["args"]) == (
        "approval",
        "deploy",
        {"env": "prod"},
    )
    assert action["status"] == "pending" and action["runId"] == task["runId"]
    from datetime import datetime

    created = datetime.fromisoformat(action["createdAt"].replace("Z", "+00:00"))
    expires = datetime.fromisoformat(action["expiresAt"].replace("Z", "+00:00"))
    assert abs((expires - created) - timedelta(minutes=60)) < timedelta(seconds=1)
    listed = as_alice.get(f"/conversations/{task['conversationId']}/actions").json()
    assert listed == {"actions": [action], "total": 1}
    events = as_alice.events(task["conversationId"])
    requested = next(e for e in events if e["type"] == "action.requested")
    assert requested["data"]["action"] == action
    after = [e for e in events if e["seq"] > requested["seq"] and e["type"] == "task.status"]
    assert (after[0]["data"]["from"], after[0]["data"]["to"]) == ("running", "waiting_for_input")
    wait_for(lambda: receiver.bodies(), message="the callback")
    assert receiver.bodies()[0]["status"] == "waiting_for_input"


def test_rest_12_30_approve(as_alice, alice, workers):
    task, action = paused(as_alice)
    response = answer(as_alice, task, action, {"approved": True})
    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["action"]["status"], body["action"]["decidedBy"]) == ("approved", str(alice.pk))
    assert "decidedAt" in body["action"]
    assert (body["task"]["status"], body["task"]["runId"]) == ("pending", task["runId"])
    as_alice.wait_status(task["id"], "completed")
    assert (
        as_alice.get(f"/tasks/{task['id']}/result").json()["result"]["content"]
        == "deployed to prod"
    )
    resolved = [
        e for e in as_alice.events(task["conversationId"]) if e["type"] == "action.resolved"
    ]
    assert [e["data"]["status"] for e in resolved] == ["approved"]


def test_rest_12_31_deny(as_alice, workers):
    task, action = paused(as_alice)
    response = answer(as_alice, task, action, {"approved": False, "comment": "not today"})
    assert response.status_code == 200 and response.json()["action"]["status"] == "denied"
    as_alice.wait_status(task["id"], "completed")
    assert as_alice.get(f"/tasks/{task['id']}/result").json()["result"]["content"] == "not deployed"
    (resolved,) = [
        e for e in as_alice.events(task["conversationId"]) if e["type"] == "action.resolved"
    ]
    assert (resolved["data"]["status"], resolved["data"]["comment"]) == ("denied", "not today")


def test_rest_12_32_question(as_alice, workers):
    task, action = paused(as_alice, "asker", "report")
    assert (action["kind"], action["toolName"]) == ("question", "ask_user")
    assert action["questions"][0] == {
        "id": "q1",
        "question": "Which format?",
        "options": [{"label": "PDF", "value": "PDF"}, {"label": "HTML", "value": "HTML"}],
        "multiSelect": False,
        "required": True,
        "allowFreeText": False,
    }
    response = answer(as_alice, task, action, {"answers": {"q1": "PDF"}})
    assert response.status_code == 200 and response.json()["action"]["status"] == "answered"
    as_alice.wait_status(task["id"], "completed")
    assert as_alice.get(f"/tasks/{task['id']}/result").json()["result"]["content"] == "format: PDF"
    (resolved,) = [
        e for e in as_alice.events(task["conversationId"]) if e["type"] == "action.resolved"
    ]
    assert resolved["data"]["answers"] == {"q1": {"values": ["PDF"]}}


def test_rest_12_33_answer_validation(as_alice, workers):
    approval_task, approval = paused(as_alice)
    question_task, question = paused(as_alice, "asker", "report")
    error(
        answer(as_alice, approval_task, approval, {}),
        400,
        "VALIDATION_ERROR",
        "approved must be a boolean",
    )
    error(
        answer(as_alice, approval_task, approval, {"approved": True, "comment": "x" * 2001}),
        400,
        "VALIDATION_ERROR",
        "comment must be at most 2000 characters",
    )
    cases = [
        ({}, "answers is required"),
        ({"answers": {}}, "answers.q1 is required"),
        ({"answers": {"q9": "x"}}, "answers.q9: unknown question"),
        ({"answers": {"q1": "DOCX"}}, 'answers.q1: "DOCX" is not an option'),
        ({"answers": {"q1": ["PDF", "HTML"]}}, "answers.q1 takes one value"),
    ]
    for body, message in cases:
        error(answer(as_alice, question_task, question, body), 400, "VALIDATION_ERROR", message)
    assert set(PendingAction.objects.values_list("status", flat=True)) == {"pending"}


def test_rest_12_34_resolved_unknown_foreign(as_alice, as_bob, workers):
    task, action = paused(as_alice)
    assert answer(as_alice, task, action, {"approved": True}).status_code == 200
    found = error(
        answer(as_alice, task, action, {"approved": True}),
        409,
        "action_resolved",
        f"Action {action['id']} is already approved",
    )
    assert found["details"] == {"status": "approved"}
    error(
        as_alice.post(
            f"/conversations/{task['conversationId']}/actions/act_nope", {"approved": True}
        ),
        404,
        "NOT_FOUND",
        "Action not found: act_nope",
    )
    other_task, other = paused(as_alice)
    error(answer(as_bob, other_task, other, {"approved": True}), 403, "FORBIDDEN")
    assert PendingAction.objects.get(pk=other["id"]).status == "pending"


def test_rest_12_35_concurrent_answers(as_alice, workers):
    task, action = paused(as_alice)
    workers.paused = True  # the resumed run stays queued: count resumptions, not runs
    responses = run_threads(lambda i: answer(as_alice, task, action, {"approved": True}), 2)
    codes = sorted(r.status_code for r in responses)
    assert codes == [200, 409], [r.content for r in responses]
    loser = next(r for r in responses if r.status_code == 409)
    assert loser.json()["error"]["code"] == "action_resolved"
    events = Event.objects.filter(conversation_id=task["conversationId"])
    assert events.filter(type="action.resolved").count() == 1
    resumed = events.filter(type="task.status", data__from="waiting_for_input", data__to="pending")
    assert resumed.count() == 1


def test_rest_12_36_timeout_deny(as_alice, workers):
    task, action = paused(as_alice)
    expire(action["id"])
    call_command("agenttasks_reap")
    assert PendingAction.objects.get(pk=action["id"]).status == "expired"
    as_alice.wait_status(task["id"], "completed")
    assert as_alice.get(f"/tasks/{task['id']}/result").json()["result"]["content"] == "not deployed"
    (resolved,) = [
        e for e in as_alice.events(task["conversationId"]) if e["type"] == "action.resolved"
    ]
    assert resolved["data"]["status"] == "expired"
    error(answer(as_alice, task, action, {"approved": True}), 409, "action_resolved")


def test_rest_12_37_timeout_cancel(as_alice, workers, receiver):
    with agenttasks(**ALLOW_LOOPBACK):
        task, action = paused(as_alice, "strict-approver", callbackUrl=receiver.url)
        # Each callback is delivered on its own: the pause's first, so the order is known.
        wait_for(lambda: len(receiver.bodies()) >= 1, message="the waiting_for_input callback")
        expire(action["id"])
        call_command("agenttasks_reap")
        assert as_alice.status(task["id"])["status"] == "cancelled"
        assert PendingAction.objects.get(pk=action["id"]).status == "expired"
        wait_for(lambda: len(receiver.bodies()) >= 2, message="the cancelled callback")
    assert [b["status"] for b in receiver.bodies()] == ["waiting_for_input", "cancelled"]


def test_rest_12_38_late_answer_applies_the_timeout(as_alice, workers):
    task, action = paused(as_alice)
    expire(action["id"])
    row = PendingAction.objects.get(pk=action["id"])
    from agenttasks.text import iso

    error(
        answer(as_alice, task, action, {"approved": True}),
        409,
        "action_resolved",
        f"Action {action['id']} expired at {iso(row.deadline)}",
    )
    assert PendingAction.objects.get(pk=action["id"]).status == "expired"
    as_alice.wait_status(task["id"], "completed")
    assert as_alice.get(f"/tasks/{task['id']}/result").json()["result"]["content"] == "not deployed"


def test_an_escalated_action_is_listed_and_answered_through_the_callers_conversation(
    model, agents, as_alice, recording_queue
):
    """docs/delegation.md#escalation: a delegate child's approval shows on its caller and is answerable
    through any conversation on its path (the chat runtime and the fake model server)."""
    from ..fake_model import SECRET, answer, calls, run_to_idle

    def script(request):
        if request.model == "m-parent":
            if not request.has_tool_message:
                return calls(("p1", "task", {"agent": "keeper", "prompt": "fetch the secret"}))
            return answer("parent got: " + request.last_tool)
        if not request.has_tool_message:
            return calls(("s1", "secret", {}))
        return answer("keeper: " + request.last_tool)

    agents("caller", model="m-parent", team=["keeper"])
    agents("keeper", model="m-keeper", tools=[SECRET])
    model.script(script)
    parent = as_alice.create("caller", "go")
    run_to_idle(recording_queue)
    detail = as_alice.task(parent["id"])
    assert detail["task"]["status"] == "waiting_for_input"
    (escalated,) = detail["pendingActions"]
    assert escalated["path"][0] == parent["conversationId"]
    assert escalated["conversationId"] == escalated["path"][-1] != parent["conversationId"]
    listed = as_alice.get(f"/conversations/{parent['conversationId']}/actions").json()
    assert [a["id"] for a in listed["actions"]] == [escalated["id"]]
    busy = as_alice.post(f"/tasks/{parent['id']}/comments", {"content": "hurry"})
    assert error(busy, 409, "action_pending")["details"] == {"actionIds": [escalated["id"]]}
    response = as_alice.post(
        f"/conversations/{parent['conversationId']}/actions/{escalated['id']}",
        {"approved": True},
    )
    assert response.status_code == 200, response.content
    assert response.json()["action"]["status"] == "approved"
    run_to_idle(recording_queue)
    assert as_alice.status(parent["id"])["status"] == "completed"
    result = as_alice.get(f"/tasks/{parent['id']}/result").json()["result"]
    assert result["content"] == "parent got: keeper: secret-token"


@tool(
    needs_approval=True,
    parameters={"type": "object", "properties": {"env": {"type": "string"}}, "required": ["env"]},
)
def deploy(ctx, args):
    """Deploy to an environment."""
    return f"deployed to {args['env']}"


def deployer_script(request):
    if not request.has_tool_message:
        return calls_(("d1", "deploy", {"env": "prod"}))
    return answer_("not deployed" if request.last_tool.startswith("Tool call") else "deployed")


def calls_(*specs):
    from ..fake_model import calls

    return calls(*specs)


def answer_(text):
    from ..fake_model import answer

    return answer(text)


@pytest.mark.parametrize("decision", ["approve", "deny", "expire"])
def test_rest_12_29_to_36_with_the_chat_deployer(
    model, agents, as_alice, recording_queue, decision
):
    """Scenarios 29–31 and 36 with the chat `deployer` itself: the tool events and their texts."""
    from ..fake_model import run_to_idle

    agents("deployer", model="m-deployer", tools=["tests.api.test_api_actions.deploy"])
    model.script(deployer_script)
    task = as_alice.create("deployer", "ship it")
    run_to_idle(recording_queue)
    detail = as_alice.task(task["id"])
    (action,) = detail["pendingActions"]
    assert (action["kind"], action["toolName"], action["args"]) == (
        "approval",
        "deploy",
        {"env": "prod"},
    )
    events = as_alice.events(task["conversationId"])
    kinds = [e["type"] for e in events]
    call = kinds.index("tool.call")
    assert kinds[call : call + 3] == ["tool.call", "action.requested", "task.status"]
    assert events[call]["data"]["toolName"] == "deploy"
    assert events[call + 1]["data"]["action"] == action
    if decision == "approve":
        body = answer(as_alice, task, action, {"approved": True}).json()
        assert body["action"]["status"] == "approved"
    elif decision == "deny":
        body = answer(as_alice, task, action, {"approved": False, "comment": "not today"}).json()
        assert body["action"]["status"] == "denied"
    else:
        expire(action["id"])
        call_command("agenttasks_reap")
    run_to_idle(recording_queue)
    assert as_alice.status(task["id"])["status"] == "completed"
    (result,) = [e for e in as_alice.events(task["conversationId"]) if e["type"] == "tool.result"]
    expected = {
        "approve": ("deployed to prod", False),
        "deny": ("Tool call denied by the user: not today", True),
        # A lapsed approval under `deny` has one text, over REST too.
        "expire": ("Tool call denied: no answer before the approval deadline", True),
    }[decision]
    assert (result["data"]["content"], result["data"]["isError"]) == expected
    content = as_alice.get(f"/tasks/{task['id']}/result").json()["result"]["content"]
    assert content == ("deployed" if decision == "approve" else "not deployed")
