# ruff: noqa: F811  (the fixtures imported from tests.a2a_support are parameters here)
"""A2A SendStreamingMessage, SubscribeToTask and push notifications (docs/a2a.md#streaming,
docs/a2a.md#push-notifications), with the real a2a-sdk client on both bindings."""

import threading

import httpx
import pytest
from a2a.types import a2a_pb2 as pb
from a2a.utils.errors import InvalidParamsError, TaskNotFoundError, UnsupportedOperationError
from django.db import transaction
from django.utils import timezone
from google.protobuf import json_format

from agenttasks import lifecycle, store
from agenttasks.a2a import push
from agenttasks.models import A2AContext, A2APushConfig, Delivery, Event, Slot, Task

from ..a2a_support import (  # noqa: F401  (fixtures)
    ALLOW_LOOPBACK,
    BINDINGS,
    State,
    alice,
    asgi_peer,
    cluster,
    peer,
    server,
    text_message,
    text_of,
)
from ..conftest import run_threads, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]


def kinds(events: list[pb.StreamResponse]) -> list[str]:
    return [e.WhichOneof("payload") for e in events]


def progress_of(events) -> list[str]:
    return [
        e.status_update.metadata["progress"]
        for e in events
        if e.HasField("status_update") and "progress" in e.status_update.metadata
    ]


def follow_in_thread(client):
    """Start a 60 s task and subscribe to it in a thread; return (task, thread, frames)."""
    task = client.send(text_message("hold"), immediately=True, metadata={"seconds": 60})
    followed: list = []
    thread = threading.Thread(target=lambda: followed.append(client.subscribe(task.id)))
    thread.start()
    wait_for(lambda: Slot.objects.filter(key__startswith="stream:").exists(), message="a stream")
    return task, thread, followed


@pytest.mark.parametrize("binding", BINDINGS)
def test_stream_a_slow_task(peer, cluster, binding):
    events = peer("slow", binding).stream(
        text_message("nap"), metadata={"seconds": 1.5, "steps": 3}
    )
    assert kinds(events)[0] == "task"
    first = events[0].task
    # The task as the stream first read it: still queued, or already claimed by a quick worker.
    assert first.status.state in (State.TASK_STATE_SUBMITTED, State.TASK_STATE_WORKING)
    updates = [e.status_update for e in events if e.HasField("status_update")]
    assert all(u.task_id == first.id and u.context_id == first.context_id for u in updates)
    working = [u for u in updates if u.status.state == State.TASK_STATE_WORKING]
    assert progress_of(events) == ["step 1/3 (sleep)", "step 2/3 (sleep)", "step 3/3 (sleep)"]
    assert [text_of(u.status.message.parts) for u in working if u.status.message.parts][-3:] == [
        "step 1/3 (sleep)",
        "step 2/3 (sleep)",
        "step 3/3 (sleep)",
    ]
    (artifact,) = [e.artifact_update for e in events if e.HasField("artifact_update")]
    assert text_of(artifact.artifact.parts) == "Slept 1.5s"
    assert kinds(events)[-1] == "status_update"
    assert updates[-1].status.state == State.TASK_STATE_COMPLETED


@pytest.mark.parametrize("binding", BINDINGS)
def test_subscribe_mid_run(peer, cluster, binding):
    client = peer("slow", binding)
    task = client.send(text_message("nap"), immediately=True, metadata={"seconds": 3, "steps": 2})
    wait_for(
        lambda: Task.objects.get(pk=task.id).status == "running",
        timeout=30,
        message="the task runs",
    )
    events = client.subscribe(task.id)
    assert kinds(events)[0] == "task"
    assert events[0].task.id == task.id
    assert events[0].task.status.state == State.TASK_STATE_WORKING
    assert events[-1].status_update.status.state == State.TASK_STATE_COMPLETED
    assert "artifact_update" in kinds(events)
    # A finished task has nothing to follow.
    with pytest.raises(UnsupportedOperationError):
        client.subscribe(task.id)


@pytest.mark.parametrize("binding", BINDINGS)
def test_stream_closes_at_input_required(peer, cluster, binding):
    client = peer("asker", binding)
    events = client.stream(text_message("report"))
    last = events[-1].status_update
    assert last.status.state == State.TASK_STATE_INPUT_REQUIRED
    assert text_of(last.status.message.parts) == "Which format?"
    # The answer streams too: from the task as the answer left it to its ending.
    answered = client.stream(text_message("HTML", task_id=last.task_id))
    assert kinds(answered)[0] == "task" and answered[0].task.id == last.task_id
    assert answered[0].task.status.state != State.TASK_STATE_INPUT_REQUIRED
    (artifact,) = [e.artifact_update for e in answered if e.HasField("artifact_update")]
    assert text_of(artifact.artifact.parts) == "format: HTML"
    assert answered[-1].status_update.status.state == State.TASK_STATE_COMPLETED


