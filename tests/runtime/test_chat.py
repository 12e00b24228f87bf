"""The chat runtime against the scripted fake model server (docs/delegation.md, S1–S3, S25–S36).

Scenario tests are named after their S number; the others cover the loop's own rules (the
transcript, interrupted calls, questions, stops) with the same harness.
"""

import json
import socket
import time
from datetime import datetime, timedelta

import pytest
from django.utils import timezone

from agenttasks import lifecycle
from agenttasks.execution import worker
from agenttasks.models import Event, PendingAction, ProviderBudget, Run
from agenttasks.runtime import model_client

from ..conftest import wait_for
from ..fake_model import (
    ASK_USER,
    LOOKUP,
    SECRET,
    SEND_EMAIL,
    TOOL_LOG,
    TOOL_RUNS,
    _frame,
    answer,
    calls,
    disconnected,
    events,
    hold,
    http,
    in_thread,
    refresh,
    run_to_idle,
    stream_answer,
    task_for,
    tool_results,
    transcript,
)

pytest_plugins = ["tests.fake_model"]  # the `model` and `agents` fixtures
pytestmark = pytest.mark.django_db(transaction=True)

BACKGROUND = ["spawn_task", "task_status", "task_retry", "task_stop"]


def usage(total, prompt=None):
    prompt = total // 2 if prompt is None else prompt
    return {"prompt_tokens": prompt, "completion_tokens": total - prompt, "total_tokens": total}


def sequence(*replies):
    """A script that answers with the replies in order (the last one repeats)."""
    replies = list(replies)

    def script(request):
        return replies.pop(0) if len(replies) > 1 else replies[0]

    return script


def approve(action, **resolution):
    return lifecycle.resolve_action(action.id, {"approved": True, **resolution})


# --- tools on the wire (S1–S3) ---------------------------------------------------------------


def test_s1_no_team_no_tools(model, agents, user, recording_queue):
    agents("solo", model="m-solo", does="works alone")
    server = model.script(lambda r: answer("ok"))
    task = task_for(user, "solo", "hi")
    run_to_idle(recording_queue)
    (request,) = server.of("m-solo")
    # Streamed by default (docs/delegation.md#streaming); a whole JSON answer is read as well.
    assert list(request.json) == ["model", "messages", "stream", "stream_options"]
    assert (request.json["stream"], request.json["stream_options"]) == (
        True,
        {"include_usage": True},
    )
    done = refresh(task)
    assert (done.status, done.result) == ("completed", "ok")


def test_an_agent_with_stream_off_asks_for_a_whole_answer(model, agents, user, recording_queue):
    agents("solo", model="m-solo", stream=False)
    server = model.script(lambda r: answer("ok"))
    task = task_for(user, "solo", "hi")
    run_to_idle(recording_queue)
    (request,) = server.of("m-solo")
    assert list(request.json) == ["model", "messages"]
    assert refresh(task).result == "ok"


def test_s3_tool_order(model, agents, user, recording_queue):
    agents("explore", does="read-only research")
    agents("hub", model="m-hub", tools=[LOOKUP, ASK_USER], team=["explore"])
    server = model.script(lambda r: answer("ok"))
    conversation = lifecycle.create_conversation(owner=user, agent_id="hub")
    lifecycle.post_message(conversation.id, "hi")
    run_to_idle(recording_queue)
    task_for(user, "hub", "hi")
    run_to_idle(recording_queue)
    first, second = server.of("m-hub")
    assert first.tool_names == ["lookup", "ask_user", *BACKGROUND, "task"]
    assert second.tool_names == ["lookup", "ask_user", "task"]
    assert first.json["tool_choice"] == second.json["tool_choice"] == "auto"


def test_a_task_below_max_depth_gets_the_background_tools(model, agents, user, recording_queue):
    model.set(MAX_DEPTH=2)
    agents("hub", model="m-hub", tools=[LOOKUP])
    server = model.script(lambda r: answer("ok"))
    task_for(user, "hub", "hi")
    run_to_idle(recording_queue)
    assert server.requests[0].tool_names == ["lookup", *BACKGROUND]


# --- the chat loop (S25–S26) ------------------------------------------------------------------


def mailer_script(request):
    if not request.has_tool_message:
        return calls(("e1", "send_email", {"to": "a@example.com"}))
    return answer("mail: " + request.last_tool)


