"""The `task` delegation tool against the scripted fake model server, each scenario named after
its number (docs/delegation.md#scenarios-cited-by-the-tests)."""

import time
from contextlib import contextmanager
from datetime import timedelta

import pytest
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.utils import timezone

from agenttasks import lifecycle, registry, store
from agenttasks.conf import app_settings
from agenttasks.delivery import wakeups
from agenttasks.exceptions import ActionPending, ConversationBusy, NotRetryable, TaskBusy
from agenttasks.execution import worker
from agenttasks.lifecycle import escalation as escalations
from agenttasks.models import Conversation, Event, PendingAction, Run, Task, Wakeup
from agenttasks.runtime import delegation
from agenttasks.runtime.base import Reply
from agenttasks.runtime.task_tools import task_tools

from ..conftest import wait_for
from ..factories import WakeupFactory
from ..fake_model import (
    ASK_USER,
    LOOKUP,
    SECRET,
    TOOL_LOG,
    TOOL_RUNS,
    answer,
    calls,
    delegates,
    disconnected,
    events,
    hold,
    http,
    in_thread,
    refresh,
    run_to_idle,
    task_for,
    tool_results,
    transcript,
)

pytest_plugins = ["tests.fake_model"]  # the `model`, `agents` and `rest` fixtures
pytestmark = pytest.mark.django_db(transaction=True)

HEAD = (
    "Delegate a subtask to an isolated subagent (it runs on a fresh transcript and returns only "
    "its final answer). Available agents — "
)
TASK_PARAMETERS = {
    "type": "object",
    "properties": {
        "agent": {"type": "string", "description": "Team agent to delegate to"},
        "prompt": {"type": "string", "description": "The subtask prompt"},
    },
    "required": ["agent", "prompt"],
}


def delegating(model_name, agent, prompt, then, call_id="c1"):
    """A script part: with no tool message delegate once, otherwise answer then(request)."""

    def reply(request):
        if not request.has_tool_message:
            return calls((call_id, "task", {"agent": agent, "prompt": prompt}))
        return answer(then(request))

    return reply


def by_model(**scripts):
    """A script dispatching on the request's model name (`m_x` stands for `m-x`)."""
    table = {name.replace("_", "-"): script for name, script in scripts.items()}
    return lambda request: table[request.model](request)


def run(user, queue, agent, text="go"):
    task = task_for(user, agent, text)
    run_to_idle(queue)
    return refresh(task)


# --- tools on the wire (S1–S3) ---------------------------------------------------------------


def test_s2_a_team_adds_exactly_task_described_from_the_team(model, agents, user, recording_queue):
    agents("coord", model="m-coord", team=["looper", "explore", "broken", "ghost"])
    agents("explore", does="read-only research")
    agents("looper", does="never finishes")
    agents("broken", does="always fails")
    agents("peer", does="peer review")
    server = model.script(lambda r: answer("ok"))
    run(user, recording_queue, "coord")
    (request,) = server.of("m-coord")
    assert request.json["tool_choice"] == "auto"
    description = (
        HEAD + "broken: always fails; explore: read-only research; ghost; looper: never finishes"
    )
    assert request.tools == [
        {
            "type": "function",
            "function": {"name": "task", "description": description, "parameters": TASK_PARAMETERS},
        }
    ]
    assert "peer" not in request.tools[0]["function"]["description"]


# --- one delegation, no team, sorted team (S4–S6) ----------------------------------------------


def test_s4_one_delegation_one_tool_message(model, agents, user, recording_queue):
    agents("coordinator", model="m-coordinator", does="splits and delegates", team=["explorer"])
    agents("explorer", model="m-explorer", does="read-only research")
    server = model.script(
        by_model(
            m_explorer=lambda r: answer("found it"),
            m_coordinator=delegating(
                "m", "explorer", "find X", lambda r: "synthesis: " + r.last_tool
            ),
        )
    )
    task = run(user, recording_queue, "coordinator", "investigate X")
    assert (task.status, task.result) == ("completed", "synthesis: found it")
    assert task.run.turns == 2
    assert transcript(task.conversation_id) == [
        ("user", "investigate X"),
        ("assistant", ["c1"]),
        ("tool", "c1", "found it"),
        ("assistant", "synthesis: found it"),
    ]
    (explorer_request,) = server.of("m-explorer")
    assert explorer_request.messages == [{"role": "user", "content": "find X"}]
    assert "tools" not in explorer_request.json
    (child,) = delegates()
    assert (child.agent, child.input, child.status) == ("explorer", "find X", "completed")
    assert child.parent_conversation_id == task.conversation_id
    assert child.conversation.hidden and child.conversation.parent_id == task.conversation_id
    assert child.conversation.metadata == {"source": "delegate", "taskId": child.id}
    (delegated,) = events(task.conversation_id, "task.delegated")
    assert delegated.data == {
        "taskId": child.id,
        "agent": "explorer",
        "toolCallId": "c1",
        "runId": task.run_id,
        "conversationId": child.conversation_id,
    }


def test_s5_no_team_unknown_tool_task_and_the_run_finishes(model, agents, user, recording_queue):
    agents("solo", model="m", does="works alone")

    def script(request):
        if not request.has_tool_message:
            return calls(("c1", "task", {"agent": "anyone", "prompt": "help"}))
        return answer("tool said: " + request.tool_contents()[0])

    server = model.script(script)
    task = run(user, recording_queue, "solo", "do something")
    assert "tools" not in server.requests[0].json
    assert (task.status, task.result) == ("completed", "tool said: Unknown tool: task")
    assert tool_results(task.conversation_id)["c1"]["isError"] is True
    assert not delegates().exists()