def push_config(receiver, task_id="", config_id="") -> pb.TaskPushNotificationConfig:
    return pb.TaskPushNotificationConfig(
        id=config_id,
        task_id=task_id,
        url=receiver.url,
        token="tok-1",
        authentication=pb.AuthenticationInfo(scheme="Bearer", credentials="s3cret"),
    )


@pytest.mark.parametrize("binding", BINDINGS)
def test_push_notification_of_the_terminal_update(peer, cluster, receiver, binding, settings):
    settings.AGENTTASKS = {**settings.AGENTTASKS, **ALLOW_LOOPBACK}
    client = peer("slow", binding)
    task = client.send(
        text_message("nap"),
        immediately=True,
        metadata={"seconds": 0.5},
        push=push_config(receiver),
    )
    request = wait_for(
        lambda: next(
            (
                r
                for r in receiver.requests
                if (r["json"] or {}).get("statusUpdate", {}).get("status", {}).get("state")
                == "TASK_STATE_COMPLETED"
            ),
            None,
        ),
        timeout=30,
        interval=0.1,
        message="the terminal push",
    )
    assert request["headers"]["Authorization"] == "Bearer s3cret"
    assert request["headers"]["X-A2A-Notification-Token"] == "tok-1"
    assert request["headers"]["Content-Type"] == "application/a2a+json"
    body = json_format.ParseDict(request["json"], pb.StreamResponse())
    assert body.status_update.task_id == task.id
    assert body.status_update.context_id == task.context_id
    conversation = Task.objects.get(pk=task.id).conversation_id
    delivered = wait_for(
        lambda: list(Event.objects.filter(conversation_id=conversation, type="callback.delivered")),
        message="the delivery recorded",
    )
    assert delivered[0].data["channel"] == "a2a" and delivered[0].data["httpStatus"] == 200


@pytest.mark.parametrize("binding", BINDINGS)
def test_push_config_create_get_list_delete(peer, cluster, receiver, binding, settings):
    client = peer("echo", binding)
    task = client.send(text_message("hi"), immediately=True)
    # Not allow-listed: the callbacks' SSRF guard refuses a loopback receiver.
    with pytest.raises(InvalidParamsError):
        client.create_config(push_config(receiver, task.id))
    settings.AGENTTASKS = {**settings.AGENTTASKS, **ALLOW_LOOPBACK}
    made = client.create_config(push_config(receiver, task.id, "mine"))
    assert (made.id, made.task_id, made.url) == ("mine", task.id, receiver.url)
    assert made.authentication.scheme == "Bearer" and not made.authentication.credentials
    other = client.create_config(push_config(receiver, task.id))
    assert other.id.startswith("pnc_")
    assert client.get_config(task.id, "mine").url == receiver.url
    listed = client.list_configs(task.id)
    assert sorted(c.id for c in listed.configs) == sorted(["mine", other.id])
    client.delete_config(task.id, "mine")
    with pytest.raises(TaskNotFoundError):
        client.get_config(task.id, "mine")
    assert [c.id for c in client.list_configs(task.id).configs] == [other.id]
    # Deleting the task's conversation (REST) takes its A2A rows with it.
    conversation = Task.objects.get(pk=task.id).conversation_id
    gone = httpx.delete(
        f"{client.server}/api/agents/conversations/{conversation}", headers=client.headers()
    )
    assert gone.status_code == 204
    assert not A2APushConfig.objects.exists() and not A2AContext.objects.exists()


def test_streams_under_asgi(asgi_peer, cluster):
    streamed = asgi_peer("slow", BINDINGS[0]).stream(
        text_message("nap"), metadata={"seconds": 1, "steps": 2}
    )
    assert progress_of(streamed) == ["step 1/2 (sleep)", "step 2/2 (sleep)"]
    assert streamed[-1].status_update.status.state == State.TASK_STATE_COMPLETED
    client = asgi_peer("slow", BINDINGS[1])
    task = client.send(text_message("nap"), immediately=True, metadata={"seconds": 3})
    followed = client.subscribe(task.id)
    assert kinds(followed)[0] == "task"
    assert followed[-1].status_update.status.state == State.TASK_STATE_COMPLETED


