# ruff: noqa: F811  (the fixtures imported from tests.mcp_support are parameters here)
"""Bad input over MCP gets a protocol error and writes nothing, never a 500 (docs/mcp.md#errors):
raw HTTP against a live server (no cluster: nothing may start), and the real client."""

import pytest

from agenttasks.models import Conversation, Task

from ..mcp_support import (  # noqa: F401  (fixtures)
    MODERN,
    MODES,
    alice,
    bob,
    host,
    modern_headers,
    modern_params,
    post,
    refusal,
    server,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS = -32700, -32600, -32601, -32602
HEADER_MISMATCH, UNSUPPORTED_VERSION = -32020, -32022


def session_of(server, token) -> dict:
    """The headers of a fresh 2025-11-25 session (initialize)."""
    params = {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "raw", "version": "1"},
    }
    opened = post(
        server, {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": params}, token=token
    )
    assert opened.status_code == 200, opened.text
    return {
        "Mcp-Session-Id": opened.headers["Mcp-Session-Id"],
        "MCP-Protocol-Version": "2025-11-25",
    }


def call(name, arguments, *, modern=False, request_id=1):
    params = {"name": name, "arguments": arguments}
    return {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": "tools/call",
        "params": modern_params(**params) if modern else params,
    }


def refused(response, status: int, code: int) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["Content-Type"].startswith("application/json")
    error = response.json()["error"]
    assert error["code"] == code, error
    return error


def test_malformed_messages_unknown_methods_and_tools_on_2025_11_25(server, alice, settings):
    token = alice.token
    session = session_of(server, token)
    raw = lambda content, **kw: post(server, None, token=token, content=content, headers=session)  # noqa: E731
    refused(raw("{nope"), 400, PARSE_ERROR)
    refused(raw("[]"), 400, INVALID_REQUEST)
    refused(raw('[{"jsonrpc": "2.0", "id": 1, "method": "ping"}]'), 400, INVALID_REQUEST)
    refused(raw('{"jsonrpc": "1.0", "id": 1, "method": "ping"}'), 400, INVALID_REQUEST)
    refused(raw('{"jsonrpc": "2.0", "id": true, "method": "ping"}'), 400, INVALID_REQUEST)
    refused(
        raw('{"jsonrpc": "2.0", "id": 1, "method": "ping", "params": [1]}'), 400, INVALID_REQUEST
    )
    refused(raw('{"jsonrpc": "2.0", "id": 1}'), 400, INVALID_REQUEST)
    assert (
        refused(raw('{"jsonrpc": "2.0", "id": 1, "method": "nope"}'), 404, METHOD_NOT_FOUND)[
            "message"
        ]
        == "Method not found: nope"
    )
    refused(raw('{"jsonrpc": "2.0", "id": 1, "method": "resources/list"}'), 404, METHOD_NOT_FOUND)
    refused(raw('{"jsonrpc": "2.0", "id": 1, "method": "server/discover"}'), 404, METHOD_NOT_FOUND)
    ok = post(server, {"jsonrpc": "2.0", "id": 2, "method": "ping"}, token=token, headers=session)
    assert ok.status_code == 200 and ok.json() == {"jsonrpc": "2.0", "id": 2, "result": {}}

    def tool(name, arguments):
        return post(server, call(name, arguments), token=token, headers=session)

    assert refused(tool("nope", {}), 400, INVALID_PARAMS)["message"] == "Unknown tool: nope"
    assert refused(tool("internal", {"input": "x"}), 400, INVALID_PARAMS)["message"] == (
        "Unknown tool: internal"
    )
    assert (
        refused(tool("task_status", {"task_id": "", "wait_seconds": "soon"}), 400, INVALID_PARAMS)[
            "message"
        ]
        == "task_status: invalid arguments: property 'wait_seconds' must be an integer"
    )
    assert (
        refused(tool("spawn_task", {"agent_name": "echo", "input": "x"}), 400, INVALID_PARAMS)[
            "message"
        ]
        == "spawn_task: invalid arguments: property 'label' is required"
    )
    assert (
        refused(
            tool("task_stop", {"task_id": "t", "graceful": False, "x": 1}), 400, INVALID_PARAMS
        )["message"]
        == "task_stop: invalid arguments: unknown property 'x'"
    )
    assert (
        refused(tool("echo", {"input": "x", "metadata": "m"}), 400, INVALID_PARAMS)["message"]
        == "echo: invalid arguments: property 'metadata' must be an object"
    )
    assert (
        refused(tool("echo", {"input": " "}), 400, INVALID_PARAMS)["message"] == "input is required"
    )
    assert refused(tool("echo", {"input": "a\x00b"}), 400, INVALID_PARAMS)["message"] == (
        "input must not contain NUL characters or unpaired surrogates"
    )
    wrong = post(
        server,
        {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": 5}},
        token=token,
        headers=session,
    )
    refused(wrong, 400, INVALID_PARAMS)
    assert (
        refused(
            post(
                server,
                None,
                token=token,
                content="{}",
                headers={**session, "Content-Type": "text/plain"},
            ),
            415,
            INVALID_REQUEST,
        )["message"]
        == 'Unsupported media type "text/plain" in request.'
    )
    settings.AGENTTASKS = {**settings.AGENTTASKS, "MAX_REQUEST_BYTES": 1000}
    big = call("echo", {"input": "x" * 2000})
    assert (
        refused(post(server, big, token=token, headers=session), 400, INVALID_REQUEST)["message"]
        == "The request body is larger than 1000 bytes"
    )
    assert not Task.objects.exists() and not Conversation.objects.exists()


def test_sessions_are_checked(server, alice, bob):
    ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    missing = post(server, ping, token=alice.token, headers={"MCP-Protocol-Version": "2025-11-25"})
    assert refused(missing, 400, INVALID_REQUEST)["message"] == "Bad Request: Missing session ID"
    forged = post(server, ping, token=alice.token, headers={"Mcp-Session-Id": "forged"})
    assert refused(forged, 404, INVALID_REQUEST)["message"] == "Session not found"
    theirs = post(server, ping, token=bob.token, headers=session_of(server, alice.token))
    assert refused(theirs, 404, INVALID_REQUEST)["message"] == "Session not found"


def test_an_initialize_inside_a_session_is_refused_and_opens_none(server, alice):
    session = session_of(server, alice.token)
    params = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "x"}}
    again = {"jsonrpc": "2.0", "id": 2, "method": "initialize", "params": params}
    answer = post(server, again, token=alice.token, headers=session)
    error = refused(answer, 400, INVALID_REQUEST)
    assert error["message"] == "This session is initialized already"
    assert "Mcp-Session-Id" not in answer.headers
    ping = {"jsonrpc": "2.0", "id": 3, "method": "ping"}
    assert post(server, ping, token=alice.token, headers=session).status_code == 200


