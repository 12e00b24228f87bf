"""The two paths of the hot transitions give the same answer for every input (PostgreSQL).

On PostgreSQL, create, claim and end are SQL functions (`store.postgres`); elsewhere the same
transitions run through the ORM (`store.tasks`, `store.endings`). With `postgres.enabled` off,
the ORM path runs on PostgreSQL too, so every sequence of operations below runs twice, once
through each path, from the same starting state, and both must leave the same rows and events
and give the same answer. Ids and times differ between the two runs and are normalized.
"""

import itertools
import re
from datetime import timedelta
from typing import Any

import pytest
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from agenttasks import store
from agenttasks.exceptions import TransitionError
from agenttasks.models import Delivery, Event, PendingAction, Run, Task, TaskResult, Wakeup
from agenttasks.states import TaskStatus, is_allowed
from agenttasks.store import postgres
from agenttasks.store.rows import set_status
from agenttasks.types import ActionRequest, Ending, NewTask, RunOutcome

from ..factories import ConversationFactory, TaskFactory

pytestmark = [pytest.mark.postgres, pytest.mark.django_db]

TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)?")
TIME_FIELDS = {"at", "createdAt", "updatedAt", "startedAt", "endedAt", "finishedAt", "deadline"}


def question() -> ActionRequest:
    deadline = timezone.now() + timedelta(hours=1)
    return ActionRequest(
        "question", "ask", "call_1", questions=[{"id": "q", "text": "Which?"}], deadline=deadline
    )


# Starting states, each reached through the path under test.
def pending(user, parent):
    return store.create_task(NewTask(owner=user, agent="worker", input="x"))


def running(user, parent):
    task = pending(user, parent)
    store.claim(task.run_id, "w1")
    return task


def spawned_running(user, parent):
    new = NewTask(owner=user, agent="worker", input="x", parent_conversation_id=parent.pk)
    task = store.create_task(new)
    store.claim(task.run_id, "w1")
    return task


def paused(user, parent):
    task = running(user, parent)
    store.pause(task.id, task.run_id, actions=[question()])
    return task


def stopping(user, parent):
    task = running(user, parent)
    store.request_stop(task.id, task.run_id, graceful=True)
    return task


def completed(user, parent):
    task = running(user, parent)
    outcome = RunOutcome(task.run_id, "completed", text="done", usage={"totalTokens": 3})
    store.end(task.id, task.run_id, Ending("completed", result="done"), outcome=outcome)
    return task


def retried(user, parent):
    task = running(user, parent)
    store.end(task.id, task.run_id, Ending("failed", result="boom"))
    store.retry_claim(task.id, "run_retry_" + task.id[-8:], max_attempts=3, cap=None)
    return task


STARTS = [pending, running, spawned_running, paused, stopping, completed, retried]


def outcome(run_id: str, status: str | None) -> RunOutcome | None:
    if status is None:
        return None
    return RunOutcome(
        run_id, status, text=f"said {status}", error="broke", usage={"totalTokens": 7}
    )


def end_ops() -> list:
    ops = []
    for status, reported in itertools.product(
        ("completed", "failed", "cancelled"), (None, "completed", "failed")
    ):
        ops.append(
            (
                f"end {status} after {reported}",
                lambda task, s=status, r=reported: store.end(
                    task.id,
                    task.run_id,
                    Ending(s, result=f"as {s}"),
                    outcome=outcome(task.run_id, r),
                ),
            )
        )
    return ops


def current(task: Task) -> str:
    return Task.objects.get(pk=task.id).run_id


OPS = [
    ("claim", lambda task: store.claim(current(task), "w2")),
    ("claim an unknown run", lambda task: store.claim("run_unknown", "w2")),
    *[(name, lambda task, op=op: op(Task.objects.get(pk=task.id))) for name, op in end_ops()],
    (
        "end after a graceful stop",
        lambda task: store.end(
            task.id,
            current(task),
            Ending("completed", result="done"),
            outcome=outcome(current(task), "completed"),
            after_turn=Ending("cancelled", reason="stopped after its turn"),
        ),
    ),
    (
        "the reaper, lease lapsed",
        lambda task: store.end(
            task.id,
            current(task),
            Ending("failed", result=store.ORPHAN_TEXT),
            lease_cutoff=timezone.now() + timedelta(hours=1),
        ),
    ),
    (
        "the reaper, lease alive",
        lambda task: store.end(
            task.id,
            current(task),
            Ending("failed", result=store.ORPHAN_TEXT),
            lease_cutoff=timezone.now() - timedelta(hours=1),
        ),
    ),
    (
        "the first run's late ending",
        lambda task: store.end(
            task.id, task.run_id, Ending("completed"), outcome=outcome(task.run_id, "completed")
        ),
    ),
    (
        "an unknown run's ending",
        lambda task: store.end(
            task.id, "run_unknown", Ending("completed"), outcome=outcome("run_unknown", "completed")
        ),
    ),
    (
        "an unknown task's ending",
        lambda task: store.end("task_unknown", current(task), Ending("completed")),
    ),
    (
        "a retry that could not start",
        lambda task: store.release_retry_claim(task.id, current(task), "no", "could not start"),
    ),
]


def answer(value: Any) -> Any:
    """What an operation answered, without ids: its exception, or the statuses it returned."""
    if isinstance(value, Exception):
        return type(value).__name__
    if value is None:
        return None
    if isinstance(value, Run):
        return ("run", value.status, value.task.status if value.task_id else None)
    return ("ended", value.recorded, value.task.status if value.task is not None else None)