def test_s6_sorted_team_refusal_reattach(model, agents, user, recording_queue):
    agents(
        "coordinator", model="m-coordinator", does="delegates work", team=["explorer", "planner"]
    )
    agents("explorer", model="m-explorer", does="read-only research")
    agents("planner", model="m-planner", does="breaks work into steps")

    def coordinator(request):
        k = len(request.tool_contents())
        if k < 2:
            return calls((f"c{k}", "task", {"agent": "explorer", "prompt": "look around"}))
        if k == 2:
            return calls(("c2", "task", {"agent": "stranger", "prompt": "x"}))
        return answer("refusal was: " + request.last_tool)

    server = model.script(
        by_model(m_explorer=lambda r: answer("explorer says hi"), m_coordinator=coordinator)
    )
    task = run(user, recording_queue, "coordinator", "start")
    assert server.served["m-explorer"] == 1
    assert delegates().count() == 1
    (reattached,) = events(task.conversation_id, "task.reattached")
    assert (reattached.data["toolCallId"], reattached.data["replay"]) == ("c1", False)
    assert reattached.data["childStatus"] == "completed"
    results = tool_results(task.conversation_id)
    assert results["c0"]["content"] == results["c1"]["content"] == "explorer says hi"
    assert (task.status, task.result) == (
        "completed",
        'refusal was: agent "stranger" is not in this agent\'s team (available: explorer, planner)',
    )
    assert (
        server.requests[0]
        .tool("task")["description"]
        .endswith(
            "Available agents — explorer: read-only research; planner: breaks work into steps"
        )
    )


# --- the task tool (S7–S16) -------------------------------------------------------------------


def echo_last(request):
    return request.last_tool


def test_s7_out_of_team_refusal_is_exact(model, agents, user, recording_queue):
    agents("rogue", model="m-rogue", team=["explore"])
    agents("explore", model="m-explore")
    agents("stranger", model="m-stranger")
    server = model.script(by_model(m_rogue=delegating("m", "stranger", "hi", echo_last, "r1")))
    task = run(user, recording_queue, "rogue")
    assert task.result == 'agent "stranger" is not in this agent\'s team (available: explore)'
    result = tool_results(task.conversation_id)["r1"]
    assert result["isError"] is True and result["metadata"] is None
    assert not delegates().exists()
    assert server.served["m-stranger"] == 0


def test_the_out_of_team_refusal_lists_the_team_sorted(model, agents, user, recording_queue):
    agents("rogue", model="m-rogue", team=["planner", "explore", "critic"])
    model.script(by_model(m_rogue=delegating("m", "stranger", "hi", echo_last, "r1")))
    task = run(user, recording_queue, "rogue")
    assert task.result == (
        'agent "stranger" is not in this agent\'s team (available: critic, explore, planner)'
    )
    assert not delegates().exists()


def test_s8_a_team_member_that_is_not_registered(model, agents, user, recording_queue):
    agents("coord", model="m-coord", team=["explore", "ghost"])
    agents("explore", model="m-explore")
    model.script(by_model(m_coord=delegating("m", "ghost", "x", echo_last)))
    task = run(user, recording_queue, "coord")
    assert task.result == 'agent "ghost" is in this agent\'s team but is not registered'
    assert not delegates().exists()


def test_s9_bad_arguments_unknown_tools_and_failing_tools(model, agents, user, recording_queue):
    agents("tinker", model="m-tinker", tools=[LOOKUP, "tests.fake_model.boom"], team=["explore"])
    agents("explore", model="m-explore")

    def script(request):
        if not request.has_tool_message:
            return calls(
                ("t1", "task", '{"agent":"explore"}'),
                ("t2", "task", "not json"),
                ("t3", "nope", {}),
                ("t4", "boom", {}),
            )
        return answer("|".join(request.tool_contents()))

    model.script(script)
    task = run(user, recording_queue, "tinker")
    assert task.result.split("|") == [
        'invalid arguments for task: missing required property "prompt"',
        "invalid arguments for task: arguments are not valid JSON",
        "Unknown tool: nope",
        "tool boom failed: ValueError: bad input",
    ]
    assert all(r["isError"] for r in tool_results(task.conversation_id).values())
    assert task.status == "completed"
    assert not delegates().exists()
    assert task.run.tool_calls == 4


FANOUT_USAGE = {"prompt_tokens": 30, "completion_tokens": 10, "total_tokens": 40}


def fanout_script(server_ref, held: bool):
    def coord(request):
        if not request.has_tool_message:
            return calls(
                ("c1", "task", {"agent": "explore", "prompt": "find A"}),
                ("c2", "task", {"agent": "explore", "prompt": "find B"}),
                usage=FANOUT_USAGE,
            )
        return answer(" + ".join(request.tool_contents()), usage=FANOUT_USAGE)

    def explore(request):
        if not request.has_tool_message:
            reply = calls(("l1", "lookup", {"q": request.first_user}), usage=FANOUT_USAGE)
            if held and request.first_user == "find A":
                sent_b = ("m-explore", "answer:found:data(find B)")
                return hold(lambda r: sent_b in server_ref[0].sent, deadline=5, then=reply)
            return reply
        return answer("found:" + request.last_tool, usage=FANOUT_USAGE)

    return by_model(m_coord=coord, m_explore=explore)


def fanout_agents(agents):
    agents("coord", model="m-coord", team=["explore"])
    agents("explore", model="m-explore", tools=[LOOKUP])


