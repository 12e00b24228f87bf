"""The A2A tests' harness: the live server, a real django-q2 cluster, and the real a2a-sdk client.

`Peer(server_url, token)` speaks to one agent over one binding with the official client
(`a2a.client`), resolving the card first; each call runs its own event loop.
"""

import asyncio
import base64
import uuid

import httpx
import pytest
from a2a.client import A2ACardResolver, ClientConfig, ClientFactory
from a2a.types import a2a_pb2 as pb
from django.core.cache import cache
from django.db import connections
from google.protobuf import json_format
from google.protobuf.struct_pb2 import Value
from rest_framework.authtoken.models import Token

from .factories import UserFactory

JSONRPC = "JSONRPC"
HTTP_JSON = "HTTP+JSON"
BINDINGS = [JSONRPC, HTTP_JSON]
PREFIX = "/api/agents"
ALLOW_LOOPBACK = {"CALLBACK_ALLOWED_HOSTS": ["127.0.0.1"]}
State = pb.TaskState


def card_url(server: str, agent: str) -> str:
    return f"{server}{PREFIX}/a2a/{agent}"


def text_message(text: str = "", *, task_id="", context_id="", data=None, parts=()) -> pb.Message:
    message = pb.Message(
        role=pb.ROLE_USER, message_id=uuid.uuid4().hex, task_id=task_id, context_id=context_id
    )
    if text:
        message.parts.append(pb.Part(text=text))
    if data is not None:
        message.parts.append(pb.Part(data=json_format.ParseDict(data, Value())))
    message.parts.extend(parts)
    return message


class Peer:
    """One principal's a2a-sdk client for one agent and binding."""

    def __init__(self, server: str, token: str | None, agent: str, binding: str):
        self.server, self.token, self.agent, self.binding = server, token, agent, binding

    def headers(self) -> dict:
        return {"Authorization": f"Token {self.token}"} if self.token else {}

    def run(self, body, *, streaming=False, polling=False):
        """Run `await body(client)` with a fresh client (its own loop and connections)."""

        async def main():
            async with httpx.AsyncClient(headers=self.headers(), timeout=60) as http:
                card = await A2ACardResolver(
                    http, card_url(self.server, self.agent)
                ).get_agent_card()
                config = ClientConfig(
                    httpx_client=http,
                    supported_protocol_bindings=[self.binding],
                    streaming=streaming,
                    polling=polling,
                )
                client = ClientFactory(config).create(card)
                return await body(client)

        return asyncio.run(main())

    def card(self) -> pb.AgentCard:
        async def main():
            async with httpx.AsyncClient(timeout=30) as http:
                return await A2ACardResolver(
                    http, card_url(self.server, self.agent)
                ).get_agent_card()

        return asyncio.run(main())

    # --- operations ------------------------------------------------------------------------------

    def send(self, message: pb.Message, *, immediately=False, metadata=None, push=None) -> pb.Task:
        request = pb.SendMessageRequest(message=message)
        request.configuration.return_immediately = immediately
        if metadata:
            request.metadata.update(metadata)
        if push is not None:
            request.configuration.task_push_notification_config.CopyFrom(push)

        async def body(client):
            out = [r async for r in client.send_message(request)]
            assert len(out) == 1 and out[0].HasField("task"), out
            return out[0].task

        return self.run(body)

    def stream(self, message: pb.Message, *, metadata=None) -> list[pb.StreamResponse]:
        request = pb.SendMessageRequest(message=message)
        if metadata:
            request.metadata.update(metadata)

        async def body(client):
            return [r async for r in client.send_message(request)]

        return self.run(body, streaming=True)

    def subscribe(self, task_id: str) -> list[pb.StreamResponse]:
        async def body(client):
            return [r async for r in client.subscribe(pb.SubscribeToTaskRequest(id=task_id))]

        return self.run(body, streaming=True)

    def get(self, task_id: str, history_length=None) -> pb.Task:
        request = pb.GetTaskRequest(id=task_id)
        if history_length is not None:
            request.history_length = history_length
        return self.run(lambda client: client.get_task(request))

    def list(self, **fields) -> pb.ListTasksResponse:
        return self.run(lambda client: client.list_tasks(pb.ListTasksRequest(**fields)))

    def cancel(self, task_id: str) -> pb.Task:
        return self.run(lambda client: client.cancel_task(pb.CancelTaskRequest(id=task_id)))

    def create_config(self, config: pb.TaskPushNotificationConfig):
        return self.run(lambda client: client.create_task_push_notification_config(config))

    def get_config(self, task_id: str, config_id: str):
        request = pb.GetTaskPushNotificationConfigRequest(task_id=task_id, id=config_id)
        return self.run(lambda client: client.get_task_push_notification_config(request))

    def list_configs(self, task_id: str):
        request = pb.ListTaskPushNotificationConfigsRequest(task_id=task_id)
        return self.run(lambda client: client.list_task_push_notification_configs(request))

    def delete_config(self, task_id: str, config_id: str):
        request = pb.DeleteTaskPushNotificationConfigRequest(task_id=task_id, id=config_id)
        return self.run(lambda client: client.delete_task_push_notification_config(request))


