"""Request bodies that parse but are hostile: deep nesting, long non-ASCII file names, no type."""

import json

import pytest

from agenttasks.models import Comment, Conversation, Event, File, Task

from .conftest import agenttasks, b64, error

pytestmark = pytest.mark.django_db(transaction=True)


def nested(depth: int) -> str:
    """A JSON value made of `depth` nested objects (depth 1 is `{"a": 1}`)."""
    return '{"a":' * depth + "1" + "}" * depth


def body_with_metadata(fields: dict, depth: int) -> str:
    """`fields` plus a `metadata` object nested `depth` levels (the body itself is one more)."""
    return json.dumps(fields)[:-1] + ("," if fields else "") + f'"metadata":{nested(depth)}' + "}"


def rows() -> tuple:
    return (
        Task.objects.count(),
        Conversation.objects.count(),
        Comment.objects.count(),
        Event.objects.count(),
        File.objects.count(),
    )


@pytest.fixture
def targets(as_alice):
    """Every write endpoint that takes metadata (or answers), as (method, path, fields)."""
    task = as_alice.create("echo", "hello")  # no workers: it stays pending
    conversation = as_alice.post("/conversations", {"agentId": "echo"}).json()["conversation"]
    return [
        ("POST", "/tasks", {"agentId": "echo", "input": "x"}),
        ("POST", "/conversations", {"agentId": "echo"}),
        ("PATCH", f"/conversations/{conversation['id']}", {}),
        ("POST", f"/tasks/{task['id']}/comments", {"content": "more"}),
        ("POST", f"/conversations/{conversation['id']}/messages", {"message": "hi"}),
    ]


MALFORMED = "Malformed JSON body"
TOO_DEEP = "The request body must not be nested more than 32 levels deep"


def deepest_parsed(api, method, path, body) -> int:
    """The deepest `body(depth)` this server's JSON parser still parses (binary search)."""
    parsed, refused = 31, 20_000
    while refused - parsed > 1:
        depth = (parsed + refused) // 2
        response = api.request(method, path, raw=body(depth))
        assert response.status_code != 500, (path, depth)
        if response.status_code == 400 and response.json()["error"]["message"] == MALFORMED:
            refused = depth
        else:
            parsed = depth
    return parsed


def test_deeply_nested_metadata_is_a_validation_error(as_alice, targets):
    """Right below what the parser can nest, nothing else recursing may run out of stack."""
    before = rows()
    for method, path, fields in targets:
        deepest = deepest_parsed(
            as_alice, method, path, lambda depth, fields=fields: body_with_metadata(fields, depth)
        )
        for depth in range(deepest - 12, deepest + 1):
            response = as_alice.request(method, path, raw=body_with_metadata(fields, depth))
            error(response, 400, "VALIDATION_ERROR", TOO_DEEP)
        response = as_alice.request(method, path, raw=body_with_metadata(fields, 5000))
        error(response, 400, "VALIDATION_ERROR", MALFORMED)
    assert rows() == before


def test_nesting_depth_limit_and_its_setting(as_alice, targets):
    message = TOO_DEEP
    for method, path, fields in targets:
        # The body is level 1, so metadata may nest 31 levels (the pending task's comment is
        # then refused only for the task's state).
        response = as_alice.request(method, path, raw=body_with_metadata(fields, 31))
        assert response.status_code in (200, 201, 202, 409), (path, response.content)
        response = as_alice.request(method, path, raw=body_with_metadata(fields, 32))
        found = error(response, 400, "VALIDATION_ERROR", message)
        assert found["details"] == {"fields": {"metadata": [message]}}
    # Lists count as levels too, and the limit is a setting.
    deep_list = '{"agentId": "echo", "input": "x", "files": ' + "[" * 5 + "]" * 5 + "}"
    with agenttasks(MAX_JSON_DEPTH=5):
        found = error(as_alice.post("/tasks", raw=deep_list), 400, "VALIDATION_ERROR")
        assert found["details"] == {"fields": {"files": [found["message"]]}}
    with agenttasks(MAX_JSON_DEPTH=6):
        error(
            as_alice.post("/tasks", raw=deep_list),
            400,
            "VALIDATION_ERROR",
            "files[0] must be an object",
        )


def test_deep_answers_are_a_validation_error(as_alice, workers):
    task = as_alice.create("asker", "go")
    as_alice.wait_status(task["id"], "waiting_for_input")
    action = as_alice.task(task["id"])["pendingActions"][0]
    path = f"/conversations/{task['conversationId']}/actions/{action['id']}"

    def body(depth):
        return '{"answers": {"q1": ' + nested(depth - 2) + "}}"

    deepest = deepest_parsed(as_alice, "POST", path, body)
    for depth in range(deepest - 12, deepest + 1):
        error(as_alice.post(path, raw=body(depth)), 400, "VALIDATION_ERROR", TOO_DEEP)
    assert as_alice.task(task["id"])["task"]["status"] == "waiting_for_input"


