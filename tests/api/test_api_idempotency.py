"""docs/rest.md#idempotent-writes: the Idempotency-Key header on every write that creates work.

A repeat answers the recorded status and body with `Idempotent-Replayed: true` and runs nothing
again (no task, run, event, job or callback); a misuse is 422; a repeat while the first is still
being processed is 409 (PostgreSQL: it waits on the first's row, at most IDEMPOTENCY_WAIT).
"""

import threading
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone

from agenttasks import lifecycle
from agenttasks.api import idempotency
from agenttasks.models import Comment, Conversation, Event, IdempotencyKey, Run, Task

from ..conftest import run_threads
from .conftest import Api, agenttasks, error

# Behaves otherwise on PostgreSQL: a repeat waits on the first request's row lock.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.both]

KEY = "HTTP_IDEMPOTENCY_KEY"
INVALID = "Idempotency-Key must be 1-255 printable ASCII characters"
REUSED = "This Idempotency-Key was used with a different request"


def counts() -> tuple[int, ...]:
    return (
        Task.objects.count(),
        Run.objects.count(),
        Event.objects.count(),
        Conversation.objects.count(),
        Comment.objects.count(),
    )


def replayed(first, again) -> None:
    """`again` is the replay of `first`: same status, body and Location, and the marker."""
    assert again.status_code == first.status_code, again.content
    assert again.json() == first.json()
    assert again["Idempotent-Replayed"] == "true"
    assert not first.has_header("Idempotent-Replayed")
    assert again.get("Location") == first.get("Location")


def test_a_repeated_create_replays_and_runs_nothing(as_alice, recording_queue):
    body = {"agentId": "echo", "input": "hello", "metadata": {"n": 1}}
    first = as_alice.post("/tasks", body, **{KEY: "create-1"})
    assert first.status_code == 201
    before = (counts(), list(recording_queue.run_ids), list(recording_queue.jobs))
    again = as_alice.post("/tasks", body, **{KEY: "create-1"})
    replayed(first, again)
    assert (counts(), recording_queue.run_ids, recording_queue.jobs) == before
    assert Task.objects.count() == 1 and len(recording_queue.run_ids) == 1
    # The same body with its keys in another order, on the slashed path, is the same request.
    reordered = {"metadata": {"n": 1}, "input": "hello", "agentId": "echo"}
    replayed(first, as_alice.post("/tasks/", reordered, **{KEY: "create-1"}))
    # Another key is another request.
    assert as_alice.post("/tasks", body, **{KEY: "create-2"}).status_code == 201
    assert Task.objects.count() == 2


def test_a_key_reused_for_another_body_or_path_is_422(as_alice):
    first = as_alice.post("/tasks", {"agentId": "echo", "input": "hello"}, **{KEY: "k"})
    assert first.status_code == 201
    before = counts()
    error(
        as_alice.post("/tasks", {"agentId": "echo", "input": "other"}, **{KEY: "k"}),
        422,
        "idempotency_key_reused",
        REUSED,
    )
    error(
        as_alice.post("/conversations", {"agentId": "echo"}, **{KEY: "k"}),
        422,
        "idempotency_key_reused",
        REUSED,
    )
    assert counts() == before


def test_a_lapsed_key_runs_again(as_alice):
    first = as_alice.post("/tasks", {"agentId": "echo", "input": "hello"}, **{KEY: "old"})
    past = timezone.now() - timedelta(seconds=1)
    IdempotencyKey.objects.filter(key="old").update(expires_at=past)
    again = as_alice.post("/tasks", {"agentId": "echo", "input": "hello"}, **{KEY: "old"})
    assert again.status_code == 201 and not again.has_header("Idempotent-Replayed")
    assert again.json()["task"]["id"] != first.json()["task"]["id"]
    assert Task.objects.count() == 2
    (row,) = IdempotencyKey.objects.filter(key="old")
    assert row.expires_at > timezone.now()


def test_the_ttl_is_the_setting(as_alice):
    with agenttasks(IDEMPOTENCY_TTL=60):
        as_alice.post("/tasks", {"agentId": "echo", "input": "hello"}, **{KEY: "ttl"})
    row = IdempotencyKey.objects.get(key="ttl")
    assert row.expires_at - row.created_at == timedelta(seconds=60)
    assert row.status_code == 201 and row.response_body["task"]["input"] == "hello"