@pytest.mark.parametrize("approved", [True, False])
def test_s25_an_agents_own_approval(model, agents, user, recording_queue, approved):
    agents("mailer", model="m-mailer", tools=[SEND_EMAIL])
    server = model.script(mailer_script)
    task = task_for(user, "mailer")
    run_to_idle(recording_queue)
    assert refresh(task).status == "waiting_for_input"
    action = PendingAction.objects.get(task=task)
    assert action.prompt == 'Allow send_email with arguments {"to": "a@example.com"}?'
    assert (action.kind, action.tool_name, action.args) == (
        "approval",
        "send_email",
        {"to": "a@example.com"},
    )
    assert TOOL_RUNS["send_email"] == 0 and "e1" not in tool_results(task.conversation_id)
    if approved:
        approve(action)
    else:
        lifecycle.resolve_action(action.id, {"approved": False})
    run_to_idle(recording_queue)
    done = refresh(task)
    if approved:
        # The resumed run is the same run row (docs/delegation.md#pausing-resuming-and-replay: it keeps its id).
        assert TOOL_LOG == [("send_email", task.run_id)]
        assert (done.status, done.result) == ("completed", "mail: sent")
    else:
        assert TOOL_RUNS["send_email"] == 0
        assert (done.status, done.result) == ("completed", "mail: Tool call denied by the user")
    assert server.served["m-mailer"] == 2
    assert transcript(task.conversation_id)[:3] == [
        ("user", "go"),
        ("assistant", ["e1"]),
        ("tool", "e1", "sent" if approved else "Tool call denied by the user"),
    ]


def test_s26_a_resume_continues_the_budget_window(model, agents, user, recording_queue):
    agents("careful", model="m-careful", tools=[SECRET, LOOKUP], budget={"max_turns": 3})

    def script(request):
        if not request.has_tool_message:
            return calls(("s1", "secret", {}))
        return calls((f"l{request.index}", "lookup", {"q": "x"}))

    server = model.script(script)
    task = task_for(user, "careful")
    run_to_idle(recording_queue)
    assert server.served["m-careful"] == 1
    approve(PendingAction.objects.get(task=task))
    run_to_idle(recording_queue)
    assert server.served["m-careful"] == 3
    done = refresh(task)
    assert (done.status, done.error) == ("failed", "The max_turns budget (3) was reached")
    assert TOOL_RUNS["lookup"] == 1 and TOOL_RUNS["secret"] == 1
    assert done.run.turns == 3


def test_tool_results_go_after_their_assistant_message_in_call_order(
    model, agents, user, recording_queue
):
    agents("pair", model="m-pair", tools=[LOOKUP, SECRET])

    def script(request):
        if not request.has_tool_message:
            return calls(("a1", "secret", {}), ("a2", "lookup", {"q": "z"}))
        return answer("|".join(request.tool_contents()))

    server = model.script(script)
    task = task_for(user, "pair")
    run_to_idle(recording_queue)
    # a2 ran and was appended first; a1 waits for its approval.
    assert list(tool_results(task.conversation_id)) == ["a2"]
    approve(PendingAction.objects.get(task=task))
    run_to_idle(recording_queue)
    assert refresh(task).result == "secret-token|data(z)"
    last = server.of("m-pair")[-1].messages
    assert [m.get("tool_call_id") for m in last[-2:]] == ["a1", "a2"]


def test_a_run_that_is_not_a_resume_closes_outstanding_calls_as_interrupted(
    model, agents, user, recording_queue
):
    agents("mailer", model="m-mailer", tools=[SEND_EMAIL])
    server = model.script(mailer_script)
    task = task_for(user, "mailer")
    run_to_idle(recording_queue)
    lifecycle.stop(task.id)
    lifecycle.comment(task.id, "never mind", author=user)
    run_to_idle(recording_queue)
    assert TOOL_RUNS["send_email"] == 0
    interrupted = "Tool call interrupted: the run ended before it returned a result"
    assert refresh(task).result == "mail: " + interrupted
    assert server.of("m-mailer")[-1].messages[-2:] == [
        {"role": "tool", "tool_call_id": "e1", "content": interrupted},
        {"role": "user", "content": "never mind"},
    ]
    assert tool_results(task.conversation_id)["e1"]["isError"] is True


def asker_script(request):
    if not request.has_tool_message:
        return calls(("q1", "ask_user", {"question": "Which format?", "options": ["PDF", "HTML"]}))
    return answer("asked: " + request.last_tool)


def test_ask_user_on_a_conversation_without_a_task(model, agents, user, recording_queue):
    agents("quiz", model="m-quiz", tools=[ASK_USER])
    server = model.script(asker_script)
    conversation = lifecycle.create_conversation(owner=user, agent_id="quiz")
    run, _ = lifecycle.post_message(conversation.id, "hi")
    run_to_idle(recording_queue)
    assert Run.objects.get(pk=run.id).status == "paused"
    action = PendingAction.objects.get(run_id=run.id)
    assert (action.kind, action.prompt) == ("question", "Which format?")
    assert [o["value"] for o in action.questions[0]["options"]] == ["PDF", "HTML"]
    assert server.of("m-quiz")[0].tool("ask_user") == {
        "name": "ask_user",
        "description": "Ask the person a question and wait for the answer. Use it only when you "
        "cannot continue without their input; your work pauses until they answer.",
        "parameters": {
            "type": "object",
            "properties": {
                "question": {"type": "string", "description": "The question for the person"},
                "options": {
                    "type": "array",
                    "items": {"type": "string"},
                    "description": "Suggested answers the person can pick from (optional)",
                },
            },
            "required": ["question"],
        },
    }
    lifecycle.resolve_action(action.id, {"answers": {"q1": {"values": ["PDF"]}}})
    run_to_idle(recording_queue)
    ended = Run.objects.get(pk=run.id)
    assert (ended.status, ended.output) == ("completed", "asked: PDF")