def attempt(op, task: Task) -> Any:
    try:
        return answer(op(task))
    except Exception as exc:  # the answer compared is the exception's class
        return answer(exc)


class Ids:
    """Replace each id (and each time) by a placeholder in order of appearance."""

    def __init__(self) -> None:
        self.names: dict[str, str] = {}

    def of(self, value: Any) -> Any:
        if isinstance(value, dict):
            return {k: "<time>" if k in TIME_FIELDS and v else self.of(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.of(v) for v in value]
        if isinstance(value, str):
            value = TIME.sub("<time>", value)
            for real, name in self.names.items():
                value = value.replace(real, name)
            return value
        return value

    def learn(self, *ids: str | None) -> None:
        for real in ids:
            if real and real not in self.names:
                self.names[real] = f"<id{len(self.names)}>"


def snapshot(task_id: str, parent_id: str) -> dict[str, Any]:
    """The rows and events a sequence leaves, with ids and times normalized."""
    ids = Ids()
    task = Task.objects.get(pk=task_id)
    ids.learn(task.id, task.conversation_id, parent_id)
    conversations = [task.conversation_id, parent_id]
    runs = list(Run.objects.filter(conversation_id=task.conversation_id).order_by("created_at"))
    ids.learn(*(r.id for r in runs))
    actions = PendingAction.objects.filter(run__conversation_id=task.conversation_id)
    ids.learn(*actions.order_by("created_at").values_list("id", flat=True))
    events = [
        e for c in conversations for e in Event.objects.filter(conversation_id=c).order_by("seq")
    ]
    return ids.of(
        {
            "task": [
                task.status,
                task.summary,
                task.result,
                task.error,
                task.stop_reason,
                task.attempt,
                task.version,
                task.run_id,
                task.finished_at is None,
            ],
            "runs": [
                [
                    r.id,
                    r.trigger,
                    r.status,
                    r.error,
                    r.output,
                    r.stop_request,
                    r.graceful_stop,
                    r.usage_known,
                    r.total_tokens,
                    r.started_at is None,
                    r.ended_at is None,
                ]
                for r in runs
            ],
            "events": [
                [e.conversation_id, e.seq, e.type, e.run_id, e.task_id, e.data] for e in events
            ],
            "results": list(
                TaskResult.objects.filter(task_id=task_id).values_list(
                    "run_id", "content", "partial"
                )
            ),
            "wakeups": list(Wakeup.objects.filter(task_id=task_id).values_list("status", "state")),
            "deliveries": Delivery.objects.filter(task_id=task_id).count(),
            "actions": sorted(actions.values_list("kind", "status")),
        }
    )


def run_sequence(start, op, user, path: str, monkeypatch) -> tuple[Any, dict]:
    parent = ConversationFactory(owner=user, agent="default")
    with monkeypatch.context() as patch:
        if path == "orm":
            patch.setattr(postgres, "enabled", lambda: False)
        task = start(user, parent)
        answered = attempt(op, task)
    return answered, snapshot(task.id, parent.pk)


@pytest.mark.parametrize("start", STARTS, ids=lambda s: s.__name__)
def test_both_paths_agree(start, user, monkeypatch):
    disagreements = []
    for name, op in OPS:
        sql = run_sequence(start, op, user, "sql", monkeypatch)
        orm = run_sequence(start, op, user, "orm", monkeypatch)
        if sql != orm:
            disagreements.append((name, sql, orm))
    assert not disagreements, "\n\n".join(f"{n}\n sql {s}\n orm {o}" for n, s, o in disagreements)


class Undo(Exception):
    """Roll back a change the trigger let through."""


@pytest.mark.parametrize("src", sorted(TaskStatus.values))
def test_the_database_refuses_what_the_table_does_not_allow(src, user):
    """Any writer, raw SQL included, is held to states.TRANSITIONS by the trigger (0016)."""
    task = TaskFactory(owner=user, status=src)
    refused = []
    for dst in TaskStatus.values:
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute(
                    "UPDATE agenttasks_task SET status = %s WHERE id = %s", [dst, task.pk]
                )
                raise Undo()  # each change starts from `src`
        except Undo:
            pass
        except IntegrityError as exc:
            assert f"tasks: {src} -> {dst} is not an allowed transition" in str(exc)
            refused.append(dst)
    allowed = {dst for dst in TaskStatus.values if is_allowed(src, dst) or dst == src}
    assert set(refused) == set(TaskStatus.values) - allowed


def test_a_refused_transition_is_the_same_error_on_both_paths(user):
    task = store.create_task(NewTask(owner=user, agent="worker", input="x"))
    message = "tasks: pending -> waiting_for_input is not an allowed transition"
    with connection.cursor() as cursor:  # a SQL writer that leaves the table (a bug)
        cursor.execute(
            "CREATE FUNCTION pg_temp.force_status(p_id text, p_status text) RETURNS void"
            " LANGUAGE sql AS $$ UPDATE agenttasks_task SET status = p_status WHERE id = p_id $$"
        )
    with pytest.raises(TransitionError, match=message):
        postgres._call("pg_temp.force_status", task.pk, "waiting_for_input")
    with pytest.raises(TransitionError, match=message):
        set_status(Task.objects.get(pk=task.pk), "waiting_for_input")
    assert Task.objects.get(pk=task.pk).status == "pending"