def test_one_key_for_two_users_is_two_tasks(as_alice, as_bob):
    body = {"agentId": "echo", "input": "hello"}
    mine = as_alice.post("/tasks", body, **{KEY: "shared"})
    theirs = as_bob.post("/tasks", body, **{KEY: "shared"})
    assert (mine.status_code, theirs.status_code) == (201, 201)
    assert not theirs.has_header("Idempotent-Replayed")
    assert mine.json()["task"]["id"] != theirs.json()["task"]["id"]
    assert Task.objects.count() == 2


def test_the_anonymous_principal_has_keys_of_its_own(as_alice, anonymous):
    with agenttasks(ALLOW_ANONYMOUS=True):
        body = {"agentId": "echo", "input": "hello"}
        first = anonymous.post("/tasks", body, **{KEY: "anon"})
        replayed(first, anonymous.post("/tasks", body, **{KEY: "anon"}))
        assert as_alice.post("/tasks", body, **{KEY: "anon"}).status_code == 201
    assert Task.objects.count() == 2


@pytest.mark.parametrize("key", ["", "x" * 256, "caf\u00e9", "tab\there", "bell\x07"])
def test_a_malformed_key_is_400(as_alice, key):
    found = error(
        as_alice.post("/tasks", {"agentId": "echo", "input": "hello"}, **{KEY: key}),
        400,
        "VALIDATION_ERROR",
        INVALID,
    )
    assert found["details"] == {"fields": {"Idempotency-Key": [INVALID]}}
    assert Task.objects.count() == 0


def test_the_longest_key_and_every_printable_character_are_accepted(as_alice):
    for key in ("x" * 255, "".join(chr(c) for c in range(0x21, 0x7F))):
        first = as_alice.post("/tasks", {"agentId": "echo", "input": "hi"}, **{KEY: key})
        assert first.status_code == 201, first.content
        replayed(first, as_alice.post("/tasks", {"agentId": "echo", "input": "hi"}, **{KEY: key}))
    assert Task.objects.count() == 2


def test_a_refusal_is_recorded_and_replayed(as_alice):
    first = as_alice.post("/tasks", {"agentId": "nope", "input": "hello"}, **{KEY: "refused"})
    error(first, 404, "NOT_FOUND", "Agent not found: nope")
    replayed(
        first, as_alice.post("/tasks", {"agentId": "nope", "input": "hello"}, **{KEY: "refused"})
    )


def test_a_5xx_leaves_the_key_unused(as_alice, monkeypatch):
    real = lifecycle.create

    def broken(**kwargs):
        raise RuntimeError("storage down")

    monkeypatch.setattr(lifecycle, "create", broken)
    body = {"agentId": "echo", "input": "hello"}
    error(as_alice.post("/tasks", body, **{KEY: "faulty"}), 500, "INTERNAL_ERROR")
    assert not IdempotencyKey.objects.exists()
    monkeypatch.setattr(lifecycle, "create", real)
    again = as_alice.post("/tasks", body, **{KEY: "faulty"})
    assert again.status_code == 201 and not again.has_header("Idempotent-Replayed")
    assert Task.objects.count() == 1


def test_a_429_leaves_the_key_unused(as_alice):
    body = {"agentId": "echo", "input": "hello"}
    with agenttasks(THROTTLE_RATES={"write": "1/min"}):
        assert as_alice.post("/tasks", body, **{KEY: "a"}).status_code == 201
        error(as_alice.post("/tasks", body, **{KEY: "b"}), 429, "rate_limited")
    assert list(IdempotencyKey.objects.values_list("key", flat=True)) == ["a"]
    again = as_alice.post("/tasks", body, **{KEY: "b"})
    assert again.status_code == 201 and not again.has_header("Idempotent-Replayed")


def test_a_request_without_a_key_records_nothing(as_alice):
    as_alice.post("/tasks", {"agentId": "echo", "input": "hello"})
    assert not IdempotencyKey.objects.exists()


# --- every keyed endpoint --------------------------------------------------------------------