def test_malformed_requests_on_2026_07_28(server, alice):
    token = alice.token
    headers = modern_headers("tools/call", "echo")

    def raw(body, headers=headers):
        return post(server, body, token=token, headers=headers)

    bare = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "echo"}}
    assert "_meta" in refused(raw(bare), 400, INVALID_PARAMS)["message"]
    mismatch = modern_headers("tools/call", "other")
    refused(raw(call("echo", {"input": "x"}, modern=True), mismatch), 400, HEADER_MISMATCH)
    other_method = modern_headers("tools/list")
    refused(raw(call("echo", {"input": "x"}, modern=True), other_method), 400, HEADER_MISMATCH)
    future = {**headers, "MCP-Protocol-Version": "2099-01-01"}
    error = refused(raw(call("echo", {"input": "x"}, modern=True), future), 400, HEADER_MISMATCH)
    assert "MCP-Protocol-Version" in error["message"]
    body = call("echo", {"input": "x"}, modern=True)
    body["params"]["_meta"]["io.modelcontextprotocol/protocolVersion"] = "2099-01-01"
    error = refused(raw(body, future), 400, UNSUPPORTED_VERSION)
    assert error["data"]["supported"][0] == MODERN and "2025-11-25" in error["data"]["supported"]
    ping = {"jsonrpc": "2.0", "id": 1, "method": "ping", "params": modern_params()}
    refused(raw(ping, modern_headers("ping")), 404, METHOD_NOT_FOUND)
    wrong = call("task_status", {"task_id": 7, "wait_seconds": 0}, modern=True)
    refused(raw(wrong, modern_headers("tools/call", "task_status")), 400, INVALID_PARAMS)
    note = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 1}}
    assert raw(note, {"MCP-Protocol-Version": MODERN}).status_code == 202
    assert not Task.objects.exists() and not Conversation.objects.exists()