def test_an_unanswered_question_lapses_and_the_run_carries_on(model, agents, user, recording_queue):
    agents("quiz", model="m-quiz", tools=[ASK_USER], hitl={"timeout_minutes": 1})
    model.script(asker_script)
    task = task_for(user, "quiz")
    run_to_idle(recording_queue)
    PendingAction.objects.filter(task=task).update(deadline=task.created_at)  # long past
    lifecycle.recover()
    run_to_idle(recording_queue)
    assert refresh(task).result == (
        "asked: No answer: the question was not answered before its deadline"
    )


def test_an_empty_question_is_refused(model, agents, user, recording_queue):
    agents("quiz", model="m-quiz", tools=[ASK_USER])

    def script(request):
        if not request.has_tool_message:
            return calls(("q1", "ask_user", {"question": "  "}))
        return answer(request.last_tool)

    model.script(script)
    task = task_for(user, "quiz")
    run_to_idle(recording_queue)
    assert (
        refresh(task).result
        == 'invalid arguments for ask_user: property "question" must not be empty'
    )


def test_a_graceful_stop_ends_the_run_at_the_turn_boundary(model, agents, user, recording_queue):
    agents("looper", model="m-looper", tools=[LOOKUP])
    task = task_for(user, "looper")

    def script(request):
        # Asked to stop after this turn while the model thinks: the tools still run.
        Run.objects.filter(pk=task.run_id).update(stop_request="after_turn")
        return calls((f"l{request.index}", "lookup", {"q": "x"}))

    server = model.script(script)
    run_to_idle(recording_queue)
    done = refresh(task)
    assert (done.status, done.summary) == ("cancelled", "stopped after the current turn")
    assert server.served["m-looper"] == 1 and TOOL_RUNS["lookup"] == 1


def test_an_immediate_stop_aborts_the_model_request(model, agents, user, recording_queue):
    model.set(HEARTBEAT_INTERVAL=1)
    agents("slowpoke", model="m-slow")
    server = model.script(lambda r: hold(disconnected, deadline=10))
    task = task_for(user, "slowpoke")
    runner = in_thread(worker.execute_run, task.run_id)
    wait_for(lambda: server.requests, message="the model request")
    stopped_at = time.monotonic()
    lifecycle.stop(task.id)
    runner.join(1 + 2)
    assert not runner.is_alive()
    assert server.requests[0].answered.wait(2), "the server saw the client disconnect"
    assert time.monotonic() - stopped_at < 1 + 2
    assert refresh(task).status == "cancelled"
    assert Run.objects.get(pk=task.run_id).status == "cancelled"
    assert not Event.objects.filter(
        conversation_id=task.conversation_id, type="message.assistant"
    ).exists()


# --- wire format and model-server errors (S27–S32) --------------------------------------------

LOOKUP_ENTRY = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "Look a term up in the project index.",
        "parameters": {
            "type": "object",
            "properties": {"q": {"type": "string", "description": "What to look up"}},
            "required": ["q"],
        },
    },
}


def test_s27_the_request_exactly(model, agents, user, recording_queue):
    model.set(MODEL_BASE_URL=model.server.url + "/")
    agents("wire", model="inherit", system_prompt="Be brief.", tools=[LOOKUP])
    server = model.script(lambda r: answer("ok"))
    task_for(user, "wire", "hi")
    run_to_idle(recording_queue)
    (request,) = server.requests
    assert request.path == "/v1/chat/completions"
    assert request.headers["authorization"] == "Bearer sk-test"
    assert request.headers["content-type"] == "application/json"
    assert request.headers["accept"] == "application/json"
    assert request.headers["user-agent"].startswith("agenttasks/")
    assert request.raw.startswith(b'{"model":"m-default","messages":')
    assert list(request.json) == [
        "model",
        "messages",
        "tools",
        "tool_choice",
        "stream",
        "stream_options",
    ]
    assert request.json["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
    ]
    assert request.json["tools"] == [LOOKUP_ENTRY]
    assert request.json["tool_choice"] == "auto"
    # Compact UTF-8 JSON, not ASCII-escaped.
    assert (
        request.raw == json.dumps(request.json, ensure_ascii=False, separators=(",", ":")).encode()
    )