def test_comment_and_retry_replay(as_alice, workers, recording_queue):
    task = as_alice.create()
    as_alice.wait_status(task["id"], "completed")
    path = f"/tasks/{task['id']}/comments"
    first = as_alice.post(path, {"content": "again"}, **{KEY: "c1"})
    assert first.status_code == 201
    replayed(first, as_alice.post(path, {"content": "again"}, **{KEY: "c1"}))
    assert Comment.objects.filter(task_id=task["id"]).count() == 1
    assert Run.objects.filter(task_id=task["id"]).count() == 2

    boom = as_alice.create("boom", "go")
    as_alice.wait_status(boom["id"], "failed")
    first = as_alice.post(f"/tasks/{boom['id']}/retry", None, **{KEY: "r1"})
    assert first.status_code == 202 and first.json()["task"]["attempt"] == 2
    runs = len(recording_queue.run_ids)
    replayed(first, as_alice.post(f"/tasks/{boom['id']}/retry", None, **{KEY: "r1"}))
    assert len(recording_queue.run_ids) == runs
    assert Run.objects.filter(task_id=boom["id"]).count() == 2


def test_cancel_replays_without_a_second_callback(as_alice, recording_queue):
    with agenttasks(CALLBACK_ALLOWED_HOSTS=["127.0.0.1"]):
        task = as_alice.create(callbackUrl="http://127.0.0.1/hook")
    recording_queue.run_jobs = False  # record the callback job; do not send it
    path = f"/tasks/{task['id']}/cancel"
    first = as_alice.post(path, {}, **{KEY: "stop"})
    assert first.status_code == 200 and first.json()["task"]["status"] == "cancelled"
    jobs, events = list(recording_queue.jobs), Event.objects.count()
    assert any("callback" in func for func, _ in jobs)
    replayed(first, as_alice.post(path, {}, **{KEY: "stop"}))
    assert (recording_queue.jobs, Event.objects.count()) == (jobs, events)


def test_conversation_and_message_replay(as_alice, recording_queue):
    first = as_alice.post("/conversations", {"agentId": "echo"}, **{KEY: "conv"})
    assert first.status_code == 201
    replayed(first, as_alice.post("/conversations", {"agentId": "echo"}, **{KEY: "conv"}))
    assert Conversation.objects.count() == 1
    path = f"/conversations/{first.json()['conversation']['id']}/messages"
    sent = as_alice.post(path, {"message": "hi"}, **{KEY: "msg"})
    assert sent.status_code == 202
    # Without the key the conversation is busy; with it, the first answer comes back.
    error(as_alice.post(path, {"message": "hi"}), 409, "conversation_busy")
    replayed(sent, as_alice.post(path, {"message": "hi"}, **{KEY: "msg"}))
    assert Event.objects.filter(type="message.user").count() == 1
    assert len(recording_queue.run_ids) == 1


def test_an_answer_replays(as_alice, workers):
    task = as_alice.create("approver", "prod")
    as_alice.wait_status(task["id"], "waiting_for_input")
    action = as_alice.task(task["id"])["pendingActions"][0]
    path = f"/conversations/{task['conversationId']}/actions/{action['id']}"
    first = as_alice.post(path, {"approved": True}, **{KEY: "yes"})
    assert first.status_code == 200 and first.json()["action"]["status"] == "approved"
    replayed(first, as_alice.post(path, {"approved": True}, **{KEY: "yes"}))
    assert Event.objects.filter(type="action.resolved").count() == 1
    # Without the key the same answer is refused: the action is settled.
    error(as_alice.post(path, {"approved": True}), 409, "action_resolved")


def test_the_document_declares_the_header(anonymous):
    document = anonymous.get("/docs/openapi.json").json()
    keyed = {
        ("/tasks", "post", "201"),
        ("/tasks/{taskId}/comments", "post", "201"),
        ("/tasks/{taskId}/retry", "post", "202"),
        ("/tasks/{taskId}/cancel", "post", "200"),
        ("/conversations", "post", "201"),
        ("/conversations/{conversationId}/messages", "post", "202"),
        ("/conversations/{conversationId}/actions/{actionId}", "post", "200"),
    }
    for path, method, success in keyed:
        operation = document["paths"][path][method]
        names = {p["name"] for p in operation.get("parameters", []) if p["in"] == "header"}
        assert "Idempotency-Key" in names, path
        assert "Idempotent-Replayed" in operation["responses"][success]["headers"], path
        assert "422" in operation["responses"] and "409" in operation["responses"], path


