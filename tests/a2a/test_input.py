# ruff: noqa: F811  (the fixtures imported from tests.a2a_support are parameters here)
"""A2A INPUT_REQUIRED (docs/a2a.md#answering): questions, approvals and clarifications answered
by SendMessage with the task's id; contexts; the REST limits; protocol error codes."""

import json
from datetime import timedelta

import httpx
import pytest
from a2a.types import a2a_pb2 as pb
from a2a.utils.errors import (
    ContentTypeNotSupportedError,
    InvalidParamsError,
    UnsupportedOperationError,
)
from django.utils import timezone

from agenttasks.models import Comment, File, PendingAction, Task

from ..a2a_support import (  # noqa: F401  (fixtures)
    BINDINGS,
    JSONRPC,
    State,
    alice,
    bob,
    card_url,
    cluster,
    data_of,
    message_json,
    peer,
    rpc,
    server,
    text_message,
    text_of,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]


def pending(task: pb.Task) -> list[dict]:
    assert task.status.state == State.TASK_STATE_INPUT_REQUIRED, task.status
    (data,) = data_of(task.status.message.parts)
    return data["pendingActions"]


@pytest.mark.parametrize("binding", BINDINGS)
def test_asker_question_answered_by_send_message(peer, cluster, binding):
    client = peer("asker", binding)
    task = client.send(text_message("report"))
    assert text_of(task.status.message.parts) == "Which format?"
    (action,) = pending(task)
    assert action["kind"] == "question" and action["questions"][0]["id"] == "q1"
    answer = {"actionId": action["id"], "answers": {"q1": "PDF"}}
    done = client.send(text_message(task_id=task.id, data=answer))
    assert done.id == task.id and done.status.state == State.TASK_STATE_COMPLETED
    assert text_of(done.artifacts[0].parts) == "format: PDF"


@pytest.mark.parametrize("binding", BINDINGS)
def test_approver_approved_and_denied(peer, cluster, binding):
    client = peer("approver", binding)
    first = client.send(text_message("prod"))
    (action,) = pending(first)
    assert action["kind"] == "approval" and action["args"] == {"env": "prod"}
    approved = client.send(text_message(task_id=first.id, data={"approved": True}))
    assert text_of(approved.artifacts[0].parts) == "deployed to prod"
    second = client.send(text_message("staging"))
    pending(second)
    denied = client.send(text_message("deny", task_id=second.id))  # plain text answers too
    assert denied.status.state == State.TASK_STATE_COMPLETED
    assert text_of(denied.artifacts[0].parts) == "not deployed"
    # A finished task takes no more messages: a refinement is a new task in the context.
    with pytest.raises(UnsupportedOperationError):
        client.send(text_message("again", task_id=second.id))


@pytest.mark.parametrize("binding", BINDINGS)
def test_a_message_under_a_multitask_strategy_is_a_comment(peer, cluster, binding):
    client = peer("approver", binding)
    task = client.send(text_message("prod"))
    (action,) = pending(task)
    interrupt = text_message("staging", task_id=task.id)
    interrupt.metadata.update({"agenttasks.multitaskStrategy": "interrupt"})
    again = client.send(interrupt)  # the approval is cancelled; a newer run asks again
    (newer,) = pending(again)
    assert newer["id"] != action["id"]
    assert PendingAction.objects.get(pk=action["id"]).status == "cancelled"
    assert Comment.objects.get(task_id=task.id).content == "staging"
    done = client.send(text_message(task_id=task.id, data={"approved": True}))
    assert text_of(done.artifacts[0].parts) == "deployed to prod"
    # A finished task takes a message under a strategy as a comment that re-opens it.
    reopen = text_message("dev", task_id=task.id)
    reopen.metadata.update({"agenttasks.multitaskStrategy": "enqueue"})
    assert pending(client.send(reopen))[0]["id"] != newer["id"]
    assert Comment.objects.filter(task_id=task.id).count() == 2
    sideways = text_message("x", task_id=task.id)
    sideways.metadata.update({"agenttasks.multitaskStrategy": "sideways"})
    with pytest.raises(InvalidParamsError, match="multitaskStrategy must be one of"):
        client.send(sideways)


@pytest.mark.parametrize("binding", BINDINGS)
def test_legacy_clarification_answered_by_a_comment(peer, cluster, binding):
    client = peer("clarify", binding)
    task = client.send(text_message("summarize"))
    assert task.status.state == State.TASK_STATE_INPUT_REQUIRED
    assert text_of(task.status.message.parts) == "Which format?"
    done = client.send(text_message("PDF", task_id=task.id))
    assert text_of(done.artifacts[0].parts) == "Done in PDF"


@pytest.mark.parametrize("binding", BINDINGS)
def test_a_context_groups_tasks_and_their_history(peer, cluster, binding):
    client = peer("echo", binding)
    first = client.send(text_message("one"))
    second = client.send(text_message("two", context_id=first.context_id))
    assert second.context_id == first.context_id and second.id != first.id
    assert [text_of(m.parts) for m in second.history] == ["one", "Echo: one", "two", "Echo: two"]
    assert [m.task_id for m in second.history] == [first.id] * 2 + [second.id] * 2
    listed = client.list(context_id=first.context_id)
    assert [t.id for t in listed.tasks] == [second.id, first.id]


