"""Retention: finished trees, files, idempotency keys and django-q2 failures pruned in batches."""

import json
import time
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import transaction
from django.utils import timezone
from django_q.models import Schedule
from django_q.models import Task as QTask

from agenttasks import lifecycle
from agenttasks.execution import worker
from agenttasks.models import (
    A2AContext,
    A2APushConfig,
    Conversation,
    Delivery,
    Event,
    File,
    IdempotencyKey,
    PendingAction,
    Run,
    Task,
    TaskResult,
    Wakeup,
    WorkerProcess,
)
from agenttasks.operations import retention
from agenttasks.store import files

from ..conftest import wait_for
from ..factories import ConversationFactory, RunFactory
from ..harness import finish

pytestmark = pytest.mark.django_db(transaction=True)

OLD = timedelta(days=40)
OLD_TASKS = 10_000
LIVE_TASKS = 100


def age(conversation_ids, by=OLD):
    """Move a tree's activity and its tasks' endings into the past."""
    then = timezone.now() - by
    Conversation.objects.filter(pk__in=conversation_ids).update(updated_at=then)
    Task.objects.filter(conversation_id__in=conversation_ids).update(finished_at=then)


def finished_task_with_a_file(user, text="old"):
    """A task created through the Python API, run to completion, with a stored file."""
    task = lifecycle.create(owner=user, agent_id="echo", input=text)
    files.save(
        [files.Upload(0, "notes.txt", "text/plain", b"0123456789")],
        conversation_id=task.conversation_id,
        owner=user,
        rules={},
        task_id=task.id,
    )
    worker.execute_run(task.run_id)
    return Task.objects.get(pk=task.id)


def chat_tree_with_a_child(user):
    """A chat conversation whose run spawned a task that finished and was delivered."""
    chat = ConversationFactory(owner=user, agent="default")
    turn = RunFactory(conversation=chat, status="running", trigger="message")
    child = lifecycle.spawn(chat, "worker", "do it", label="job", parent_run=turn).task_id
    finish(child, "completed", "child done")
    Wakeup.objects.filter(task_id=child).update(state="delivered")
    Run.objects.filter(pk=turn.pk).update(status="completed", ended_at=timezone.now())
    return chat, Task.objects.get(pk=child)


def bulk_old_tasks(user, n):
    """n finished top-level tasks (conversation, task, run, two events, a result) in one go."""
    now = timezone.now()
    conversations, runs, tasks, events, results = [], [], [], [], []
    for i in range(n):
        cid, tid, rid = f"conv_old{i:017d}", f"task_old{i:017d}", f"run_old{i:018d}"
        conversations.append(
            Conversation(id=cid, owner=user, agent="echo", metadata={"taskId": tid})
        )
        runs.append(
            Run(id=rid, conversation_id=cid, task_id=tid, agent="echo", trigger="initial",
                status="completed", queued_at=now, ended_at=now)
        )  # fmt: skip
        tasks.append(
            Task(id=tid, run_id=rid, owner=user, agent="echo", input=f"job {i}",
                 conversation_id=cid, status="completed", result="done", finished_at=now)
        )  # fmt: skip
        events += [
            Event(conversation_id=cid, seq=1, type="message.user", data={"content": "x"},
                  run_id=rid, task_id=tid),
            Event(conversation_id=cid, seq=2, type="task.status", data={"to": "completed"},
                  run_id=rid, task_id=tid),
        ]  # fmt: skip
        results.append(TaskResult(task_id=tid, content="done"))
    with transaction.atomic():  # the task and its run point at each other
        for model, rows in (
            (Conversation, conversations),
            (Run, runs),
            (Task, tasks),
            (Event, events),
            (TaskResult, results),
        ):
            model.objects.bulk_create(rows, batch_size=2000)
    return [c.id for c in conversations]


def snapshot(conversation_ids) -> dict:
    """Every row a set of conversations has, by table."""
    return {
        "conversations": sorted(
            Conversation.objects.filter(pk__in=conversation_ids).values_list("pk", "updated_at")
        ),
        "tasks": sorted(
            Task.objects.filter(conversation_id__in=conversation_ids).values_list(
                "pk", "status", "updated_at"
            )
        ),
        "runs": sorted(
            Run.objects.filter(conversation_id__in=conversation_ids).values_list("pk", "status")
        ),
        "events": Event.objects.filter(conversation_id__in=conversation_ids).count(),
    }