# --- concurrency (PostgreSQL: real threads, real row locks) ----------------------------------


@pytest.mark.postgres
def test_eight_concurrent_creates_with_one_key_make_one_task(alice):
    from rest_framework.authtoken.models import Token

    token = Token.objects.create(user=alice).key

    def create(i):
        api = Api(alice, token)
        response = api.post("/tasks", {"agentId": "echo", "input": "once"}, **{KEY: "race"})
        return response.status_code, response.json(), response.has_header("Idempotent-Replayed")

    for round_no in range(3):
        IdempotencyKey.objects.all().delete()
        results = run_threads(create, 8)
        assert all(isinstance(r, tuple) for r in results), results
        assert {status for status, _, _ in results} == {201}, results
        ids = {body["task"]["id"] for _, body, _ in results}
        assert len(ids) == 1, results
        assert [replay for _, _, replay in results].count(False) == 1
        assert Task.objects.filter(input="once").count() == round_no + 1


@pytest.mark.postgres
def test_a_repeat_while_the_first_is_in_progress_is_409(as_alice, alice):
    holding, release = threading.Event(), threading.Event()

    def first_in_progress():
        try:
            with transaction.atomic():
                now = timezone.now()
                IdempotencyKey.objects.create(
                    principal=f"user:{alice.pk}",
                    owner=alice,
                    key="busy",
                    method="POST",
                    path="/api/agents/tasks",
                    request_hash="-",
                    expires_at=now + timedelta(hours=1),
                )
                holding.set()
                release.wait(10)
                transaction.set_rollback(True)  # the first request failed after all
        finally:
            connection.close()

    holder = threading.Thread(target=first_in_progress)
    holder.start()
    try:
        assert holding.wait(10)
        with agenttasks(IDEMPOTENCY_WAIT=0.3):
            error(
                as_alice.post("/tasks", {"agentId": "echo", "input": "hi"}, **{KEY: "busy"}),
                409,
                "idempotency_key_in_progress",
            )
        assert Task.objects.count() == 0
    finally:
        release.set()
        holder.join(10)
    # The first rolled back: the key is free, and this request is the first.
    again = as_alice.post("/tasks", {"agentId": "echo", "input": "hi"}, **{KEY: "busy"})
    assert again.status_code == 201 and not again.has_header("Idempotent-Replayed")


NUL_PATHS = [
    "/tasks/task_%00/cancel",
    "/tasks/task_%00/retry",
    "/tasks/task_%00/comments",
    "/conversations/conv_%00/messages",
    "/conversations/conv_%00/actions/act_%00",
]


@pytest.mark.parametrize("path", NUL_PATHS)
def test_a_keyed_request_on_a_path_with_a_nul_answers_as_unkeyed(as_alice, path):
    body = {"content": "x", "answers": {"q": "PDF"}}
    unkeyed = as_alice.post(path, body)
    assert unkeyed.status_code in (400, 404), unkeyed.content
    first = as_alice.post(path, body, **{KEY: "k1"})
    again = as_alice.post(path, body, **{KEY: "k1"})
    assert (first.status_code, first.json()) == (unkeyed.status_code, unkeyed.json())
    assert (again.status_code, again.json()) == (unkeyed.status_code, unkeyed.json())
    assert again["Idempotent-Replayed"] == "true"


@pytest.mark.parametrize("text", ["q\u0000", "q\ud800"], ids=["nul", "lone-surrogate"])
def test_a_recorded_answer_quoting_unstorable_text_is_kept_and_replayed(alice, text):
    # A 400 may quote what the client sent ({"answers": {"q\u0000": "PDF"}} on an action);
    # PostgreSQL's JSONB holds neither a NUL nor a lone surrogate.
    body = {"error": {"code": "VALIDATION_ERROR", "message": f"unknown question {text}"}}
    now = timezone.now()
    row = IdempotencyKey.objects.create(
        principal=f"user:{alice.pk}",
        owner=alice,
        key="k2",
        created_at=now,
        expires_at=now + timedelta(hours=1),
        method="POST",
        path="/x",
        request_hash="h",
        status_code=400,
        response_body=idempotency._storable(body),
    )
    assert idempotency._stored(IdempotencyKey.objects.get(pk=row.pk).response_body) == body