def test_s27_variations(model, agents, user, recording_queue, monkeypatch):
    server = model.script(lambda r: answer("ok"))
    model.set(MODEL_API_KEY=None, MODEL_HEADERS={"X-Team": "blue"})
    agents("own", model="m-own", model_params={"temperature": 0}, tools=[LOOKUP])
    task_for(user, "own", "héllo")
    run_to_idle(recording_queue)
    (request,) = server.requests
    assert "authorization" not in request.headers and request.headers["x-team"] == "blue"
    assert request.json["model"] == "m-own"
    assert list(request.json) == [
        "model",
        "messages",
        "tools",
        "tool_choice",
        "temperature",
        "stream",
        "stream_options",
    ]
    assert "héllo".encode() in request.raw

    url = model.server.url
    model.set(MODEL_BASE_URL=None)
    monkeypatch.setenv("AGENTTASKS_MODEL_BASE_URL", url)
    assert refresh(task_for_and_run(user, "own", recording_queue)).status == "completed"

    monkeypatch.delenv("AGENTTASKS_MODEL_BASE_URL")
    before = len(server.requests)
    failed = refresh(task_for_and_run(user, "own", recording_queue))
    assert (failed.status, failed.error) == ("failed", model_client.NO_SERVER)
    assert failed.error == (
        'No model server configured: set AGENTTASKS["MODEL_BASE_URL"] or the '
        "AGENTTASKS_MODEL_BASE_URL environment variable"
    )
    assert len(server.requests) == before

    model.set(MODEL_BASE_URL=url, DEFAULT_MODEL=None)
    agents("inheritor")
    failed = refresh(task_for_and_run(user, "inheritor", recording_queue))
    assert failed.error == (
        'No model configured for agent "inheritor": set AGENTTASKS["DEFAULT_MODEL"] or the '
        "agent's model"
    )
    assert len(server.requests) == before


def task_for_and_run(user, agent, queue):
    task = task_for(user, agent, "hi")
    run_to_idle(queue)
    return task


@pytest.mark.parametrize(
    "reply, error",
    [
        (http(400, {"error": {"message": "boom"}}), "Model server returned HTTP 400: boom"),
        (http(500, "upstream exploded\n"), "Model server returned HTTP 500: upstream exploded"),
        (http(502, ""), "Model server returned HTTP 502"),
        (http(400, "x" * 600), "Model server returned HTTP 400: " + "x" * 500 + "…"),
        (http(401, {"error": "no key"}), "Model server returned HTTP 401: no key"),
    ],
)
def test_s28_non_2xx_answers_fail_the_run(model, agents, user, recording_queue, reply, error):
    agents("plain", model="m-plain")
    server = model.script(lambda r: reply)
    task = task_for_and_run(user, "plain", recording_queue)
    done = refresh(task)
    assert (done.status, done.error) == ("failed", error)
    assert not Event.objects.filter(
        conversation_id=task.conversation_id, type="message.assistant"
    ).exists()
    assert server.served["m-plain"] == 1
    assert done.run.turns == 1


BUSY = http(503, "busy", {"Retry-After": "0"})  # a limit: the provider says when to come back
OUTAGE = http(503, "busy")  # a failure that may pass: retried MODEL_RETRIES times


@pytest.mark.parametrize(
    "replies, status, text, requests",
    [
        ([BUSY, BUSY, answer("ok")], "completed", "ok", 3),
        ([OUTAGE, OUTAGE, OUTAGE, OUTAGE], "failed", "Model server returned HTTP 503: busy", 3),
        ([http(429, "", {"Retry-After": "0"}), answer("ok")], "completed", "ok", 2),
        ([http(400, "bad"), answer("ok")], "failed", "Model server returned HTTP 400: bad", 1),
    ],
)
def test_s29_retries(model, agents, user, recording_queue, replies, status, text, requests):
    model.set(MODEL_RETRIES=2)
    agents("plain", model="m-plain")
    server = model.script(sequence(*replies))
    done = refresh(task_for_and_run(user, "plain", recording_queue))
    assert done.status == status
    assert (done.result if status == "completed" else done.error) == text
    assert server.served["m-plain"] == requests
    assert done.run.turns == 1


def test_a_providers_limit_is_waited_out_not_counted_as_a_retry(
    model, agents, user, recording_queue
):
    """Five 429s in a row with MODEL_RETRIES=1: each is the provider's "later", not a failure.
    (The run waits its turns in its slot: the rate the refusals teach may put a turn further
    off than it would wait before parking, and a parked run is another claim's.)"""
    model.set(MODEL_RETRIES=1, PARK_AFTER=0)
    agents("plain", model="m-plain")
    limit = http(429, "slow down", {"Retry-After": "0"})
    server = model.script(sequence(limit, limit, limit, limit, limit, answer("ok")))
    done = refresh(task_for_and_run(user, "plain", recording_queue))
    assert (done.status, done.result) == ("completed", "ok")
    assert server.served["m-plain"] == 6
    budget = ProviderBudget.objects.get(pk="default")
    assert budget.refusals == 5 and budget.learned_rate is not None