def test_push_delivery_is_retried_with_backoff_then_deduplicated(alice, receiver, settings):
    settings.AGENTTASKS = {**settings.AGENTTASKS, **ALLOW_LOOPBACK}
    task = lifecycle.create(owner=alice, agent_id="echo", input="x")
    config = A2APushConfig.objects.create(task=task, url=receiver.url, auth_scheme="Bearer")
    store.claim(task.run_id, "w")
    store.finalize(task.id, task.run_id, "completed", result="ok")
    version = Task.objects.get(pk=task.id).version
    pauses = []
    original = push.time.sleep
    push.time.sleep = pauses.append
    try:
        receiver.status = 503
        outcomes = push.deliver(config.pk, "completed", version)
        assert [o["attempt"] for o in outcomes] == [1, 2, 3]
        assert pauses == [1.0, 2.0] and len(receiver.requests) == 3
        # The same ending again (a job delivered twice) sends nothing.
        assert push.deliver(config.pk, "completed", version) == []
        receiver.status = 404  # a refusal that retrying cannot fix: one attempt
        config.delivered_version = 0
        config.save()
        # Owed again (a delivery is sent only while it is owed).
        Delivery.objects.create(
            task=task, config=config, status="completed", version=version, due_at=timezone.now()
        )
        assert len(push.deliver(config.pk, "completed", version)) == 1
    finally:
        push.time.sleep = original
    failed = Event.objects.filter(conversation_id=task.conversation_id, type="callback.failed")
    assert [e.data["httpStatus"] for e in failed.order_by("seq")] == [503, 503, 503, 404]
    assert receiver.requests[0]["headers"]["Authorization"] == "Bearer"


@pytest.mark.parametrize("binding", BINDINGS)
def test_open_streams_are_capped_before_anything_is_sent(peer, cluster, settings, binding):
    settings.AGENTTASKS = {**settings.AGENTTASKS, "MAX_STREAMS_PER_USER": 1}
    client = peer("slow", binding)
    task, thread, followed = follow_in_thread(client)
    with pytest.raises(Exception, match="429"):
        client.stream(text_message("more"))
    assert Task.objects.count() == 1  # the refused stream created nothing
    client.cancel(task.id)
    thread.join(30)
    assert followed[0][-1].status_update.status.state == State.TASK_STATE_CANCELED
    wait_for(lambda: not Slot.objects.exists(), message="the place given back")


@pytest.mark.parametrize("binding", BINDINGS)
def test_push_notification_of_input_required(peer, cluster, receiver, binding, settings):
    settings.AGENTTASKS = {**settings.AGENTTASKS, **ALLOW_LOOPBACK}
    client = peer("asker", binding)
    task = client.send(text_message("report"), immediately=True, push=push_config(receiver))

    def pushed():
        for request in receiver.requests:
            update = json_format.ParseDict(request["json"], pb.StreamResponse()).status_update
            if update.status.state == State.TASK_STATE_INPUT_REQUIRED:
                return update
        return None

    update = wait_for(pushed, timeout=30, interval=0.1, message="the input-required push")
    assert update.task_id == task.id
    assert text_of(update.status.message.parts) == "Which format?"
    (data,) = [p for p in update.status.message.parts if p.WhichOneof("content") == "data"]
    assert json_format.MessageToDict(data.data)["pendingActions"][0]["kind"] == "question"


@pytest.mark.parametrize("binding", BINDINGS)
def test_a_subscription_ends_when_its_conversation_is_deleted(peer, cluster, binding):
    task, thread, _ = follow_in_thread(peer("slow", binding))
    # What a DELETE does first; its rows then go, and with them the update that ends a stream.
    store.mark_deleting(Task.objects.get(pk=task.id).conversation_id)
    thread.join(15)
    assert not thread.is_alive(), "the subscription outlived its conversation's deletion"
    wait_for(lambda: not Slot.objects.exists(), message="the place given back")


@pytest.mark.parametrize("binding", BINDINGS)
def test_push_configs_per_task_are_capped(peer, cluster, receiver, binding, settings):
    settings.AGENTTASKS = {
        **settings.AGENTTASKS,
        **ALLOW_LOOPBACK,
        "MAX_PUSH_CONFIGS_PER_TASK": 2,
    }
    client = peer("echo", binding)
    task = client.send(text_message("hi"), immediately=True)
    client.create_config(push_config(receiver, task.id, "one"))
    client.create_config(push_config(receiver, task.id, "two"))
    with pytest.raises(InvalidParamsError, match="at most 2 push notification configs"):
        client.create_config(push_config(receiver, task.id, "three"))
    client.create_config(push_config(receiver, task.id, "two"))  # a replacement is no new one
    assert A2APushConfig.objects.filter(task_id=task.id).count() == 2


@pytest.mark.postgres
def test_the_push_config_cap_holds_under_concurrent_creates(alice, receiver, settings):
    settings.AGENTTASKS = {**settings.AGENTTASKS, "MAX_PUSH_CONFIGS_PER_TASK": 3}
    task = lifecycle.create(owner=alice, agent_id="echo", input="x")

    def create(i):
        with transaction.atomic():
            return push.store_config(task, push_config(receiver, task.id))

    results = run_threads(create, 8)
    assert sum(isinstance(r, A2APushConfig) for r in results) == 3, results
    assert all(isinstance(r, (A2APushConfig, InvalidParamsError)) for r in results), results
    assert A2APushConfig.objects.filter(task_id=task.id).count() == 3
