"""Background tasks from a chat agent: spawn_task, the batched wake-up, task_status and task_retry.

The last test runs on a real django-q2 cluster: the agents execute in another process and call
the fake model server in this one over HTTP.
"""

import re

import pytest

from agenttasks import lifecycle
from agenttasks.delivery.wakeups import PREFIX
from agenttasks.execution import worker
from agenttasks.models import Event, Run, Task, Wakeup

from ..conftest import wait_for
from ..fake_model import answer, calls, hold, http, in_thread, run_to_idle

pytest_plugins = ["tests.fake_model"]  # the `model` and `agents` fixtures
pytestmark = pytest.mark.django_db(transaction=True)

TASK_ID = re.compile(r"task_id: (\S+)")


def spawn(call_id, text, agent="helper"):
    return (call_id, "spawn_task", {"agent_name": agent, "input": text, "label": text})


def helper_script(request):
    return answer("result " + request.first_user)


def last(request) -> dict:
    return request.messages[-1]


def start(user, agent, text):
    conversation = lifecycle.create_conversation(owner=user, agent_id=agent)
    lifecycle.post_message(conversation.id, text)
    return conversation


def test_spawn_end_the_turn_and_wake_with_the_notification(model, agents, user, recording_queue):
    agents("lead", model="m-lead")
    agents("helper", model="m-helper")

    def lead(request):
        if last(request)["role"] == "user" and last(request)["content"].startswith(PREFIX):
            return answer("noted")
        if not request.has_tool_message:
            return calls(spawn("s1", "A"))
        return answer("started")

    server = model.script(lambda r: helper_script(r) if r.model == "m-helper" else lead(r))
    conversation = start(user, "lead", "do A")
    run_to_idle(recording_queue)
    (note,) = Event.objects.filter(conversation_id=conversation.id, type="task.notification")
    assert note.data["content"].startswith(PREFIX)
    wake = server.of("m-lead")[-1]
    assert wake.messages[-1] == {"role": "user", "content": note.data["content"]}
    child = Task.objects.get(parent_conversation_id=conversation.id)
    assert f"({child.id}) completed. Result: result A" in note.data["content"]
    woken = Run.objects.get(conversation_id=conversation.id, trigger="wakeup")
    assert (woken.status, woken.output) == ("completed", "noted")
    assert server.served["m-lead"] == 3


def test_task_status_waits_and_returns_the_full_result(model, agents, user, recording_queue):
    agents("lead", model="m-lead")
    agents("helper", model="m-helper")
    long_result = "x" * 400  # longer than the summary a notification would carry

    def lead(request):
        if not request.has_tool_message:
            return calls(spawn("s1", "A"))
        if len(request.tool_contents()) == 1:
            task_id = TASK_ID.search(request.last_tool).group(1)
            # Let a worker run the child while the model waits on it.
            run_id = Task.objects.get(pk=task_id).run_id
            in_thread(worker.execute_run, run_id)
            return calls(("w1", "task_status", {"task_id": task_id, "wait_seconds": 10}))
        return answer(request.last_tool)

    model.script(lambda r: answer(long_result) if r.model == "m-helper" else lead(r))
    conversation = start(user, "lead", "do A")
    run_to_idle(recording_queue)
    child = Task.objects.get(parent_conversation_id=conversation.id)
    run = Run.objects.get(conversation_id=conversation.id, trigger="message")
    assert "status: completed" in run.output and f"result: {long_result}" in run.output
    # The model was handed the result in-turn: the debt is settled, nobody is woken.
    assert Wakeup.objects.get(task=child).state == "consumed"
    assert not Event.objects.filter(
        conversation_id=conversation.id, type="task.notification"
    ).exists()


def test_task_retry_resumes_a_failed_child(model, agents, user, recording_queue):
    agents("lead", model="m-lead")
    agents("helper", model="m-helper")
    attempts = []

    def helper(request):
        attempts.append(request)
        if len(attempts) == 1:
            return http(503, "overloaded")
        return answer("recovered after: " + request.messages[-1]["content"][:40])

    def lead(request):
        message = last(request)
        if message["role"] == "user" and message["content"].startswith(PREFIX):
            if " failed." in message["content"]:
                task_id = re.search(r"\((task_[^)]+)\) failed", message["content"]).group(1)
                return calls(("r1", "task_retry", {"task_id": task_id}))
            return answer("all good")
        if message["role"] == "tool" and message["tool_call_id"] == "r1":
            return answer("retrying")
        if not request.has_tool_message:
            return calls(spawn("s1", "A"))
        return answer("started")

    model.script(lambda r: helper(r) if r.model == "m-helper" else lead(r))
    conversation = start(user, "lead", "do A")
    run_to_idle(recording_queue)
    child = Task.objects.get(parent_conversation_id=conversation.id)
    assert (child.status, child.attempt) == ("completed", 2)
    assert child.result.startswith("recovered after: A previous attempt at this task failed")
    notes = Event.objects.filter(conversation_id=conversation.id, type="task.notification")
    assert [" failed." in n.data["content"] for n in notes.order_by("seq")] == [True, False]
    retried = Event.objects.get(
        conversation_id=conversation.id, type="tool.result", data__toolCallId="r1"
    )
    assert "attempt: 2" in retried.data["content"] and retried.data["isError"] is False


def test_two_background_tasks_on_a_real_cluster_wake_the_parent_once(model, user, start_cluster):
    definitions = {"chat-lead": {"model": "m-lead"}, "chat-helper": {"model": "m-helper"}}
    model.set(AGENTS=definitions)
    holder = {}

    def both_done(request):
        return (
            Task.objects.filter(
                parent_conversation_id=holder["conversation"], status="completed"
            ).count()
            == 2
        )

    def lead(request):
        message = last(request)
        if message["role"] == "user" and message["content"].startswith(PREFIX):
            return answer("both finished")
        if not request.has_tool_message:
            return calls(spawn("s1", "A", "chat-helper"), spawn("s2", "B", "chat-helper"))
        # Answer only once both children ended, so one wake-up carries both results.
        return hold(both_done, deadline=30, then=answer("spawned both; waiting"))

    server = model.script(lambda r: helper_script(r) if r.model == "m-helper" else lead(r))
    cluster = start_cluster(HEARTBEAT_INTERVAL=1, **model.values)
    conversation = lifecycle.create_conversation(owner=user, agent_id="chat-lead")
    holder["conversation"] = conversation.id
    lifecycle.post_message(conversation.id, "do two things")
    woken = wait_for(
        lambda: Run.objects.filter(
            conversation_id=conversation.id, trigger="wakeup", status="completed"
        ).first(),
        timeout=60,
        message="the wake-up turn",
    )
    (note,) = Event.objects.filter(conversation_id=conversation.id, type="task.notification")
    children = Task.objects.filter(parent_conversation_id=conversation.id)
    assert all(child.id in note.data["content"] for child in children) and len(children) == 2
    assert set(Wakeup.objects.filter(task__in=children).values_list("state", "delivered_run")) == {
        ("delivered", woken.id)
    }
    requests = server.of("m-lead")
    assert len(requests) == 3
    assert requests[2].messages[-1] == {"role": "user", "content": note.data["content"]}
    assert woken.output == "both finished"
    assert Run.objects.filter(conversation_id=conversation.id).count() == 2
    cluster.stop()  # gracefully, so its database sessions are closed before the test DB is dropped