@pytest.mark.parametrize("mode", MODES)
def test_the_client_sees_wrong_argument_types_as_protocol_errors(host, mode):
    error = refusal(lambda: host(mode).call("task_status", {"task_id": "", "wait_seconds": "soon"}))
    assert error.error.code == INVALID_PARAMS
    assert "wait_seconds" in error.error.message
    unknown = refusal(lambda: host(mode).call("nope", {}))
    assert (unknown.error.code, unknown.error.message) == (INVALID_PARAMS, "Unknown tool: nope")


def test_the_read_and_write_throttles_apply(server, alice, settings):
    settings.AGENTTASKS = {**settings.AGENTTASKS, "THROTTLE_RATES": {"write": "2/min"}}
    session = session_of(server, alice.token)
    spawn = call("spawn_task", {"agent_name": "echo", "input": "x", "label": ""})
    for _ in range(2):
        assert post(server, spawn, token=alice.token, headers=session).status_code == 200
    throttled = post(server, spawn, token=alice.token, headers=session)
    error = refused(throttled, 429, INVALID_REQUEST)
    assert error["message"].startswith("Request was throttled; try again in ")
    assert error["data"]["code"] == "rate_limited" and error["data"]["retryAfter"] >= 1
    assert throttled.headers["Retry-After"] == str(error["data"]["retryAfter"])
    listing = call("task_status", {"task_id": "", "wait_seconds": 0})
    assert post(server, listing, token=alice.token, headers=session).status_code == 200  # a read
    assert Task.objects.count() == 2


def test_a_call_is_refused_a_place_before_it_starts_anything(server, alice, settings):
    import threading

    from agenttasks.models import Slot

    from ..conftest import wait_for

    settings.AGENTTASKS = {
        **settings.AGENTTASKS,
        "MAX_STREAMS_PER_USER": 1,
        "MCP_CALL_TIMEOUT": 5,
    }
    session = session_of(server, alice.token)
    held = []
    first = threading.Thread(
        target=lambda: held.append(
            post(server, call("echo", {"input": "one"}), token=alice.token, headers=session)
        )
    )
    first.start()  # no worker runs it: the call holds its stream until MCP_CALL_TIMEOUT
    wait_for(lambda: Slot.objects.filter(key__startswith="stream:").exists(), message="a place")
    second = post(
        server, call("echo", {"input": "two"}, request_id=2), token=alice.token, headers=session
    )
    error = refused(second, 429, INVALID_REQUEST)
    assert error["message"] == "You already have 1 open event streams; close one and try again"
    assert Task.objects.count() == 1
    first.join(30)
    assert held[0].headers["Content-Type"].startswith("text/event-stream")
    assert '"status":"pending"' in held[0].text and "MCP_CALL_TIMEOUT" in held[0].text
    assert not Slot.objects.exists()


def test_an_agent_call_checks_its_priority_and_start_as_rest_does(server, alice):
    token = alice.token
    session = session_of(server, token)

    def tool(arguments):
        return post(server, call("echo", arguments), token=token, headers=session)

    assert refused(tool({"input": "x", "priority": 500}), 400, INVALID_PARAMS)["message"] == (
        "priority must be an integer from -100 to 100"
    )
    refusal = refused(tool({"input": "x", "notBefore": "soon"}), 400, INVALID_PARAMS)
    assert refusal["message"].startswith("notBefore must be an ISO 8601 date and time")
    assert not Task.objects.filter(owner=alice).exists()


def test_every_answer_allows_get_and_post_only(server, alice):
    import httpx

    from ..mcp_support import endpoint

    anonymous = httpx.delete(endpoint(server), timeout=30)
    assert anonymous.status_code == 401 and anonymous.headers["Allow"] == "GET, POST"
    deleted = httpx.delete(
        endpoint(server), headers={"Authorization": f"Token {alice.token}"}, timeout=30
    )
    error = refused(deleted, 405, INVALID_REQUEST)
    assert (
        error["message"] == "Sessions are not ended: their conversation and its tasks outlive them"
    )
    assert deleted.headers["Allow"] == "GET, POST"
    listed = post(server, {"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
    assert listed.status_code == 401 and listed.headers["Allow"] == "GET, POST"