def test_a_run_whose_patience_runs_out_fails_saying_it_was_the_limit(
    model, agents, user, recording_queue
):
    agents("plain", model="m-plain", patience_seconds=1)
    server = model.script(lambda r: http(429, "slow down", {"Retry-After": "30"}))
    started = time.monotonic()
    done = refresh(task_for_and_run(user, "plain", recording_queue))
    assert time.monotonic() - started < 10  # it does not wait the 30 s it could not afford
    assert done.status == "failed"
    assert done.error == (
        "The model provider's rate limit kept this run waiting longer than its patience (1s) "
        'on endpoint "default"'
    )
    assert server.served["m-plain"] == 1


def test_an_agents_endpoint_draws_from_its_own_limits(model, agents, user, recording_queue):
    model.set(MODEL_LIMITS={"slow": {"requests_per_minute": 60}})
    agents("plain", model="m-plain", endpoint="slow")
    server = model.script(lambda r: answer("ok"))
    for _ in range(2):
        refresh(task_for_and_run(user, "plain", recording_queue))
    arrivals = [r.arrived for r in server.requests]
    assert arrivals[1] - arrivals[0] >= 0.95  # one a second
    assert ProviderBudget.objects.filter(pk="slow").exists()
    assert not ProviderBudget.objects.filter(pk="default").exists()


def test_s29_retry_delay_follows_the_backoff_without_retry_after(
    model, agents, user, recording_queue
):
    model.set(MODEL_RETRIES=1)
    agents("plain", model="m-plain")
    server = model.script(sequence(http(500, "oops"), answer("ok")))
    started = time.monotonic()
    done = refresh(task_for_and_run(user, "plain", recording_queue))
    assert done.result == "ok" and server.served["m-plain"] == 2
    assert time.monotonic() - started >= 0.5  # 0.5 × 2^0 before the first retry


def test_s30_timeouts_and_an_unreachable_server(model, agents, user, recording_queue):
    model.set(MODEL_TIMEOUT=0.2, MODEL_RETRIES=2)
    agents("plain", model="m-plain")
    server = model.script(lambda r: hold(lambda r: False, deadline=3))
    started = time.monotonic()
    done = refresh(task_for_and_run(user, "plain", recording_queue))
    assert time.monotonic() - started < 2
    assert (done.status, done.error) == ("failed", "Model server timed out after 0.2s")
    assert len(server.requests) == 1

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    model.set(MODEL_BASE_URL=f"http://127.0.0.1:{port}/v1", MODEL_RETRIES=0)
    done = refresh(task_for_and_run(user, "plain", recording_queue))
    assert done.status == "failed" and done.error.startswith("Model server unreachable: ")


def test_a_stream_is_timed_by_its_silences_and_its_whole_length_by_its_own_cap(
    model, agents, user, recording_queue
):
    model.set(MODEL_TIMEOUT=0.4, MODEL_RETRIES=0)
    agents("streamer", model="m-stream", stream=True)
    # Ten pieces 0.1 s apart: a stream longer than MODEL_TIMEOUT that never falls silent for it.
    model.script(lambda r: stream_answer(list("abcdefghij"), gap=0.1))
    done = refresh(task_for_and_run(user, "streamer", recording_queue))
    assert (done.status, done.result) == ("completed", "abcdefghij")

    model.script(lambda r: stream_answer(["a", "b"], gap=1.0))  # a silence over MODEL_TIMEOUT
    done = refresh(task_for_and_run(user, "streamer", recording_queue))
    assert (done.status, done.error) == ("failed", "Model server timed out after 0.4s")

    model.set(MODEL_STREAM_TIMEOUT=0.5)  # the whole reply's cap
    model.script(lambda r: stream_answer(list("abcdefghijklmnopqrst"), gap=0.1))
    started = time.monotonic()
    done = refresh(task_for_and_run(user, "streamer", recording_queue))
    assert (done.status, done.error) == ("failed", "Model server stream took longer than 0.5s")
    assert time.monotonic() - started < 1.8


def _body(message):
    return http(200, {"choices": [{"message": message}]})


@pytest.mark.parametrize(
    "reply, error",
    [
        (http(200, "not json"), "Model server returned malformed JSON: not json"),
        (http(200, {"choices": []}), "Model server response has no choices[0].message"),
        (
            _body(
                {
                    "content": None,
                    "tool_calls": [
                        {"type": "function", "function": {"name": "lookup", "arguments": "{}"}}
                    ],
                }
            ),
            "Model server response has a malformed tool call at index 0",
        ),
        (
            _body(
                {
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "a",
                            "type": "function",
                            "function": {"name": "lookup", "arguments": "{}"},
                        },
                        {
                            "id": "a",
                            "type": "function",
                            "function": {"name": "lookup", "arguments": "{}"},
                        },
                    ],
                }
            ),
            "Model server response has a malformed tool call at index 1",
        ),
    ],
)
def test_s31_malformed_answers(model, agents, user, recording_queue, reply, error):
    agents("plain", model="m-plain", tools=[LOOKUP])
    model.script(lambda r: reply)
    done = refresh(task_for_and_run(user, "plain", recording_queue))
    assert (done.status, done.error) == ("failed", error)
    assert TOOL_RUNS["lookup"] == 0