def test_s10_parallel_fan_out(model, agents, user, recording_queue):
    fanout_agents(agents)
    ref = [model.server]
    server = model.script(fanout_script(ref, held=True))
    task = run(user, recording_queue, "coord")
    assert task.result == "found:data(find A) + found:data(find B)"
    assert (task.run.turns, task.run.total_tokens, task.run.tool_calls) == (2, 240, 4)
    children = list(delegates())
    assert sorted(c.input for c in children) == ["find A", "find B"]
    assert all(c.status == "completed" and c.agent == "explore" for c in children)
    assert all(c.conversation.parent_id == task.conversation_id for c in children)
    results = tool_results(task.conversation_id)
    for call_id in ("c1", "c2"):
        assert results[call_id]["isError"] is False
        assert results[call_id]["metadata"] == {"agent": "explore", "turns": 2, "totalTokens": 80}
    second = server.of("m-coord")[1]
    assert second.messages[-3:] == [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {
                        "name": "task",
                        "arguments": '{"agent": "explore", "prompt": "find A"}',
                    },
                },
                {
                    "id": "c2",
                    "type": "function",
                    "function": {
                        "name": "task",
                        "arguments": '{"agent": "explore", "prompt": "find B"}',
                    },
                },
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "found:data(find A)"},
        {"role": "tool", "tool_call_id": "c2", "content": "found:data(find B)"},
    ]
    # B finished first (A was held until B's answer was sent), yet the messages are in call order.
    finished = {c.input: c.finished_at for c in children}
    assert finished["find B"] < finished["find A"]
    assert all(b"lookup" not in r.raw and b'"l1"' not in r.raw for r in server.of("m-coord"))
    for prompt in ("find A", "find B"):
        first = next(r for r in server.of("m-explore") if r.first_user == prompt)
        assert first.messages == [{"role": "user", "content": prompt}]
        assert first.tool_names == ["lookup"]
    assert recording_queue.run_ids == [task.run_id]


def test_s11_identical_calls_in_one_response_make_one_child(model, agents, user, recording_queue):
    agents("coordinator", model="m-coord", team=["explorer"])
    agents("explorer", model="m-explorer")

    def coord(request):
        if not request.has_tool_message:
            args = {"agent": "explorer", "prompt": "look around"}
            return calls(("c1", "task", args), ("c2", "task", args))
        return answer("|".join(request.tool_contents()))

    server = model.script(by_model(m_coord=coord, m_explorer=lambda r: answer("explorer says hi")))
    task = run(user, recording_queue, "coordinator")
    assert server.served["m-explorer"] == 1
    assert delegates().count() == 1
    delegated = events(task.conversation_id, "task.delegated")
    reattached = events(task.conversation_id, "task.reattached")
    assert len(delegated) == len(reattached) == 1
    assert {delegated[0].data["toolCallId"], reattached[0].data["toolCallId"]} == {"c1", "c2"}
    assert task.result == "explorer says hi|explorer says hi"
    assert task.run.total_tokens == 6


def test_s12_system_prompts_reach_their_own_agent_only(model, agents, user, recording_queue):
    agents("coder", model="m-coder", system_prompt="You are the CODER", team=["explore"])
    agents("explore", model="m-explore", system_prompt="You are the EXPLORER", tools=[LOOKUP])
    coder_system = {"role": "system", "content": "You are the CODER"}

    def coder(request):
        if not request.has_tool_message:
            return calls(("c1", "task", {"agent": "explore", "prompt": "where is the bug?"}))
        if request.messages[0] == coder_system:
            return answer("[soul:loaded] " + request.last_tool)
        return answer("[soul:missing]")

    def explore(request):
        if not request.has_tool_message:
            return calls(("l1", "lookup", {"q": "bug"}))
        return answer("bug at line 42")

    server = model.script(by_model(m_coder=coder, m_explore=explore))
    task = run(user, recording_queue, "coder")
    assert task.result == "[soul:loaded] bug at line 42"
    assert all(r.messages[0] == coder_system for r in server.of("m-coder"))
    assert server.of("m-explore")[0].messages == [
        {"role": "system", "content": "You are the EXPLORER"},
        {"role": "user", "content": "where is the bug?"},
    ]
    assert all(b"EXPLORER" not in r.raw for r in server.of("m-coder"))
    assert all(b"CODER" not in r.raw for r in server.of("m-explore"))


def test_s13_done_incomplete_error_and_refused_side_by_side(model, agents, user, recording_queue):
    agents("coord", model="m-coord", team=["broken", "explore", "looper"])
    agents("explore", model="m-explore", tools=[LOOKUP])
    agents("looper", model="m-looper", tools=[LOOKUP], budget={"max_turns": 3})
    agents("broken", model="m-broken")

    def coord(request):
        if not request.has_tool_message:
            return calls(
                ("c1", "task", {"agent": "explore", "prompt": "find A"}),
                ("c2", "task", {"agent": "looper", "prompt": "spin"}),
                ("c3", "task", {"agent": "broken", "prompt": "x"}),
                ("c4", "task", {"agent": "nobody", "prompt": "y"}),
            )
        return answer("ok")

    def explore(request):
        if not request.has_tool_message:
            return calls(("l1", "lookup", {"q": request.first_user}))
        return answer("found:" + request.last_tool)

    server = model.script(
        by_model(
            m_coord=coord,
            m_explore=explore,
            m_looper=lambda r: calls((f"l{r.index}", "lookup", {"q": "x"})),
            m_broken=lambda r: http(400, {"error": {"message": "boom"}}),
        )
    )
    task = run(user, recording_queue, "coord")
    tail = server.of("m-coord")[1].messages[-4:]
    assert [(m["tool_call_id"], m["content"]) for m in tail] == [
        ("c1", "found:data(find A)"),
        ("c2", "[incomplete] The max_turns budget (3) was reached"),
        ("c3", "[error] Model server returned HTTP 400: boom"),
        ("c4", 'agent "nobody" is not in this agent\'s team (available: broken, explore, looper)'),
    ]
    results = tool_results(task.conversation_id)
    assert [(results[c]["isError"], results[c]["metadata"]) for c in ("c1", "c2", "c3", "c4")] == [
        (False, {"agent": "explore", "turns": 2, "totalTokens": 4}),
        (True, {"agent": "looper", "turns": 3, "totalTokens": 6}),
        (True, {"agent": "broken", "turns": 1, "totalTokens": 0}),
        (True, None),
    ]
    looper = Task.objects.get(kind="delegate", agent="looper")
    assert [t for t, run_id in TOOL_LOG if run_id == looper.run_id] == ["lookup", "lookup"]
    assert (task.status, task.run.total_tokens) == ("completed", 14)