@pytest.mark.parametrize("binding", BINDINGS)
def test_file_parts_become_task_files_under_the_policy(peer, cluster, binding):
    pdf = pb.Part(raw=b"%PDF-1.4", filename="a.pdf", media_type="application/pdf")
    task = peer("docs", binding).send(text_message("read", parts=[pdf]))
    assert task.status.state == State.TASK_STATE_COMPLETED
    (row,) = File.objects.filter(task_id=task.id)
    assert (row.name, row.mime_type, row.size) == ("a.pdf", "application/pdf", 8)
    image = pb.Part(raw=b"GIF89a", filename="a.gif", media_type="image/gif")
    with pytest.raises(ContentTypeNotSupportedError):
        peer("docs", binding).send(text_message("look", parts=[image]))
    with pytest.raises(ContentTypeNotSupportedError):
        peer("nofiles", binding).send(text_message("read", parts=[pdf]))
    link = pb.Part(url="https://example.com/a.pdf", media_type="application/pdf")
    with pytest.raises(ContentTypeNotSupportedError):
        peer("docs", binding).send(text_message("fetch", parts=[link]))


@pytest.mark.parametrize("binding", BINDINGS)
def test_the_rest_limits_apply(peer, cluster, binding, settings):
    client = peer("slow", binding)
    settings.AGENTTASKS = {**settings.AGENTTASKS, "MAX_INPUT_CHARS": 10}
    with pytest.raises(InvalidParamsError):
        client.send(text_message("x" * 11), immediately=True)
    settings.AGENTTASKS = {**settings.AGENTTASKS, "MAX_ACTIVE_TASKS_PER_USER": 1}
    running = client.send(text_message("hold"), immediately=True, metadata={"seconds": 30})
    refused = client.send(text_message("more"), immediately=True)
    assert refused.status.state == State.TASK_STATE_REJECTED
    assert refused.id.startswith("task_") and refused.context_id.startswith("ctx_")
    assert "active" in text_of(refused.status.message.parts).lower()
    assert Task.objects.count() == 1
    client.cancel(running.id)
    settings.AGENTTASKS = {**settings.AGENTTASKS, "MAX_REQUEST_BYTES": 200}
    with pytest.raises(Exception, match="larger than 200 bytes"):
        client.send(text_message("y" * 300), immediately=True)


@pytest.mark.parametrize("binding", BINDINGS)
def test_the_read_and_write_throttles(peer, cluster, settings, binding):
    settings.AGENTTASKS = {**settings.AGENTTASKS, "THROTTLE_RATES": {"write": "1/min"}}
    client = peer("echo", binding)
    task = client.send(text_message("one"), immediately=True)
    with pytest.raises(Exception, match="429"):
        client.send(text_message("two"), immediately=True)
    # Reading is the `read` scope on both bindings (a JSON-RPC GetTask is not a write).
    assert client.get(task.id).id == task.id
    settings.AGENTTASKS = {**settings.AGENTTASKS, "THROTTLE_RATES": {"read": "1/min"}}
    client.get(task.id)
    with pytest.raises(Exception, match="429"):
        client.get(task.id)


def test_protocol_error_codes_on_both_bindings(server, alice, bob, cluster):
    def code(method, params, agent="echo", token=alice.token):
        return rpc(server, token, agent, method, params)["error"]["code"]

    done = rpc(server, alice.token, "echo", "SendMessage", {"message": message_json("hi")})
    task_id = done["result"]["task"]["id"]
    assert done["id"] == 7 and done["result"]["task"]["status"]["state"] == "TASK_STATE_COMPLETED"
    assert code("GetTask", {"id": "task_nope"}) == -32001
    assert code("GetTask", {"id": task_id}, token=bob.token) == -32001
    assert code("CancelTask", {"id": task_id}) == -32002
    assert code("SendMessage", {"message": message_json("again", taskId=task_id)}) == -32004
    url_part = {"url": "https://example.com/x", "mediaType": "text/plain"}
    assert code("SendMessage", {"message": {**message_json(""), "parts": [url_part]}}) == -32005
    assert code("NoSuchMethod", {}) == -32601

    rest = card_url(server, "echo") + "/rest"
    headers = {"Authorization": f"Token {alice.token}", "A2A-Version": "1.0"}

    def status_and_reason(method, path, body=None):
        response = httpx.request(method, rest + path, json=body, headers=headers)
        details = response.json()["error"].get("details") or [{}]
        return response.status_code, details[0].get("reason")

    assert status_and_reason("GET", "/tasks/task_nope") == (404, "TASK_NOT_FOUND")
    assert status_and_reason("POST", f"/tasks/{task_id}:cancel") == (400, "TASK_NOT_CANCELABLE")
    again = {"message": message_json("again", taskId=task_id)}
    assert status_and_reason("POST", "/message:send", again) == (400, "UNSUPPORTED_OPERATION")
    link = {"message": {**message_json(""), "parts": [url_part]}}
    assert status_and_reason("POST", "/message:send", link) == (400, "CONTENT_TYPE_NOT_SUPPORTED")
    anonymous = httpx.get(rest + f"/tasks/{task_id}")
    assert anonymous.status_code == 401
    assert httpx.get(card_url(server, "echo") + "/", headers=headers).status_code == 405
    assert httpx.put(rest + f"/tasks/{task_id}", headers=headers).status_code == 405


