# ruff: noqa: F811  (the fixtures imported from tests.a2a_support are parameters here)
"""A2A under hostile input and load (issue 24): NUL in ids and query values, numbers protobuf
cannot hold, file parts checked as REST checks uploads, the wait place taken before a write, one
winner among concurrent cancels, signed page tokens, and history read per task in the database.

Both bindings are driven over raw HTTP; no cluster runs (tasks stay as created)."""

import base64
from datetime import timedelta
from types import SimpleNamespace

import httpx
import pytest
from a2a.types import a2a_pb2 as pb
from django.db import connection
from django.db.models.signals import post_init
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from agenttasks import lifecycle, registry, store
from agenttasks.a2a import service
from agenttasks.models import A2AContext, Event, File, Slot, Task

from ..a2a_support import (  # noqa: F401  (fixtures)
    PREFIX,
    alice,
    message_json,
    rest_call,
    rest_reason,
    rpc,
    server,
)
from ..conftest import run_threads

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

BIG = 10**309  # 310 digits: more than a double holds
INVALID_PARAMS = -32602
TASK_NOT_FOUND = -32001


def error_code(answer: dict) -> int:
    assert "error" in answer, answer
    return answer["error"]["code"]


def pending_task(owner, agent="echo") -> Task:
    """A task that stays pending (no cluster runs it)."""
    return lifecycle.create(owner=owner, agent_id=agent, input="x")


# --- item 3: NUL in query values and ids ---------------------------------------------------------


def test_nul_in_query_values_ids_and_page_tokens_is_a_protocol_error(server, alice):
    task = pending_task(alice)
    token = alice.token
    assert error_code(rpc(server, token, "echo", "ListTasks", {"contextId": "\x00"})) == (
        INVALID_PARAMS
    )
    listed = rest_call(server, token, "echo", "GET", "/tasks?contextId=%00")
    assert (listed.status_code, rest_reason(listed)) == (400, "INVALID_PARAMS"), listed.text
    for method in ("GetTaskPushNotificationConfig", "DeleteTaskPushNotificationConfig"):
        answer = rpc(server, token, "echo", method, {"taskId": task.id, "id": "p\x00"})
        assert error_code(answer) == TASK_NOT_FOUND
    for method in ("GET", "DELETE"):
        config = rest_call(
            server, token, "echo", method, f"/tasks/{task.id}/pushNotificationConfigs/p%00"
        )
        assert (config.status_code, rest_reason(config)) == (404, "TASK_NOT_FOUND"), config.text
    # Page tokens that decode to a NUL, alone or where a task id would be.
    for raw in ("\x00", f"{timezone.now().isoformat()}|\x00"):
        forged = base64.urlsafe_b64encode(raw.encode()).decode()
        answer = rpc(server, token, "echo", "ListTasks", {"pageToken": forged})
        assert error_code(answer) == INVALID_PARAMS
        page = rest_call(server, token, "echo", "GET", f"/tasks?pageToken={forged}")
        assert (page.status_code, rest_reason(page)) == (400, "INVALID_PARAMS"), page.text


# --- item 4: numbers protobuf cannot hold ------------------------------------------------------


def send_json(where: str, value) -> dict:
    """A non-blocking SendMessageRequest carrying `{"n": value}` in `where`."""
    message = message_json("hi")
    body = {"message": message, "configuration": {"returnImmediately": True}}
    if where == "metadata":
        body["metadata"] = {"n": value}
    elif where == "message.metadata":
        message["metadata"] = {"n": value}
    else:
        message["parts"].append({"data": {"n": value}})
    return body


def sent_task_ids(server, alice, body) -> list[str]:
    """Send `body` on both bindings; the ids of the two tasks created."""
    answer = rpc(server, alice.token, "echo", "SendMessage", body)
    assert "result" in answer, answer
    rest = rest_call(server, alice.token, "echo", "POST", "/message:send", body)
    assert rest.status_code == 200, rest.text
    return [answer["result"]["task"]["id"], rest.json()["task"]["id"]]


@pytest.mark.parametrize("where", ["metadata", "message.metadata", "data"])
def test_numbers_a_double_cannot_hold_are_kept_as_rest_keeps_them(server, alice, where):
    # REST takes this body and stores the numbers as they are; so does A2A (protobuf's Struct
    # holds doubles: 10**309 overflowed it, a 500, and 2**63 lost digits).
    value = {"big": BIG, "exact": 2**63, "one": 1}
    created = httpx.post(
        f"{server}{PREFIX}/tasks",
        json={"agentId": "echo", "input": "hi", "metadata": value},
        headers={"Authorization": f"Token {alice.token}"},
    )
    assert created.status_code == 201, created.text
    assert Task.objects.get(pk=created.json()["task"]["id"]).metadata == value
    for task_id in sent_task_ids(server, alice, send_json(where, value)):
        task = Task.objects.get(pk=task_id)
        if where == "data":
            assert task.input == f'hi\n\n{{"n":{{"big":{BIG},"exact":{2**63},"one":1}}}}'
        else:
            assert task.metadata == {"n": value}