def rec_script(request):
    if not request.has_tool_message:
        return calls(("t1", "task", {"agent": "rec", "prompt": "deeper"}))
    return answer("rec got: " + request.last_tool)


def test_s14_recursion_stops_at_the_depth_limit(model, agents, user, recording_queue):
    agents("rec", model="m-rec", does="recurses", team=["rec"])
    model.script(rec_script)
    task = run(user, recording_queue, "rec", "start")
    assert task.result == "rec got: rec got: rec got: maxDepth 3 exceeded"
    child, grandchild = delegates()
    assert child.parent_conversation_id == task.conversation_id
    assert grandchild.parent_conversation_id == child.conversation_id
    assert grandchild.conversation.parent_id == child.conversation_id
    refused = tool_results(grandchild.conversation_id)["t1"]
    assert (refused["content"], refused["isError"]) == ("maxDepth 3 exceeded", True)
    assert app_settings.MAX_DEPTH == 1  # spawn_task's limit played no part


def test_s14_with_a_depth_limit_of_one(model, agents, user, recording_queue):
    model.set(DELEGATION_MAX_DEPTH=1)
    agents("rec", model="m-rec", does="recurses", team=["rec"])
    model.script(rec_script)
    task = run(user, recording_queue, "rec", "start")
    assert task.result == "rec got: maxDepth 1 exceeded"
    assert not delegates().exists()


def test_s15_one_child_at_a_time_and_no_queue_slot_needed(model, agents, user, recording_queue):
    model.set(DELEGATION_MAX_PARALLEL=1)
    fanout_agents(agents)
    server = model.script(fanout_script([model.server], held=False))
    task = run(user, recording_queue, "coord")
    assert task.result == "found:data(find A) + found:data(find B)"
    assert server.max_in_flight["m-explore"] == 1
    assert [m.get("tool_call_id") for m in server.of("m-coord")[1].messages[-2:]] == ["c1", "c2"]
    assert recording_queue.run_ids == [task.run_id]


