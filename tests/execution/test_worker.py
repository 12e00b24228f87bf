"""Runs on a real django-q2 cluster: every way a run can end, ends correctly."""

import time

import pytest
from django.test.utils import override_settings

from agenttasks import lifecycle, store
from agenttasks.broker import queue
from agenttasks.models import Conversation, Event, PendingAction, Run, Task, Wakeup
from agenttasks.types import NewTask

from ..conftest import wait_for
from ..factories import ConversationFactory

pytestmark = pytest.mark.django_db(transaction=True)

ORPHAN = "The server stopped while the task was running"


def settled(task_id, statuses=("completed", "failed", "cancelled"), timeout=20):
    return wait_for(
        lambda: (t := Task.objects.select_related("run").get(pk=task_id)).status in statuses and t,
        timeout=timeout,
        message=f"task {task_id} in {statuses}",
    )


def create(user, agent, text="hello", **kw):
    return lifecycle.create(owner=user, agent_id=agent, input=text, **kw)


def test_echo_completes(start_cluster, user):
    start_cluster()
    task = create(user, "echo")
    done = settled(task.id)
    assert (
        done.status == "completed"
        and done.result == "Echo: hello"
        and done.summary == "Echo: hello"
    )
    assert done.task_result.usage == {"inputTokens": 1, "outputTokens": 2, "totalTokens": 3}
    types = list(done.conversation.events.order_by("seq").values_list("type", flat=True))
    assert types == [
        "message.user",
        "task.status",
        "run.started",
        "task.status",
        "message.assistant",
        "run.finished",
        "task.status",
    ]


def test_boom_fails_with_its_message(start_cluster, user):
    start_cluster()
    done = settled(create(user, "boom").id)
    assert (done.status, done.error, done.summary) == ("failed", "kaboom", "kaboom")
    assert done.run.status == "failed" and done.run.error == "kaboom"


def test_flaky_fails_then_completes_after_retry(start_cluster, user):
    start_cluster()
    task = create(user, "flaky")
    assert settled(task.id).error == "rate limited"
    info = lifecycle.retry(task.id)
    assert info.attempt == 2
    done = settled(task.id)
    assert (done.status, done.result, done.attempt) == ("completed", "Recovered on attempt 2", 2)
    assert list(
        Run.objects.filter(task=task).order_by("created_at").values_list("trigger", flat=True)
    ) == [
        "initial",
        "retry",
    ]


def test_clarify_pauses_and_resumes_on_a_comment(start_cluster, user):
    start_cluster()
    task = create(user, "clarify")
    waiting = settled(task.id, ("waiting_for_input",))
    assert waiting.task_result.partial and waiting.task_result.content == "Which format?"
    assert waiting.comments.get().role == "agent"
    lifecycle.comment(task.id, "PDF", author=user)
    done = settled(task.id)
    assert (done.status, done.result) == ("completed", "Done in PDF")


@pytest.mark.parametrize("approved, reply", [(True, "deployed to prod"), (False, "not deployed")])
def test_approver_approved_and_denied(start_cluster, user, approved, reply):
    start_cluster()
    task = create(user, "approver", "prod")
    settled(task.id, ("waiting_for_input",))
    action = PendingAction.objects.get(task=task)
    assert (action.kind, action.tool_name, action.args) == ("approval", "deploy", {"env": "prod"})
    assert lifecycle.resolve_action(action.id, {"approved": approved}, decided_by=user)
    done = settled(task.id)
    assert (done.status, done.result) == ("completed", reply)
    # The resumed run is the same run: one run.started, one run in all.
    assert Run.objects.filter(task=task).count() == 1
    assert done.conversation.events.filter(type="run.started").count() == 1


def test_asker_answered(start_cluster, user):
    start_cluster()
    task = create(user, "asker")
    settled(task.id, ("waiting_for_input",))
    action = PendingAction.objects.get(task=task)
    assert action.questions[0]["options"] == [
        {"label": "PDF", "value": "PDF"},
        {"label": "HTML", "value": "HTML"},
    ]
    lifecycle.resolve_action(action.id, {"answers": {"q1": {"values": ["HTML"]}}})
    assert settled(task.id).result == "format: HTML"


def test_slow_task_stopped_immediately(start_cluster, user, tmp_path):
    start_cluster(HEARTBEAT_INTERVAL=1)
    task = create(user, "gate", metadata={"gate": str(tmp_path / "never")})
    settled(task.id, ("running",))
    info = lifecycle.stop(task.id)
    assert info.status == "cancelled"
    run = wait_for(
        lambda: (r := Run.objects.get(pk=task.run_id)).ended_at and r,
        message="the worker observed the stop",
    )
    assert run.status == "cancelled"
    done = Task.objects.get(pk=task.id)
    assert (done.status, done.summary) == ("cancelled", "stopped")
    assert not hasattr(done, "task_result") or done.task_result is None


def test_slow_task_stopped_gracefully(start_cluster, user, tmp_path):
    start_cluster(HEARTBEAT_INTERVAL=1)
    gate = tmp_path / "gate"
    task = create(user, "gate", metadata={"gate": str(gate)})
    settled(task.id, ("running",))
    info = lifecycle.stop(task.id, graceful=True)
    assert info.status == "running"
    assert Run.objects.get(pk=task.run_id).stop_request == "after_turn"
    gate.touch()
    done = settled(task.id)
    assert (done.status, done.result) == ("cancelled", "released")
    assert done.task_result.content == "released"