# --- items 5 and 11: file parts pass REST's checks of uploads ----------------------------------


@pytest.mark.parametrize(
    ("part", "refusal"),
    [
        ({"filename": "a\x00.txt"}, "parts[1].filename must not contain NUL characters"),
        ({"filename": "a" * 252 + ".txt"}, "parts[1].filename must be at most 255 characters"),
        ({"raw": "!!!!"}, "parts[1].raw is not valid base64"),
        ({"raw": "YWJj$$$$ZGVm"}, "parts[1].raw is not valid base64"),
        ({"raw": "YWJjZGVm\u00e9"}, "parts[1].raw is not valid base64"),
    ],
    ids=["NUL in the name", "a long name", "not base64", "junk inside", "not ASCII"],
)
def test_file_parts_pass_the_checks_of_rest_uploads(server, alice, part, refusal):
    message = message_json("read")
    message["parts"].append(
        {"raw": "YWJjZGVm", "filename": "a.txt", "mediaType": "text/plain", **part}
    )
    body = {"message": message, "configuration": {"returnImmediately": True}}
    answer = rpc(server, alice.token, "docs", "SendMessage", body)
    assert error_code(answer) == INVALID_PARAMS
    assert refusal in answer["error"]["message"]
    rest = rest_call(server, alice.token, "docs", "POST", "/message:send", body)
    assert (rest.status_code, rest_reason(rest)) == (400, "INVALID_PARAMS"), rest.text
    assert refusal in rest.json()["error"]["message"]
    assert not Task.objects.exists() and not File.objects.exists()


def test_file_bytes_in_strict_base64_are_stored(server, alice):
    message = message_json("read")
    message["parts"].append({"raw": "YWJj\nZGVm", "filename": "a.txt", "mediaType": "text/plain"})
    body = {"message": message, "configuration": {"returnImmediately": True}}
    for task_id in [
        rpc(server, alice.token, "docs", "SendMessage", body)["result"]["task"]["id"],
        rest_call(server, alice.token, "docs", "POST", "/message:send", body).json()["task"]["id"],
    ]:
        (row,) = File.objects.filter(task_id=task_id)
        assert (row.name, row.mime_type, row.size) == ("a.txt", "text/plain", 6)


# --- item 7: the wait place is taken before anything is written --------------------------------


def test_a_blocking_send_refused_a_wait_place_creates_nothing(server, alice, settings):
    settings.AGENTTASKS = {**settings.AGENTTASKS, "MAX_WAITS_PER_USER": 1}
    # The user's one wait place is held (by another request's wait).
    expires = timezone.now() + timedelta(minutes=5)
    Slot.objects.create(key=f"wait:user:{alice.pk}:0", holder="another", expires_at=expires)
    body = {"message": message_json("hi")}
    headers = {"Authorization": f"Token {alice.token}", "A2A-Version": "1.0"}
    envelope = {"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": body}
    root = f"{server}{PREFIX}/a2a/echo"
    assert httpx.post(root + "/", json=envelope, headers=headers).status_code == 429
    assert httpx.post(root + "/rest/message:send", json=body, headers=headers).status_code == 429
    assert not Task.objects.exists()  # refused before the write: a retry duplicates nothing
    # Without a wait there is no place to take.
    body["configuration"] = {"returnImmediately": True}
    assert len(sent_task_ids(server, alice, body)) == 2


# --- item 9: one winner among concurrent cancels -----------------------------------------------


@pytest.mark.postgres
def test_concurrent_cancels_have_one_winner_on_both_bindings(server, alice):
    for binding in ("jsonrpc", "rest"):
        task = pending_task(alice, "slow")

        def cancel(i, task_id=task.id, binding=binding):
            if binding == "jsonrpc":
                answer = rpc(server, alice.token, "slow", "CancelTask", {"id": task_id})
                return "cancelled" if "result" in answer else answer["error"]["code"]
            response = rest_call(server, alice.token, "slow", "POST", f"/tasks/{task_id}:cancel")
            return "cancelled" if response.status_code == 200 else rest_reason(response)

        results = run_threads(cancel, 8)
        refused = -32002 if binding == "jsonrpc" else "TASK_NOT_CANCELABLE"
        assert sorted(results, key=str) == sorted(["cancelled"] + [refused] * 7, key=str), results
        assert Task.objects.get(pk=task.id).status == "cancelled"


# --- item 12: signed page tokens ---------------------------------------------------------------