def calc(ctx):
    return Reply(
        content="42", usage={"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
    )


def test_s16_a_callable_team_member(model, agents, user, recording_queue):
    agents("coord", model="m-coord", team=["calc"])
    agents("calc", runtime="callable", handler=calc)
    model.script(
        by_model(m_coord=delegating("m", "calc", "6*7", lambda r: "calc says " + r.last_tool))
    )
    task = run(user, recording_queue, "coord")
    assert task.result == "calc says 42"
    result = tool_results(task.conversation_id)["c1"]
    assert result["metadata"] == {"agent": "calc", "turns": 1, "totalTokens": 7}
    assert task.run.total_tokens == 11


def test_a_callable_members_clarification_completes_it(model, agents, user, recording_queue):
    agents("coord", model="m-coord", team=["clarifier"])
    agents(
        "clarifier",
        runtime="callable",
        handler=lambda ctx: Reply(content="Which format?", metadata={"waitingForInput": True}),
    )
    model.script(
        by_model(m_coord=delegating("m", "clarifier", "make it", lambda r: "asked: " + r.last_tool))
    )
    task = run(user, recording_queue, "coord")
    assert task.result == "asked: Which format?"
    assert delegates().get().status == "completed"


def test_an_empty_prompt_is_refused(model, agents, user, recording_queue):
    agents("coord", model="m-coord", team=["explore"])
    agents("explore", model="m-explore")
    model.script(by_model(m_coord=delegating("m", "explore", " \n", echo_last)))
    task = run(user, recording_queue, "coord")
    assert task.result == 'invalid arguments for task: property "prompt" must not be empty'
    assert not delegates().exists()


def test_a_later_run_reattaches_and_adds_no_usage(model, agents, user, recording_queue):
    agents("coordinator", model="m-coord", team=["explorer"])
    agents("explorer", model="m-explorer")
    server = model.script(
        by_model(
            m_coord=lambda r: (
                calls((f"c{r.index}", "task", {"agent": "explorer", "prompt": "look"}))
                if r.messages[-1]["role"] == "user"
                else answer(r.last_tool)
            ),
            m_explorer=lambda r: answer("seen"),
        )
    )
    task = run(user, recording_queue, "coordinator")
    assert task.run.total_tokens == 6
    lifecycle.comment(task.id, "again", author=user)
    run_to_idle(recording_queue)
    again = refresh(task)
    assert (again.result, again.run.total_tokens) == ("seen", 4)  # its own two turns only
    assert server.served["m-explorer"] == 1 and delegates().count() == 1


# --- escalation (S17–S24) ---------------------------------------------------------------------


def asker_script(request):
    if not request.has_tool_message:
        return calls(("s1", "secret", {}))
    return answer("asker-done: " + request.last_tool)


def parent_script(*prompts, agent="asker"):
    def script(request):
        if not request.has_tool_message:
            return calls(
                *(
                    (f"p{i}", "task", {"agent": agent, "prompt": p})
                    for i, p in enumerate(prompts, 1)
                )
            )
        return answer("parent got: " + request.last_tool)

    return script


@pytest.fixture
def escalation(model, agents):
    """The shared setup of S17–S24: approverParent delegates to asker, which needs approval."""
    agents("approverParent", model="m-parent", team=["asker", "asker2"])
    agents("asker", model="m-asker", tools=[SECRET])
    agents("asker2", model="m-asker2", tools=[ASK_USER])
    return model.script(
        by_model(
            m_parent=parent_script("fetch the secret"),
            m_asker=asker_script,
        )
    )


def paused(user, queue):
    return run(user, queue, "approverParent")


def test_s17_the_child_asks_the_caller_pauses_and_the_answer_resumes_both(
    escalation, user, recording_queue, rest
):
    server = escalation
    parent = paused(user, recording_queue)
    (child,) = delegates()
    assert (parent.status, child.status) == ("waiting_for_input", "waiting_for_input")
    (action,) = PendingAction.objects.filter(status="pending")
    assert (action.kind, action.prompt, action.run_id) == (
        "approval",
        "approve secret access?",
        child.run_id,
    )
    path = [parent.conversation_id, child.conversation_id]
    status, body = rest("get", f"/tasks/{parent.id}")
    assert [(a["id"], a["path"], a["conversationId"]) for a in body["pendingActions"]] == [
        (action.id, path, child.conversation_id)
    ]
    (escalated,) = events(parent.conversation_id, "task.escalated")
    assert (
        escalated.data["toolCallId"] == "p1"
        and escalated.data["output"] == "approve secret access?"
    )
    assert escalated.data["isError"] is True
    assert escalated.data["metadata"]["pending"] == {
        "id": action.id,
        "kind": "approval",
        "prompt": "approve secret access?",
        "path": path,
    }
    assert transcript(parent.conversation_id) == [("user", "go"), ("assistant", ["p1"])]
    assert (server.served["m-parent"], server.served["m-asker"]) == (1, 1)
    assert TOOL_RUNS["secret"] == 0

    status, body = rest(
        "post", f"/conversations/{parent.conversation_id}/actions/{action.id}", {"approved": True}
    )
    assert status == 200, body
    run_to_idle(recording_queue)
    assert TOOL_RUNS["secret"] == 1 and server.served["m-asker"] == 2
    child = refresh(child)
    assert (child.status, child.result) == ("completed", "asker-done: secret-token")
    (reattached,) = events(parent.conversation_id, "task.reattached")
    assert (
        reattached.data["toolCallId"],
        reattached.data["replay"],
        reattached.data["childStatus"],
    ) == (
        "p1",
        True,
        "completed",
    )
    tools = [m for m in transcript(parent.conversation_id) if m[0] == "tool"]
    assert tools == [("tool", "p1", "asker-done: secret-token")]
    # Adapted: a resumed run keeps its run row (docs/delegation.md#pausing-resuming-and-replay), so the child's one run holds
    # both of its turns and the parent's one run holds both of its turns plus the child's.
    assert tool_results(parent.conversation_id)["p1"]["metadata"] == {
        "agent": "asker",
        "turns": 2,
        "totalTokens": 4,
    }
    parent = refresh(parent)
    assert (parent.status, parent.result) == ("completed", "parent got: asker-done: secret-token")
    assert server.served["m-parent"] == 2 and delegates().count() == 1
    assert Run.objects.filter(task=parent).count() == 1
    assert (parent.run.turns, parent.run.total_tokens) == (2, 8)


def test_a_conversation_run_paused_on_an_escalation_resumes(escalation, user, recording_queue):
    conversation = lifecycle.create_conversation(owner=user, agent_id="approverParent")
    run_row, _ = lifecycle.post_message(conversation.id, "go")
    run_to_idle(recording_queue)
    assert Run.objects.get(pk=run_row.id).status == "paused"
    with pytest.raises(ConversationBusy):
        lifecycle.post_message(conversation.id, "are you there?")
    action = PendingAction.objects.get(status="pending")
    assert [a.id for a, _ in escalations.pending_actions(conversation.id)] == [action.id]
    lifecycle.resolve_action(action.id, {"approved": True})
    run_to_idle(recording_queue)
    ended = Run.objects.get(pk=run_row.id)
    assert (ended.status, ended.output) == ("completed", "parent got: asker-done: secret-token")


def test_s18_a_paused_caller_wakes_only_for_the_answer(escalation, user, recording_queue, rest):
    parent = paused(user, recording_queue)
    action = PendingAction.objects.get(status="pending")
    owed = WakeupFactory(conversation=parent.conversation)
    wakeups.deliver_pending(parent.conversation_id)
    lifecycle.recover()
    status, body = rest("post", f"/tasks/{parent.id}/comments", {"content": "hello?"})
    assert (status, body["error"]["code"]) == (409, "action_pending")
    with pytest.raises(ActionPending) as refused:
        lifecycle.comment(parent.id, "hello?", author=user)
    assert refused.value.action_ids == [action.id]
    run_to_idle(recording_queue)
    assert Run.objects.filter(conversation_id=parent.conversation_id).count() == 1
    parent = refresh(parent)
    assert parent.status == "waiting_for_input"
    assert PendingAction.objects.get(pk=action.pk).status == "pending"
    assert Wakeup.objects.get(pk=owed.pk).state == "pending"


def test_the_wake_guard_refuses_a_conversation_paused_on_an_escalated_action(
    escalation, user, recording_queue
):
    """A chat conversation (no task of its own) whose run waits on its child's approval is not
    woken: the debt waits for the run boundary that ends the pause."""
    conversation = lifecycle.create_conversation(owner=user, agent_id="approverParent")
    paused_run, _ = lifecycle.post_message(conversation.id, "go")
    run_to_idle(recording_queue)
    assert Run.objects.get(pk=paused_run.id).status == "paused"
    action = PendingAction.objects.get(status="pending")
    assert action.conversation_id != conversation.id  # the child's action, escalated to it
    owed = WakeupFactory(conversation=conversation)
    assert wakeups.deliver_pending(conversation.id) is None
    lifecycle.recover()
    run_to_idle(recording_queue)
    assert Wakeup.objects.get(pk=owed.pk).state == "pending"
    assert list(Run.objects.filter(conversation_id=conversation.id)) == [paused_run]
    assert not events(conversation.id, "task.notification")
    lifecycle.resolve_action(action.id, {"approved": True})
    run_to_idle(recording_queue)  # the resumed run ends: its boundary delivers the debt
    assert Wakeup.objects.get(pk=owed.pk).state == "delivered"
    assert len(events(conversation.id, "task.notification")) == 1


def test_s19_a_declined_escalation(escalation, user, recording_queue):
    parent = paused(user, recording_queue)
    action = PendingAction.objects.get(status="pending")
    lifecycle.resolve_action(action.id, {"approved": False, "comment": "not today"})
    run_to_idle(recording_queue)
    child = delegates().get()
    s1 = tool_results(child.conversation_id)["s1"]
    assert (s1["content"], s1["isError"]) == ("Tool call denied by the user: not today", True)
    assert TOOL_RUNS["secret"] == 0
    assert child.result == "asker-done: Tool call denied by the user: not today"
    assert (
        refresh(parent).result == "parent got: asker-done: Tool call denied by the user: not today"
    )


def test_s20_a_question_escalates(escalation, user, recording_queue):
    escalation.script = by_model(
        m_parent=parent_script("which format", agent="asker2"), m_asker2=_asker2
    )
    parent = paused(user, recording_queue)
    child = delegates().get()
    request = escalation.of("m-asker2")[0]
    assert request.tool("ask_user")["description"] == (
        "Ask the person a question and wait for the answer. Use it only when you cannot continue "
        "without their input; your work pauses until they answer."
    )
    action = PendingAction.objects.get(status="pending")
    assert (action.kind, action.prompt) == ("question", "Which format?")
    assert [o["value"] for o in action.questions[0]["options"]] == ["PDF", "HTML"]
    metadata = tool_escalation(parent)
    assert metadata["pending"]["path"] == [parent.conversation_id, child.conversation_id]
    lifecycle.resolve_action(action.id, {"answers": {"q1": {"values": ["PDF"]}}})
    run_to_idle(recording_queue)
    assert tool_results(child.conversation_id)["q1"]["content"] == "PDF"
    assert refresh(parent).result == "parent got: asker-done: PDF"


def _asker2(request):
    if not request.has_tool_message:
        return calls(("q1", "ask_user", {"question": "Which format?", "options": ["PDF", "HTML"]}))
    return answer("asker-done: " + request.last_tool)


def tool_escalation(parent):
    return events(parent.conversation_id, "task.escalated")[-1].data["metadata"]


def test_s21_two_children_paused_by_one_response(escalation, user, recording_queue):
    escalation.script = by_model(m_parent=_two_children, m_asker=asker_script)
    parent = paused(user, recording_queue)
    assert delegates().count() == 2
    first, second = PendingAction.objects.filter(status="pending").order_by("created_at", "id")
    assert len(escalations.pending_actions(parent.conversation_id)) == 2
    lifecycle.resolve_action(first.id, {"approved": True})
    run_to_idle(recording_queue)
    assert Task.objects.get(run_id=first.run_id).status == "completed"
    assert refresh(parent).status == "waiting_for_input"
    assert escalation.served["m-parent"] == 1
    lifecycle.resolve_action(second.id, {"approved": True})
    run_to_idle(recording_queue)
    assert escalation.served["m-parent"] == 2
    results = tool_results(parent.conversation_id)
    assert results["p1"]["content"] == results["p2"]["content"] == "asker-done: secret-token"
    replays = [e for e in events(parent.conversation_id, "task.reattached") if e.data["replay"]]
    assert len(replays) == 2
    assert refresh(parent).status == "completed"


def _two_children(request):
    if not request.has_tool_message:
        return calls(
            ("p1", "task", {"agent": "asker", "prompt": "one"}),
            ("p2", "task", {"agent": "asker", "prompt": "two"}),
        )
    return answer("parent got: " + " & ".join(request.tool_contents()))


def nested_script():
    def top(request):
        if not request.has_tool_message:
            return calls(("t1", "task", {"agent": "mid", "prompt": "ask below"}))
        return answer("top got: " + request.last_tool)

    def mid(request):
        if not request.has_tool_message:
            return calls(("m1", "task", {"agent": "asker", "prompt": "fetch the secret"}))
        return answer("mid got: " + request.last_tool)

    return by_model(m_top=top, m_mid=mid, m_asker=asker_script)


@pytest.fixture
def nested(model, agents):
    agents("top", model="m-top", team=["mid"])
    agents("mid", model="m-mid", team=["asker"])
    agents("asker", model="m-asker", tools=[SECRET])
    return model.script(nested_script())


def test_s22_a_nested_escalation_unwinds_from_the_bottom(nested, user, recording_queue, rest):
    top = run(user, recording_queue, "top")
    mid = Task.objects.get(kind="delegate", agent="mid")
    asker = Task.objects.get(kind="delegate", agent="asker")
    assert {top.status, mid.status, asker.status} == {"waiting_for_input"}
    action = PendingAction.objects.get(status="pending")
    path = [top.conversation_id, mid.conversation_id, asker.conversation_id]
    assert escalations.escalation_path(action.conversation_id) == path
    assert [p for _, p in escalations.pending_actions(top.conversation_id)] == [path]
    assert tool_escalation(top)["pending"] == tool_escalation(mid)["pending"]
    assert tool_escalation(top)["pending"]["path"] == path
    status, body = rest(
        "post", f"/conversations/{top.conversation_id}/actions/{action.id}", {"approved": True}
    )
    assert status == 200, body
    run_to_idle(recording_queue)
    top, mid, asker = refresh(top), refresh(mid), refresh(asker)
    assert asker.result == "asker-done: secret-token"
    assert mid.result == "mid got: asker-done: secret-token"
    assert (top.status, top.result) == ("completed", "top got: mid got: asker-done: secret-token")
    assert asker.finished_at < mid.finished_at < top.finished_at
    assert delegates().count() == 2


def test_s23_cancelling_the_paused_child_is_the_escape_hatch(escalation, user, recording_queue):
    parent = paused(user, recording_queue)
    child = delegates().get()
    action = PendingAction.objects.get(status="pending")
    lifecycle.stop(child.id)
    run_to_idle(recording_queue)
    assert refresh(child).status == "cancelled"
    assert PendingAction.objects.get(pk=action.pk).status == "cancelled"
    p1 = tool_results(parent.conversation_id)["p1"]
    assert (p1["content"], p1["isError"]) == ("[closed] the subtask was cancelled", True)
    assert p1["metadata"] == {"agent": "asker", "turns": 1, "totalTokens": 2}
    assert refresh(parent).result == "parent got: [closed] the subtask was cancelled"


@contextmanager
def clock_ahead(monkeypatch, minutes):
    real = timezone.now
    monkeypatch.setattr(timezone, "now", lambda: real() + timedelta(minutes=minutes))
    yield
    monkeypatch.setattr(timezone, "now", real)


@pytest.mark.parametrize("on_timeout", ["cancel", "deny"])
def test_s24_an_escalated_action_lapses(
    escalation, agents, user, recording_queue, monkeypatch, on_timeout
):
    agents(
        "asker",
        model="m-asker",
        tools=[SECRET],
        hitl={"timeout_minutes": 1, "on_timeout": on_timeout},
    )
    parent = paused(user, recording_queue)
    child = delegates().get()
    with clock_ahead(monkeypatch, 2):
        lifecycle.recover()
    run_to_idle(recording_queue)
    child, parent = refresh(child), refresh(parent)
    if on_timeout == "cancel":
        assert child.status == "cancelled"
        text = "[timeout] the subtask's approval was not answered in time"
        assert tool_results(parent.conversation_id)["p1"]["content"] == text
        assert parent.result == "parent got: " + text
    else:
        denied = "Tool call denied: no answer before the approval deadline"
        assert tool_results(child.conversation_id)["s1"]["content"] == denied
        assert child.status == "completed"
        assert parent.result == "parent got: asker-done: " + denied


# --- budgets (S33–S36) ------------------------------------------------------------------------


def budget_agents(agents):
    agents("coordinator", model="m-coord", team=["explorer"], budget={"max_tokens": 10})
    agents("explorer", model="m-explorer", tools=[LOOKUP])


def explorer_spends(request):
    return calls(
        (f"l{request.index}", "lookup", {"q": "x"}),
        usage={"prompt_tokens": 2, "completion_tokens": 2, "total_tokens": 4},
    )


def test_s35_a_childs_spend_counts_against_its_caller(model, agents, user, recording_queue):
    budget_agents(agents)
    server = model.script(
        by_model(m_coord=delegating("m", "explorer", "dig", echo_last), m_explorer=explorer_spends)
    )
    task = run(user, recording_queue, "coordinator")
    assert server.served["m-explorer"] == 2 and TOOL_RUNS["lookup"] == 1
    child = delegates().get()
    caller_variant = 'The max_tokens budget (10) of the calling agent "coordinator" was reached'
    assert (child.status, child.error) == ("failed", caller_variant)
    c1 = tool_results(task.conversation_id)["c1"]
    assert c1["content"] == "[incomplete] " + caller_variant
    assert c1["metadata"] == {"agent": "explorer", "turns": 2, "totalTokens": 8}
    assert (task.status, task.error) == ("failed", "The max_tokens budget (10) was reached")
    assert server.served["m-coord"] == 1 and task.run.total_tokens == 10


def test_s35_a_subtask_refused_for_budget_is_not_started(model, agents, user, recording_queue):
    model.set(DELEGATION_MAX_PARALLEL=1)
    budget_agents(agents)

    def coord(request):
        return calls(
            ("c1", "task", {"agent": "explorer", "prompt": "dig"}),
            ("c2", "task", {"agent": "explorer", "prompt": "dig more"}),
        )

    model.script(by_model(m_coord=coord, m_explorer=explorer_spends))
    task = run(user, recording_queue, "coordinator")
    c2 = tool_results(task.conversation_id)["c2"]
    assert c2["content"] == "The max_tokens budget (10) was reached; the subtask was not started"
    assert (c2["isError"], c2["metadata"]) == (True, None)
    assert delegates().count() == 1


def test_a_child_resumed_while_its_caller_is_paused_spends_the_callers_remainder(
    model, agents, user, recording_queue
):
    agents("coordinator", model="m-coord", team=["asker"], budget={"max_tokens": 10})
    agents("asker", model="m-asker", tools=[SECRET, LOOKUP])
    four = {"prompt_tokens": 2, "completion_tokens": 2, "total_tokens": 4}

    def asker(request):
        if not request.has_tool_message:
            return calls(("s1", "secret", {}), usage=four)
        return calls((f"l{request.index}", "lookup", {"q": "x"}), usage=four)

    server = model.script(
        by_model(m_coord=delegating("m", "asker", "dig", echo_last), m_asker=asker)
    )
    task = run(user, recording_queue, "coordinator")
    assert (task.status, task.run.total_tokens) == ("waiting_for_input", 6)  # 2 own + 4 absorbed
    lifecycle.resolve_action(PendingAction.objects.get(status="pending").id, {"approved": True})
    run_to_idle(recording_queue)
    child, task = delegates().get(), refresh(task)
    caller_variant = 'The max_tokens budget (10) of the calling agent "coordinator" was reached'
    # Resumed by a worker, the child had the 4 tokens its paused caller had left.
    assert (child.error, server.served["m-asker"], TOOL_RUNS["lookup"]) == (caller_variant, 2, 0)
    assert tool_results(task.conversation_id)["c1"]["content"] == "[incomplete] " + caller_variant
    assert (task.error, task.run.total_tokens) == ("The max_tokens budget (10) was reached", 10)
    assert child.run.counted_in_id == task.run_id


def test_s36_wall_time_cuts_the_childs_in_flight_request(model, agents, user, recording_queue):
    agents("coordinator", model="m-coord", team=["explorer"], budget={"max_wall_seconds": 0.5})
    agents("explorer", model="m-explorer")
    model.script(
        by_model(
            m_coord=delegating("m", "explorer", "dig", echo_last),
            m_explorer=lambda r: hold(lambda r: False, deadline=3),
        )
    )
    started = time.monotonic()
    task = run(user, recording_queue, "coordinator")
    assert time.monotonic() - started < 2
    child = delegates().get()
    assert (
        child.error
        == 'The max_wall_seconds budget (0.5) of the calling agent "coordinator" was reached'
    )
    assert (task.status, task.error) == ("failed", "The max_wall_seconds budget (0.5) was reached")


# --- stops, deletion, registration (S37–S39) --------------------------------------------------


def test_s37_an_immediate_stop_reaches_the_inline_child(model, agents, user, recording_queue):
    model.set(HEARTBEAT_INTERVAL=1)
    agents("coordinator", model="m-coordinator", team=["explorer"])
    agents("explorer", model="m-explorer")
    server = model.script(
        by_model(
            m_coordinator=delegating(
                "m", "explorer", "find X", lambda r: "synthesis: " + r.last_tool
            ),
            m_explorer=lambda r: hold(disconnected, deadline=5),
        )
    )
    task = task_for(user, "coordinator", "investigate X")
    runner = in_thread(worker.execute_run, task.run_id)
    wait_for(lambda: server.of("m-explorer"), message="the explorer's request")
    stopped_at = time.monotonic()
    stopper = in_thread(lifecycle.stop, task.id)
    stopper.join(5)
    runner.join(1 + 2)
    assert not runner.is_alive()
    assert time.monotonic() - stopped_at < 1 + 2
    child = delegates().get()
    assert (refresh(task).status, refresh(child).status) == ("cancelled", "cancelled")
    assert not Run.objects.filter(status="running").exists()
    assert "c1" not in tool_results(task.conversation_id)
    # "Stopped while a run was executing": the stop reason the result maps to `interrupted`.
    assert refresh(child).stop_reason == "stopped"
    assert delegation._result(None, refresh(child), None).result.text == (
        "[interrupted] the subtask was stopped before it finished"
    )
    assert server.of("m-explorer")[0].answered.wait(2)


def test_s38_deleting_the_caller_conversation_deletes_the_delegation_tree(
    nested, user, recording_queue
):
    top = run(user, recording_queue, "top")
    lifecycle.resolve_action(PendingAction.objects.get(status="pending").id, {"approved": True})
    run_to_idle(recording_queue)
    assert refresh(top).status == "completed"
    hidden = list(delegates().values_list("conversation_id", flat=True))
    lifecycle.delete_conversation(top.conversation_id)
    assert not Conversation.objects.filter(pk__in=hidden).exists()
    assert not delegates().exists()
    assert not Run.objects.filter(conversation_id__in=hidden).exists()
    assert not Event.objects.filter(conversation_id__in=hidden).exists()
    assert not PendingAction.objects.exists()


def test_s39_registration_errors_and_warnings(agents):
    with pytest.raises(ImproperlyConfigured) as reserved:
        registry.build("bad", tools=[{"path": LOOKUP, "name": "task"}])
    assert '"task"' in str(reserved.value) and "reserved" in str(reserved.value)
    with pytest.raises(ImproperlyConfigured, match='duplicate tool name "lookup"'):
        registry.build("bad", tools=[LOOKUP, LOOKUP])
    with pytest.raises(ImproperlyConfigured, match="max_turn"):
        registry.build("bad", budget={"max_turn": 3})
    agents("lonely", team=["ghost"])
    warnings = [m for m in checks.run_checks() if m.id == "agenttasks.W003"]
    assert any("lonely" in m.msg and "ghost" in m.msg for m in warnings)


# --- delegate tasks elsewhere (docs/delegation.md#delegate-tasks-elsewhere-in-agenttasks) ----


def test_delegate_tasks_in_the_lifecycle(model, agents, user, recording_queue):
    agents("coordinator", model="m-coordinator", team=["explorer"])
    agents("explorer", model="m-explorer")
    model.script(
        by_model(
            m_coordinator=delegating("m", "explorer", "find X", echo_last),
            m_explorer=lambda r: http(500, "down"),
        )
    )
    task = run(user, recording_queue, "coordinator")
    child = delegates().get()
    assert child.status == "failed"
    assert not Wakeup.objects.filter(task=child).exists()  # its result went into a tool message
    with pytest.raises(NotRetryable):
        lifecycle.retry(child.id)
    with pytest.raises(TaskBusy, match="driven by its caller"):
        lifecycle.comment(child.id, "again", author=user)
    assert lifecycle.list_tasks(task.conversation_id) == []
    status = task_tools(task.conversation, task.run)[1].call(
        {"task_id": child.id, "wait_seconds": 0}
    )
    assert (status.text, status.is_error) == ("tasks: not found", True)
    assert store.live_count(task.conversation_id) == 0