@pytest.fixture(autouse=True)
def _no_active_task_cap(settings):
    settings.AGENTTASKS = {"MAX_ACTIVE_TASKS_PER_USER": 0}


def test_old_trees_go_whole_and_live_ones_stay(user, recording_queue):
    with_file = finished_task_with_a_file(user)
    stored = File.objects.get(task_id=with_file.id).storage_name
    assert files.storage().exists(stored)
    chat, child = chat_tree_with_a_child(user)
    age([with_file.conversation_id, chat.id, child.conversation_id])
    old = [with_file.conversation_id, chat.id, child.conversation_id]
    old += bulk_old_tasks(user, OLD_TASKS)
    age(old)
    # What stays: 100 live tasks, one task that finished yesterday, a chat conversation of today.
    live = [
        lifecycle.create(owner=user, agent_id="echo", input=f"live {i}").conversation_id
        for i in range(LIVE_TASKS)
    ]
    recent = finished_task_with_a_file(user, "recent")
    age([recent.conversation_id], by=timedelta(days=1))
    today = ConversationFactory(owner=user, agent="default")
    kept = [*live, recent.conversation_id, today.id]
    # A live tree that is old: a task idle for 40 days, still pending, is not finished.
    stale_live = lifecycle.create(owner=user, agent_id="echo", input="stuck").conversation_id
    age([stale_live])
    kept.append(stale_live)
    before = snapshot(kept)

    dry = StringIO()
    call_command("agenttasks_prune", "--dry-run", stdout=dry)
    assert f"finished trees would delete: {OLD_TASKS + 2}" in dry.getvalue()
    assert f"tasks would delete: {OLD_TASKS + 2}" in dry.getvalue()
    assert Conversation.objects.filter(pk__in=old).count() == len(old)

    begun = time.monotonic()
    report = retention.prune()
    seconds = time.monotonic() - begun

    assert report.trees == OLD_TASKS + 2
    assert not Conversation.objects.filter(pk__in=old).exists()
    assert not Task.objects.filter(conversation_id__in=old).exists()
    assert not Task.objects.filter(pk__in=[with_file.id, child.id]).exists()
    assert not Run.objects.filter(conversation_id__in=old).exists()
    assert not Event.objects.filter(conversation_id__in=old).exists()
    assert not TaskResult.objects.filter(task__id__startswith="task_old").exists()
    assert not Wakeup.objects.filter(task_id=child.id).exists()
    assert not PendingAction.objects.filter(conversation_id__in=old).exists()
    assert not File.objects.filter(task_id=with_file.id).exists()
    assert not files.storage().exists(stored)  # the bytes too
    assert snapshot(kept) == before  # every live row intact, not even touched
    assert File.objects.filter(task_id=recent.id).count() == 1
    # Bounded by rows, so no batch holds its locks long; its seconds are printed, a figure for
    # the machine at hand, not a condition (a loaded CI machine took 1.35 s once).
    assert report.largest_batch <= retention.BATCH
    print(
        json.dumps(
            {
                "old_tasks": OLD_TASKS,
                "rows_deleted": sum(report.rows.values()),
                "batches": report.batches,
                "largest_batch_rows": report.largest_batch,
                "slowest_batch_seconds": round(report.slowest_batch, 3),
                "total_seconds": round(seconds, 1),
            }
        )
    )
    # Nothing is left to do.
    assert retention.prune().trees == 0


def test_work_that_starts_during_the_prune_keeps_its_tree(user, recording_queue, monkeypatch):
    task = finished_task_with_a_file(user)
    age([task.conversation_id])
    marked = retention._mark

    def a_message_arrives_first(trees):
        # A run starts after the check, before the mark.
        Run.objects.filter(conversation_id=task.conversation_id).update(status="queued")
        return marked(trees)

    monkeypatch.setattr(retention, "_mark", a_message_arrives_first)
    assert retention.prune().trees == 0
    conversation = Conversation.objects.get(pk=task.conversation_id)
    assert conversation.deleting_at is None  # released again