def test_page_tokens_are_signed_and_bound_to_their_list(server, alice):
    made = [pending_task(alice).id for _ in range(3)]
    slow = [pending_task(alice, "slow").id for _ in range(2)]
    first = rpc(server, alice.token, "echo", "ListTasks", {"pageSize": 1})["result"]
    token = first["nextPageToken"]
    assert [t["id"] for t in first["tasks"]] == made[-1:]
    second = rpc(server, alice.token, "echo", "ListTasks", {"pageSize": 2, "pageToken": token})
    assert [t["id"] for t in second["result"]["tasks"]] == made[-2::-1]
    rest = rest_call(server, alice.token, "echo", "GET", f"/tasks?pageSize=2&pageToken={token}")
    assert [t["id"] for t in rest.json()["tasks"]] == made[-2::-1]
    newest = Task.objects.get(pk=made[-1])
    foreign = {
        "forged": base64.urlsafe_b64encode(
            f"{newest.created_at.isoformat()}|{newest.id}".encode()
        ).decode(),
        "edited": token[:-3] + ("AAA" if not token.endswith("AAA") else "BBB"),
        "REST's cursor": httpx.get(
            f"{server}{PREFIX}/tasks?limit=1", headers={"Authorization": f"Token {alice.token}"}
        ).json()["nextCursor"],
        "another agent's": rpc(server, alice.token, "slow", "ListTasks", {"pageSize": 1})["result"][
            "nextPageToken"
        ],
    }
    assert slow and all(foreign.values()), foreign
    for what, bad in foreign.items():
        answer = rpc(server, alice.token, "echo", "ListTasks", {"pageToken": bad})
        assert error_code(answer) == INVALID_PARAMS, what
        page = httpx.get(
            f"{server}{PREFIX}/a2a/echo/rest/tasks",
            params={"pageToken": bad},
            headers={"Authorization": f"Token {alice.token}"},
        )
        assert (page.status_code, rest_reason(page)) == (400, "INVALID_PARAMS"), what


# --- item 18: history read per task, in the database -------------------------------------------


def context_of(owner, count: int, context_id: str) -> list[Task]:
    """`count` tasks of one A2A context, each with its input and a reply, oldest first."""
    tasks = []
    for i in range(count):
        task = lifecycle.create(owner=owner, agent_id="echo", input=f"q{i}")
        A2AContext.objects.create(task=task, context_id=context_id)
        store.append_events(
            task.conversation_id, [("message.assistant", {"content": f"a{i}"}, "", task.id)]
        )
        tasks.append(task)
    return tasks


def echo_call(user) -> service.Call:
    """A2A's view of a request of `user` to the `echo` agent, for calls in this thread."""
    return service.Call(SimpleNamespace(user=user), registry.get("echo"), "http://testserver/api")


def listed(alice, **fields):
    """ListTasks in this thread: (the response, statements run, Event rows loaded)."""
    loaded = []

    def count(sender, instance, **kwargs):
        loaded.append(instance)

    post_init.connect(count, sender=Event)
    try:
        with CaptureQueriesContext(connection) as queries:
            response = service.list_tasks(echo_call(alice), pb.ListTasksRequest(**fields))
    finally:
        post_init.disconnect(count, sender=Event)
    return response, len(queries), len(loaded)


def texts(task) -> list[str]:
    return ["".join(p.text for p in m.parts) for m in task.history]


def test_list_history_reads_only_what_it_returns(alice, settings):
    settings.AGENTTASKS = {**settings.AGENTTASKS, "MAX_ACTIVE_TASKS_PER_USER": 0}
    cap = service.MAX_LIST_HISTORY_LENGTH
    small = context_of(alice, 4, "small")
    big = context_of(alice, 4 + 3 * cap, "big")
    newest = len(big) - 1
    one, statements, rows = listed(alice, context_id="big", page_size=3, history_length=1)
    assert [t.id for t in one.tasks] == [t.id for t in big[:-4:-1]]
    assert [texts(t) for t in one.tasks] == [[f"a{i}"] for i in range(newest, newest - 3, -1)]
    assert rows == 3  # one message per task, read as such
    # As many statements and rows for a context of 4 tasks as for one of 34.
    again = listed(alice, context_id="small", page_size=3, history_length=1)
    assert again[1:] == (statements, rows)
    # A larger historyLength is capped in lists: each task's latest messages of its context.
    capped, statements, rows = listed(alice, context_id="big", page_size=3, history_length=10**5)
    assert [len(t.history) for t in capped.tasks] == [cap] * 3
    expected = [f"{kind}{i}" for i in range(newest - cap // 2 + 1, newest + 1) for kind in "qa"]
    assert texts(capped.tasks[0]) == expected
    assert [m.task_id for m in capped.tasks[0].history][-2:] == [big[-1].id] * 2
    assert texts(capped.tasks[1]) == [
        f"{k}{i}" for i in range(newest - cap // 2, newest) for k in "qa"
    ]
    assert rows <= (3 + cap) * 2  # the messages of the tasks the page's histories reach
    again = listed(alice, context_id="small", page_size=3, history_length=10**5)
    assert again[1] == statements
    # GetTask is not capped: the context's messages up to the task, oldest first.
    middle = service.get_task(echo_call(alice), pb.GetTaskRequest(id=small[2].id))
    assert texts(middle) == ["q0", "a0", "q1", "a1", "q2", "a2"]
    assert [m.task_id for m in middle.history] == [t.id for t in small[:3] for _ in "qa"]
    latest = service.get_task(echo_call(alice), pb.GetTaskRequest(id=small[3].id, history_length=3))
    assert texts(latest) == ["a2", "q3", "a3"]