def test_responses_in_other_accepted_shapes(model, agents, user, recording_queue):
    agents("plain", model="m-plain", tools=[LOOKUP])
    first = _body(
        {
            "content": None,
            "tool_calls": [
                {"id": "o1", "function": {"name": "lookup", "arguments": {"q": "é"}}},
            ],
        }
    )
    parts = _body(
        {
            "role": "assistant",
            "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
        }
    )
    server = model.script(sequence(first, parts))
    task = task_for_and_run(user, "plain", recording_queue)
    assert refresh(task).result == "ab"
    # An object argument is recorded (and replayed) as compact JSON.
    replayed = server.requests[1].messages[1]["tool_calls"][0]
    assert replayed == {
        "id": "o1",
        "type": "function",
        "function": {"name": "lookup", "arguments": '{"q":"é"}'},
    }
    assert server.requests[1].messages[2]["content"] == "data(é)"


def test_a_tool_call_turn_with_empty_text_is_logged_with_null_content(
    model, agents, user, recording_queue
):
    """Some servers send `content: ""` beside tool calls: that turn is not a message either."""
    agents("plain", model="m-plain", tools=[LOOKUP])
    empty = _body(
        {
            "content": "",
            "tool_calls": [{"id": "e1", "function": {"name": "lookup", "arguments": "{}"}}],
        }
    )
    model.script(sequence(empty, answer("done")))
    task = task_for_and_run(user, "plain", recording_queue)
    turns = Event.objects.filter(conversation_id=task.conversation_id, type="message.assistant")
    assert [e.data["content"] for e in turns.order_by("seq")] == [None, "done"]


def test_s32_usage_accounting(model, agents, user, recording_queue):
    agents("counter", model="m-counter", tools=[LOOKUP])
    model.script(
        sequence(
            calls(("l1", "lookup", {"q": "x"}), usage=None),
            answer("done", usage={"prompt_tokens": 3, "completion_tokens": 4}),
        )
    )
    run = refresh(task_for_and_run(user, "counter", recording_queue)).run
    assert (run.prompt_tokens, run.completion_tokens, run.total_tokens) == (3, 4, 7)
    assert (run.turns, run.tool_calls) == (2, 1)
    assert run.usage == {"inputTokens": 3, "outputTokens": 4, "totalTokens": 7}