def rpc(server, token, agent, method, params):
    """One JSON-RPC call over raw HTTP; the parsed response."""
    response = httpx.post(
        card_url(server, agent) + "/",
        json={"jsonrpc": "2.0", "id": 7, "method": method, "params": params},
        headers={"Authorization": f"Token {token}", "A2A-Version": "1.0"},
    )
    assert response.status_code == 200, response.text
    return response.json()


def rest_call(server, token, agent, method, path, body=None):
    """One HTTP+JSON call over raw HTTP (`path` under `rest`, as sent); the response."""
    return httpx.request(
        method,
        card_url(server, agent) + "/rest" + path,
        json=body,
        headers={"Authorization": f"Token {token}", "A2A-Version": "1.0"},
    )


def rest_reason(response) -> str:
    """The ErrorInfo reason of an HTTP+JSON error."""
    return (response.json()["error"].get("details") or [{}])[0].get("reason", "")


def message_json(text, **fields) -> dict:
    """A Message as JSON, with one text part."""
    return {
        "messageId": base64.b16encode(text.encode()).decode() or "empty",
        "role": "ROLE_USER",
        "parts": [{"text": text}],
        **fields,
    }


def text_of(parts) -> str:
    return "".join(p.text for p in parts if p.WhichOneof("content") == "text")


def data_of(parts) -> list:
    return [json_format.MessageToDict(p.data) for p in parts if p.WhichOneof("content") == "data"]


# --- fixtures ----------------------------------------------------------------------------------


@pytest.fixture
def server(live_server):
    """The live server (WSGI, a thread per request); server threads close their connections."""
    settings_dict = connections.settings["default"]
    previous = settings_dict.get("CONN_MAX_AGE", 0)
    settings_dict["CONN_MAX_AGE"] = 0
    cache.clear()
    yield live_server.url
    settings_dict["CONN_MAX_AGE"] = previous
    cache.clear()


@pytest.fixture
def cluster(shared_cluster):
    """A real django-q2 cluster on the test database (loopback push receivers allowed), shared by
    the module's tests."""
    return shared_cluster(workers=2, **ALLOW_LOOPBACK)


@pytest.fixture
def alice(transactional_db):
    user = UserFactory(username="alice")
    user.token = Token.objects.create(user=user).key
    return user


@pytest.fixture
def bob(transactional_db):
    user = UserFactory(username="bob")
    user.token = Token.objects.create(user=user).key
    return user


@pytest.fixture
def peer(server, alice):
    """peer(agent, binding, user=alice) -> Peer."""

    def make(agent: str, binding: str, user=alice) -> Peer:
        return Peer(server, getattr(user, "token", None), agent, binding)

    return make


@pytest.fixture
def asgi_peer(transactional_db, alice):
    """peer(agent, binding) against the app served by uvicorn (ASGI) on loopback."""
    from .conftest import served_asgi

    with served_asgi() as url:
        yield lambda agent, binding: Peer(url, alice.token, agent, binding)