def test_the_command_honours_finished_older_than_days(user, recording_queue):
    done = finished_task_with_a_file(user)
    Task.objects.filter(pk=done.id).update(finished_at=timezone.now() - timedelta(days=10))
    out = StringIO()
    call_command("agenttasks_prune", "--finished-older-than-days", "5", stdout=out)
    assert "finished trees deleted: 1" in out.getvalue()
    assert not Task.objects.filter(pk=done.id).exists()


def test_an_old_a2a_task_goes_with_its_push_configs_and_the_deliveries_it_owes(
    user, recording_queue
):
    task = lifecycle.create(owner=user, agent_id="echo", input="x")
    A2AContext.objects.create(task=task, context_id="ctx-1")
    config = A2APushConfig.objects.create(task=task, url="https://hooks.example.com/a2a")
    worker.execute_run(task.run_id)
    Delivery.objects.create(
        task=task, config=config, status="completed", version=2, due_at=timezone.now()
    )
    age([task.conversation_id])
    report = retention.prune()
    assert report.trees == 1
    assert not Task.objects.filter(pk=task.id).exists()
    assert not A2AContext.objects.exists() and not Delivery.objects.exists()


def test_old_django_q2_failures_go(db):
    now = timezone.now()
    for i, stopped in enumerate((now - timedelta(days=8), now - timedelta(hours=1))):
        QTask.objects.create(
            id=f"f{i}", name=f"f{i}", func="x", started=stopped, stopped=stopped, success=False
        )
    report = retention.prune()
    assert report.rows["django-q2 failures"] == 1
    assert list(QTask.objects.values_list("id", flat=True)) == ["f1"]


def test_expired_and_old_idempotency_keys_go(user):
    now = timezone.now()

    def key(name: str, created: timedelta, expires: timedelta) -> None:
        IdempotencyKey.objects.create(
            principal=f"user:{user.pk}", owner=user, key=name, method="POST", path="/tasks",
            request_hash="h", created_at=now - created, expires_at=now + expires,
        )  # fmt: skip

    key("expired", timedelta(hours=2), -timedelta(hours=1))
    key("older than idempotency_hours", timedelta(hours=30), timedelta(hours=5))
    key("fresh", timedelta(hours=1), timedelta(hours=23))
    assert retention.prune(dry_run=True).rows["idempotency keys"] == 2
    assert IdempotencyKey.objects.count() == 3
    assert retention.prune().rows["idempotency keys"] == 2
    assert list(IdempotencyKey.objects.values_list("key", flat=True)) == ["fresh"]


def test_retention_settings_fall_back_to_their_defaults(settings):
    settings.AGENTTASKS = {"RETENTION": {"finished_days": 7, "idempotency_hours": 0}}
    assert retention.settings() == {"finished_days": 7, "idempotency_hours": 24, "failures_days": 7}


def test_a_cluster_installs_the_daily_schedule_itself(start_cluster):
    start_cluster(workers=1)
    wait_for(
        lambda: Schedule.objects.filter(name=retention.SCHEDULE_NAME).exists(),
        timeout=30,
        message="the retention schedule",
    )
    (schedule,) = Schedule.objects.filter(name=retention.SCHEDULE_NAME)
    assert (schedule.func, schedule.schedule_type, schedule.repeats) == (
        "agenttasks.operations.retention.run",
        Schedule.DAILY,
        -1,
    )


def test_the_rows_of_killed_worker_processes_go_and_live_ones_stay(start_cluster):
    cluster = start_cluster(workers=2)
    wait_for(lambda: WorkerProcess.objects.count() == 2, timeout=30, message="two worker rows")
    cluster.kill()  # SIGKILL: no process removes its row
    killed = set(WorkerProcess.objects.values_list("pk", flat=True))
    assert len(killed) == 2
    start_cluster(workers=1)
    wait_for(lambda: WorkerProcess.objects.count() == 3, timeout=30, message="the new row")
    # An hour on, as the killed processes' rows would be then (the live one beats meanwhile).
    WorkerProcess.objects.filter(pk__in=killed).update(
        seen_at=timezone.now() - timedelta(hours=1, seconds=1)
    )
    report = retention.prune()
    assert report.rows["dead worker processes"] == 2
    assert not WorkerProcess.objects.filter(pk__in=killed).exists()
    assert WorkerProcess.objects.count() == 1