# --- file names ------------------------------------------------------------------------------


def cjk_file(length: int = 100, suffix: str = ".txt") -> dict:
    return {"name": "文" * length + suffix, "content": b64(b"abc"), "mimeType": "text/plain"}


@pytest.mark.parametrize("length", [100, 251])
def test_long_non_ascii_file_names_are_stored(as_alice, length):
    upload = cjk_file(length)
    task = as_alice.create("docs", "read", files=[upload])
    (ref,) = task["files"]
    assert ref["name"] == upload["name"]  # the display name is kept whole
    row = File.objects.get(pk=ref["id"])
    stored = row.storage_name.rsplit("/", 1)[1]
    assert len(stored.encode()) <= 100 and stored.endswith(".txt") and stored.startswith("文")
    content = as_alice.get(f"/files/{ref['id']}/content")
    assert b"".join(content.streaming_content) == b"abc"

    conversation = as_alice.post("/conversations", {"agentId": "docs"}).json()["conversation"]
    response = as_alice.post(
        f"/conversations/{conversation['id']}/messages",
        {"message": "read", "files": [cjk_file(length, ".pdf")]},
    )
    assert response.status_code == 202, response.content


def test_a_name_of_255_characters_is_the_longest(as_alice):
    name = "é" * 251 + ".txt"
    task = as_alice.create("echo", "x", files=[{**cjk_file(), "name": name}])
    assert task["files"][0]["name"] == name
    response = as_alice.post(
        "/tasks", {"agentId": "echo", "input": "x", "files": [{**cjk_file(), "name": "é" + name}]}
    )
    error(response, 400, "VALIDATION_ERROR", "files[0].name must be at most 255 characters")


# --- text that cannot be encoded -------------------------------------------------------------


def test_a_lone_surrogate_in_a_refused_key_is_answered(as_alice, workers):
    """An error that names the client's own text (a key) still renders: U+FFFD stands in."""
    raw = '{"agentId": "echo", "input": "x", "\\ud800k": ' + nested(40) + "}"
    found = error(as_alice.post("/tasks", raw=raw), 400, "VALIDATION_ERROR", TOO_DEEP)
    assert found["details"] == {"fields": {"\ufffdk": [TOO_DEEP]}}

    task = as_alice.create("asker", "go")
    as_alice.wait_status(task["id"], "waiting_for_input")
    action = as_alice.task(task["id"])["pendingActions"][0]
    path = f"/conversations/{task['conversationId']}/actions/{action['id']}"
    found = error(
        as_alice.post(path, raw='{"answers": {"q\\udfff": "PDF"}}'), 400, "VALIDATION_ERROR"
    )
    assert found["message"] == "answers.q\ufffd: unknown question"


# --- no content type -------------------------------------------------------------------------


def test_runserver_reads_a_body_without_a_content_type(server_process, as_alice):
    """wsgiref declares text/plain for a request without a type; the demo's runserver does not."""
    import http.client

    server = server_process()
    body = json.dumps({"agentId": "echo", "input": "untyped"}).encode()
    statuses = []
    for content_type in (None, "text/plain"):
        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        headers = {"Authorization": as_alice.headers["HTTP_AUTHORIZATION"]}
        if content_type:
            headers["Content-Type"] = content_type
        connection.request("POST", "/api/agents/tasks", body=body, headers=headers)  # no type added
        statuses.append(connection.getresponse().status)
        connection.close()
    assert statuses == [201, 415]  # a declared text/plain is still refused
    assert Task.objects.filter(input="untyped").count() == 1


@pytest.mark.parametrize(
    "raw",
    [
        '{"agentId": "echo", "input": "hi"}'.encode("utf-16"),
        '{"agentId": "echo", "input": "hi"}'.encode("utf-16-le"),
        '{"agentId": "echo", "input": "hi"}'.encode("utf-32"),
        '{"agentId": "echo", "input": "hi"}'.encode("utf-8-sig"),
        b'{"agentId": "echo", "input": "h\xff\xfei"}',
    ],
    ids=["utf-16", "utf-16-le", "utf-32", "utf-8-bom", "invalid-utf-8"],
)
def test_a_body_that_is_not_utf_8_is_malformed_and_writes_nothing(as_alice, raw):
    before = rows()
    response = as_alice.post("/tasks", raw=raw, content_type="application/json")
    error(response, 400, "VALIDATION_ERROR", "Malformed JSON body")
    assert rows() == before