def test_a_queued_run_cancelled_before_it_starts_never_runs(start_cluster, user, tmp_path):
    log = tmp_path / "runs.log"
    with queue.use_backend(queue.RecordingQueue()):
        task = create(user, "counter", metadata={"log": str(log)})
    lifecycle.stop(task.id)
    start_cluster()
    queue.enqueue_run(task.run_id)  # the broker delivers it anyway
    wait_for(lambda: Run.objects.get(pk=task.run_id).status == "cancelled")
    marker = create(user, "echo")  # a later job proves the cluster went past it
    settled(marker.id)
    assert not log.exists()
    assert Task.objects.get(pk=task.id).status == "cancelled"


def test_duplicate_delivery_executes_once(start_cluster, user, tmp_path):
    log = tmp_path / "runs.log"
    start_cluster()
    task = create(user, "counter", metadata={"log": str(log)})
    queue.enqueue_run(task.run_id)
    queue.enqueue_run(task.run_id)
    settled(task.id)
    marker = create(user, "echo")
    settled(marker.id)
    assert log.read_text().splitlines() == [task.run_id]


@override_settings(AGENTTASKS={"MAX_ACTIVE_TASKS_PER_USER": 0})
def test_throughput_smoke(start_cluster, user):
    start_cluster(workers=2)
    ids = [create(user, "echo", f"m{i}").id for i in range(200)]
    wait_for(
        lambda: Task.objects.filter(pk__in=ids, status="completed").count() == 200,
        timeout=120,
        message="200 echo tasks completed",
    )
    assert Run.objects.filter(task_id__in=ids).count() == 200
    assert Event.objects.filter(task_id__in=ids, type="run.started").count() == 200
    assert (
        Event.objects.filter(task_id__in=ids, type="task.status", data__to="completed").count()
        == 200
    )


def test_kill_minus_nine_recovers(start_cluster, user, tmp_path, receiver):
    settings = {
        "LEASE_TIMEOUT": 3,
        "HEARTBEAT_INTERVAL": 1,
        "REAP_INTERVAL": 1,
        "CALLBACK_ALLOWED_HOSTS": ["127.0.0.1"],
    }
    cluster = start_cluster(**settings)
    gate = tmp_path / "gate"
    with override_settings(AGENTTASKS={"CALLBACK_ALLOWED_HOSTS": ["127.0.0.1"]}):
        rest_task = create(user, "gate", callback_url=receiver.url, metadata={"gate": str(gate)})
    parent = ConversationFactory(owner=user, agent="echo")
    spawned = store.create_task(
        NewTask(
            parent_conversation_id=parent.pk,
            owner=user,
            agent="gate",
            input="held",
            metadata={"gate": str(gate)},
        )
    )
    queue.enqueue_run(spawned.run_id)
    settled(rest_task.id, ("running",))
    settled(spawned.id, ("running",))
    cluster.kill()
    killed_at = time.monotonic()
    start_cluster(**settings)
    for task_id in (rest_task.id, spawned.id):
        failed = settled(task_id, ("failed",), timeout=30)
        assert failed.error == ORPHAN and failed.run.status == "failed"
    recovery = time.monotonic() - killed_at
    print(f"recovery after kill -9: {recovery:.2f}s")
    assert recovery < 3 + 1 + 5  # LEASE_TIMEOUT + one reaper interval + cluster start-up
    wait_for(lambda: len(receiver.requests) >= 1, message="the failed callback")
    # The parent is told once: one delivered notification naming the task.
    wait_for(
        lambda: Wakeup.objects.filter(task=spawned, state="delivered").count() == 1,
        message="delivery",
    )
    notes = Event.objects.filter(conversation=parent, type="task.notification")
    assert notes.count() == 1 and spawned.id in notes.get().data["content"]
    gate.touch()
    lifecycle.retry(rest_task.id)
    assert settled(rest_task.id).status == "completed"
    wait_for(lambda: len(receiver.requests) >= 2, message="the completed callback")
    bodies = receiver.bodies()
    assert [b["status"] for b in bodies] == ["failed", "completed"]
    assert bodies[0]["error"] == ORPHAN


@override_settings(AGENTTASKS={"DEFAULT_HITL": {"timeout_minutes": 0.01, "on_timeout": "deny"}})
def test_approval_timeout_deny(start_cluster, user):
    start_cluster(REAP_INTERVAL=1, DEFAULT_HITL={"timeout_minutes": 0.01, "on_timeout": "deny"})
    task = create(user, "approver", "prod")
    done = settled(task.id, timeout=30)
    assert (done.status, done.result) == ("completed", "not deployed")
    assert PendingAction.objects.get(task=task).status == "expired"


def test_approval_timeout_cancel(start_cluster, user):
    start_cluster(REAP_INTERVAL=1, DEFAULT_HITL={"timeout_minutes": 0.01, "on_timeout": "cancel"})
    task = create(user, "strict-approver", "prod")
    done = settled(task.id, timeout=30)
    assert (done.status, done.summary) == ("cancelled", "timed out waiting for input")
    assert PendingAction.objects.get(task=task).status == "expired"
    assert (
        Conversation.objects.get(pk=task.conversation_id)
        .events.filter(type="task.status", data__reason="timed out waiting for input")
        .exists()
    )