def test_malformed_bodies(server, alice, cluster):
    headers = {"Authorization": f"Token {alice.token}", "Content-Type": "application/json"}
    root = card_url(server, "echo")
    rpc_answer = httpx.post(root + "/", content=b"{not json", headers=headers)
    assert rpc_answer.status_code == 200 and rpc_answer.json()["error"]["code"] == -32700
    rest_answer = httpx.post(root + "/rest/message:send", content=b"{not json", headers=headers)
    assert rest_answer.status_code == 400
    assert rest_answer.json()["error"]["details"][0]["reason"] == "INVALID_REQUEST"
    old = httpx.post(
        root + "/",
        json={"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": "x"}},
        headers={**headers, "A2A-Version": "0.3"},
    )
    assert old.json()["error"]["code"] == -32009


@pytest.mark.parametrize(
    "params",
    [
        {"message": "x"},
        {"message": {"parts": [{"raw": "!!!"}]}},
        {"message": {"role": "ROLE_USER", "parts": []}},
        {"message": {"parts": [{"text": "a\u0000b"}]}},
        {"message": {"parts": [{"text": "hi"}], "contextId": "c" * 201}},
        {"message": {"parts": [{"text": "hi"}]}, "metadata": {"k": "\u0000"}},
        {"message": {"parts": [{"text": "hi"}], "taskId": "task_\u0000"}},
        {"message": {"parts": [{"raw": "aGk=", "mediaType": "not a type"}]}},
        {
            "message": {"parts": [{"text": "hi"}]},
            "configuration": {"taskPushNotificationConfig": {"url": "ftp://x"}},
        },
        [1, 2],
    ],
)
def test_malformed_params_are_protocol_errors_and_write_nothing(server, alice, params):
    answer = rpc(server, alice.token, "docs", "SendMessage", params)
    assert answer["error"]["code"] in (-32602, -32600, -32001, -32005), answer
    assert not Task.objects.exists()


def test_an_unknown_list_status_is_invalid_params_on_both_bindings(server, alice):
    # Parsing that ignores unknown fields read "BOGUS" as no status: the whole list came back.
    for status in ("BOGUS", 99):
        answer = rpc(server, alice.token, "echo", "ListTasks", {"status": status})
        assert answer["error"]["code"] == -32602, answer
        rest = httpx.get(
            card_url(server, "echo") + "/rest/tasks",
            params={"status": status},
            headers={"Authorization": f"Token {alice.token}", "A2A-Version": "1.0"},
        )
        assert rest.status_code == 400, rest.text
    known = rpc(server, alice.token, "echo", "ListTasks", {"status": "TASK_STATE_COMPLETED"})
    assert "error" not in known, known


@pytest.mark.parametrize("encoding", ["utf-16", "utf-8-sig", "utf-32"])
def test_a_body_that_is_not_utf_8_is_a_parse_error_on_both_bindings(server, alice, encoding):
    headers = {"Authorization": f"Token {alice.token}", "Content-Type": "application/json"}
    root = card_url(server, "echo")
    body = {"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": {}}}
    rpc_answer = httpx.post(root + "/", content=json.dumps(body).encode(encoding), headers=headers)
    assert rpc_answer.status_code == 200 and rpc_answer.json()["error"]["code"] == -32700
    rest = httpx.post(
        root + "/rest/message:send",
        content=json.dumps({"message": {}}).encode(encoding),
        headers=headers,
    )
    assert rest.status_code == 400, rest.text
    assert Task.objects.count() == 0


@pytest.mark.parametrize("binding", BINDINGS)
def test_metadata_sets_the_priority_and_the_delayed_start(peer, binding):
    later = timezone.now().replace(microsecond=0) + timedelta(hours=1)
    client = peer("echo", binding)
    metadata = {"agenttasks.priority": 5, "agenttasks.notBefore": later.isoformat()}
    task = client.send(text_message("later"), immediately=True, metadata=metadata)
    assert task.status.state == State.TASK_STATE_SUBMITTED
    row = Task.objects.select_related("run").get(pk=task.id)
    assert (row.priority, row.run.not_before, row.status) == (5, later, "pending")
    with pytest.raises(InvalidParamsError):
        client.send(text_message("x"), immediately=True, metadata={"agenttasks.priority": "high"})
    with pytest.raises(InvalidParamsError):
        client.send(text_message("x"), immediately=True, metadata={"agenttasks.notBefore": "soon"})
    assert Task.objects.count() == 1