@pytest.mark.parametrize("streamed", [False, True])
def test_a_chat_result_carries_the_usage_the_model_server_sent(
    model, agents, user, recording_queue, streamed
):
    """GET /tasks/{id}/result reports the run's tokens (it answered zeros: the chat runtime's
    usage is spelled prompt_tokens, the result's shape read inputTokens)."""
    from rest_framework.test import APIClient

    agents("counter", model="m-counter", stream=streamed)
    spent = {"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12}
    model.script(
        lambda r: (
            stream_answer(["do", "ne"], usage=spent) if streamed else answer("done", usage=spent)
        )
    )
    task = task_for_and_run(user, "counter", recording_queue)
    client = APIClient()
    client.force_authenticate(user)
    result = client.get(f"/api/agents/tasks/{task.id}/result").json()["result"]
    assert result["usage"] == {"inputTokens": 7, "outputTokens": 5, "totalTokens": 12}
    assert refresh(task).run.usage == result["usage"]


# --- budgets (S33–S36) ------------------------------------------------------------------------


def test_s33_turns_and_tool_calls(model, agents, user, recording_queue):
    agents("looper", model="m-looper", tools=[LOOKUP])
    agents("greedy", model="m-greedy", tools=[LOOKUP], budget={"max_tool_calls": 2})

    def script(request):
        if request.model == "m-greedy":
            return calls(*((f"g{i}", "lookup", {"q": "x"}) for i in range(3)))
        return calls((f"l{request.index}", "lookup", {"q": "x"}))

    server = model.script(script)
    looper = refresh(task_for_and_run(user, "looper", recording_queue))
    assert server.served["m-looper"] == 6
    assert (looper.status, looper.error) == ("failed", "The max_turns budget (6) was reached")
    assert TOOL_RUNS["lookup"] == 5
    greedy = refresh(task_for_and_run(user, "greedy", recording_queue))
    assert (greedy.status, greedy.error) == ("failed", "The max_tool_calls budget (2) was reached")
    assert TOOL_RUNS["lookup"] == 5


def test_s34_crossing_completes_being_cut_fails(model, agents, user, recording_queue):
    agents("thrifty", model="m-thrifty", tools=[LOOKUP], budget={"max_tokens": 5})
    server = model.script(
        sequence(
            calls(("l1", "lookup", {"q": "x"}), usage=usage(4)), answer("done", usage=usage(4))
        )
    )
    done = refresh(task_for_and_run(user, "thrifty", recording_queue))
    assert (done.status, done.result, done.run.total_tokens) == ("completed", "done", 8)

    server = model.script(sequence(calls(("l1", "lookup", {"q": "x"}), usage=usage(6))))
    before = len(server.requests)
    TOOL_RUNS.clear()
    cut = refresh(task_for_and_run(user, "thrifty", recording_queue))
    assert (cut.status, cut.error) == ("failed", "The max_tokens budget (5) was reached")
    assert len(server.requests) == before + 1 and TOOL_RUNS["lookup"] == 0


def test_s36_wall_time_cuts_an_in_flight_request(model, agents, user, recording_queue):
    agents("slow", model="m-slow", budget={"max_wall_seconds": 0.5})
    model.script(lambda r: hold(lambda r: False, deadline=3))
    started = time.monotonic()
    done = refresh(task_for_and_run(user, "slow", recording_queue))
    assert time.monotonic() - started < 2
    assert (done.status, done.error) == ("failed", "The max_wall_seconds budget (0.5) was reached")


def test_tool_exceptions_and_return_values(model, agents, user, recording_queue):
    agents("tinker", model="m-tinker", tools=["tests.fake_model.boom", LOOKUP])

    def script(request):
        if not request.has_tool_message:
            return calls(
                ("t1", "boom", "{}"),
                ("t2", "lookup", ""),
                ("t3", "lookup", '{"q": 1}'),
                ("t4", "lookup", "[1]"),
            )
        return answer("|".join(request.tool_contents()))

    model.script(script)
    task = task_for_and_run(user, "tinker", recording_queue)
    assert refresh(task).result == "|".join(
        [
            "tool boom failed: ValueError: bad input",
            'invalid arguments for lookup: missing required property "q"',
            'invalid arguments for lookup: property "q" must be of type string',
            "invalid arguments for lookup: arguments must be a JSON object",
        ]
    )
    results = tool_results(task.conversation_id)
    assert all(r["isError"] and r["metadata"] is None for r in results.values())


# --- the demo site's assistant ---------------------------------------------------------------


def test_the_demo_assistant_says_what_it_needs_and_uses_the_server_once_configured(
    model, user, recording_queue
):
    from agenttasks import registry
    from project.agents import register_assistant

    model.set(MODEL_BASE_URL=None, DEFAULT_MODEL=None)
    register_assistant()
    try:
        notice = refresh(task_for_and_run(user, "assistant", recording_queue))
        assert notice.status == "completed"
        assert (
            "AGENTTASKS_MODEL_BASE_URL" in notice.result
            and "AGENTTASKS_DEFAULT_MODEL" in notice.result
        )
        assert not model.server.requests

        model.set(MODEL_BASE_URL=model.server.url, DEFAULT_MODEL="m-default")
        register_assistant()
        server = model.script(lambda r: answer("hello from the model"))
        done = refresh(task_for_and_run(user, "assistant", recording_queue))
        assert (done.status, done.result) == ("completed", "hello from the model")
        assert server.requests[0].tool_names == ["ask_user", "task"]
        assert server.requests[0].messages[0]["role"] == "system"
    finally:
        model.set(MODEL_BASE_URL=None, DEFAULT_MODEL=None)
        register_assistant()
    assert registry.get("assistant").runtime == "callable"


def test_a_turn_further_off_than_park_after_parks_the_run_until_its_place_in_line(
    model, agents, user, recording_queue
):
    model.set(MODEL_LIMITS={"default": {"requests_per_minute": 60}}, PARK_AFTER=0.5)
    agents("plain", model="m-plain", stream=False)
    server = model.script(lambda r: answer("ok"))
    first = task_for_and_run(user, "plain", recording_queue)
    second = task_for_and_run(user, "plain", recording_queue)
    assert refresh(first).status == "completed"
    parked = refresh(second)
    assert (parked.status, parked.run.status, parked.run.worker) == ("pending", "queued", "")
    budget = ProviderBudget.objects.get(pk="default")
    # Its place is the next free start (one request's share of 90 % of 1 a second after the
    # first), and it comes back half of PARK_AFTER before it; nothing was reserved for it.
    place = budget.next_start
    assert parked.run.not_before == place - timedelta(seconds=0.25)
    line = budget.parked_lines[f"{user.pk}:0"]
    assert datetime.fromisoformat(line) == place + timedelta(seconds=1 / 0.9)  # as instants
    assert parked.run.limited_since is not None and parked.run.turns == 0
    statuses = [e.data["to"] for e in events(parked.conversation_id, "task.status")]
    assert statuses == ["pending", "running", "pending"]
    wait_for(lambda: timezone.now() >= parked.run.not_before, timeout=5)
    worker.execute_run(parked.run_id)
    done = refresh(second)
    assert (done.status, done.result, done.run_id) == ("completed", "ok", parked.run_id)
    assert done.run.limited_since is None  # it got its turn: a later wait starts afresh
    arrivals = [r.arrived for r in server.requests]
    assert arrivals[1] - arrivals[0] >= 1.0  # at its place: one a second at 90 %
    assert server.served["m-plain"] == 2


def test_a_message_steered_to_a_running_chat_run_is_read_at_its_next_turn(
    model, agents, user, recording_queue
):
    agents("helper", model="m-helper")
    steered = lambda request: Run.objects.filter(steers=1).exists()  # noqa: E731
    server = model.script(
        lambda r: (
            hold(steered, deadline=10, then=answer("About dogs."))
            if len(r.messages) == 1
            else answer("About dogs, and cats.")
        )
    )
    conversation = lifecycle.create_conversation(owner=user, agent_id="helper")
    run, _ = lifecycle.post_message(conversation.id, "Write about dogs")
    thread = in_thread(run_to_idle, recording_queue)
    wait_for(lambda: server.of("m-helper"), message="the first model request")
    target, event = lifecycle.post_message(conversation.id, "and cats", strategy="steer")
    assert (target.id, event.type) == (run.id, "message.steer")
    thread.join(20)
    first, second = server.of("m-helper")
    assert [(m["role"], m["content"]) for m in second.messages] == [
        ("user", "Write about dogs"),
        ("assistant", "About dogs."),
        ("user", "and cats"),
    ]
    assert Run.objects.get(pk=run.id).status == "completed"  # one run, two turns
    assert [(role, text) for role, text in transcript(conversation.id)][-2:] == [
        ("user", "and cats"),
        ("assistant", "About dogs, and cats."),
    ]


def test_a_streamed_answer_read_to_its_end_leaves_its_connection_for_the_next_request(model):
    # A connection closed before its stream's end is a new connection (a handshake) for each
    # request, and under load those connects are late by seconds, bunching the starts.
    server = model.script(lambda r: stream_answer(["a", "b"]))
    io = model_client._ModelIO(max_connections=4)
    url = server.url + "/chat/completions"
    body = json.dumps({"model": "m", "messages": [], "stream": True}).encode()
    pieces: list[str] = []
    for _ in range(3):
        future = io.send(url, {}, body, 10, pieces.append, None, "kept", [None, None])
        response, streamed = future.result(10)
        assert response is None and streamed.message()[0]["content"] == "ab"
    assert pieces == ["a", "b"] * 3
    assert len({request.peer for request in server.requests}) == 1


def test_requests_fill_the_first_pool_with_room_before_the_next(model):
    released: list[bool] = []
    server = model.script(lambda r: hold(lambda r: bool(released), deadline=10))
    io = model_client._ModelIO(max_connections=40)  # two pools of 20
    body = json.dumps({"model": "m", "messages": []}).encode()
    url = server.url + "/chat/completions"
    futures = [io.send(url, {}, body, 10, None, None, "packed", [None, None]) for _ in range(25)]
    wait_for(lambda: len(server.requests) == 25, 10)
    assert io.sending == [20, 5]
    released.append(True)
    assert all(future.result(10)[0].status_code == 200 for future in futures)
    assert io.sending == [0, 0]
    assert len({request.peer for request in server.requests}) == 25


def test_a_stream_that_goes_on_after_its_done_is_cut_and_its_answer_kept(model, monkeypatch):
    monkeypatch.setattr(model_client, "DRAIN_WITHIN", 0.2)
    done = stream_answer(["a"])
    # Frames after [DONE], slowly: the client stops waiting for the stream's end.
    done.chunks += [_frame(b"more")] * 20
    done.gap = 0.1
    server = model.script(lambda r: done)
    io = model_client._ModelIO(max_connections=4)
    body = json.dumps({"model": "m", "messages": [], "stream": True}).encode()
    started = time.monotonic()
    url = server.url + "/chat/completions"
    future = io.send(url, {}, body, 10, lambda text: None, None, "cut", [None, None])
    _, streamed = future.result(10)
    assert streamed.message()[0]["content"] == "a"
    assert time.monotonic() - started < 1.5  # not the 2 s the server goes on for


def test_a_request_is_noted_as_sent_when_it_leaves_not_while_it_waits_for_a_connection(model):
    # The first refusal's measure counts the requests sent in the second before it: one that
    # waited for a connection was not yet seen by the provider.
    released: list[float] = []
    server = model.script(lambda r: hold(lambda r: bool(released), deadline=10))
    io = model_client._ModelIO(max_connections=1)
    url = server.url + "/chat/completions"
    notes: list[list] = [[None, None], [None, None]]
    body = json.dumps({"model": "m", "messages": []}).encode()
    first, second = (io.send(url, {}, body, 10, None, None, "noted", note) for note in notes)
    wait_for(lambda: len(server.requests) == 1, 5)  # the second waits for the one connection
    released.append(time.time())
    assert first.result(10)[0].status_code == 200
    assert second.result(10)[0].status_code == 200
    assert notes[0][0] < released[0] <= notes[1][0]
    assert notes[0][1] == notes[1][1] == 200
