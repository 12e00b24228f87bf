"""The hot transitions on PostgreSQL, each one statement: create, claim and end.

Each calls a SQL function that migration 0005 installs (as procrastinate does for its jobs). The
function takes the same row locks in the same order as the ORM path (`store.locking`), re-checks
the same run-bound predicate on the locked rows, writes, and appends the events; the rows come
back as JSON, so nothing is read again. The ORM path (SQLite) keeps the same contract, and the
store's conformance tests run on both.
"""

import json
from contextlib import nullcontext
from datetime import date, datetime

from django.db import connection, models, transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from ..exceptions import RunNotFound, TaskNotFound
from ..models import Conversation, Run, Task
from ..types import Ended, Ending, RunOutcome
from .locking import announce_events
from .rows import result_fields, usage_counts


def enabled() -> bool:
    """Whether the transitions run as SQL functions (PostgreSQL)."""
    return connection.vendor == "postgresql"


def _call(function: str, *args, returns_json: bool = True):
    placeholders = ", ".join("%s::jsonb" if isinstance(a, JSON) else "%s" for a in args)
    sql = f"SELECT {function}({placeholders})"
    params = [None if a is None else str(a) for a in args]
    # Alone it is its own transaction; inside the caller's, a savepoint keeps a failure from
    # poisoning what the caller does next.
    savepoint = transaction.atomic() if connection.in_atomic_block else nullcontext()
    with savepoint, connection.cursor() as cursor:
        cursor.execute(sql, params)
        value = cursor.fetchone()[0]
    # Django reads jsonb as text (JSONField decodes it itself).
    return json.loads(value) if returns_json and isinstance(value, str) else value


class JSON:
    """A jsonb argument."""

    def __init__(self, value):
        self.text = json.dumps(value, default=_plain)

    def __str__(self) -> str:
        return self.text


def _plain(value):
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


def row(instance: models.Model) -> dict:
    """Return a model instance as {column: value}, the shape jsonb_populate_record reads."""
    return {f.column: f.value_from_object(instance) for f in instance._meta.concrete_fields}


def instance(model: type[models.Model], data: dict) -> models.Model:
    """Build a model instance from a row the database returned as JSON."""
    fields = model._meta.concrete_fields
    values = []
    for field in fields:
        value = data[field.column]
        if value is not None and isinstance(field, models.DateTimeField):
            value = parse_datetime(value)
        values.append(value)
    return model.from_db(connection.alias, [f.attname for f in fields], values)


def _rows(answer: dict) -> tuple:
    """The task, run and conversation of an answer, linked to each other as the ORM would."""
    conversation = instance(Conversation, answer["conversation"])
    run = instance(Run, answer["run"])
    run.conversation = conversation
    task = None
    if answer.get("task") is not None:
        task = instance(Task, answer["task"])
        task.conversation = conversation
        task.run = run
        run.task = task
    return task, run, conversation


# --- the three transitions -------------------------------------------------------------------


def create(conversation, run, task, events, *, owner_limit: int, parent_cap: int, job) -> str:
    """Insert a task with its conversation, first run, events and job; return the verdict.

    'created', or why not: 'owner_limit', 'parent_gone' or 'parent_cap'.
    """
    return _call(
        "agenttasks_create_task",
        JSON(row(conversation)),
        JSON(row(run)),
        JSON(row(task)),
        JSON(events),
        owner_limit or 0,
        parent_cap or 0,
        JSON(job),
        returns_json=False,
    )


def claim(run_id: str, worker: str, now) -> Run | None:
    """Move a queued run (and its task) to running; None when it is not the one to run."""
    answer = _call("agenttasks_claim_run", run_id, worker, now.isoformat())
    if answer is None:
        return None
    if answer.get("missing"):
        raise RunNotFound()
    return _rows(answer)[1]


def end(
    task_id: str,
    run_id: str,
    ending: Ending,
    *,
    outcome: RunOutcome | None,
    after_turn: Ending | None,
    lease_cutoff,
    rollback_attempt: bool,
):
    """`store.end` as one statement."""
    params = {
        "task_id": task_id,
        "run_id": run_id,
        "ending": _ending(ending),
        "rollback_attempt": rollback_attempt,
    }
    if outcome is not None:
        params["outcome"] = {
            "status": outcome.status,
            "text": outcome.text or "",
            "error": outcome.error or "",
            "graceful_stop": outcome.graceful_stop,
            "append_message": outcome.append_message,
            "usage": usage_counts(outcome.usage),
        }
    if after_turn is not None:
        params["after_turn"] = _ending(after_turn)
    if lease_cutoff is not None:
        params["lease_cutoff"] = lease_cutoff
    params["now"] = timezone.now()
    answer = _call("agenttasks_end", JSON(params))
    if answer.get("missing"):
        raise TaskNotFound()
    task = _rows(answer)[0] if answer.get("task") is not None else None
    announce_events(c for c in answer.get("conversations") or () if c)
    return Ended(recorded=answer["recorded"], task=task)


def _ending(ending: Ending) -> dict:
    data = {
        "status": ending.status,
        "summary": ending.summary,
        "result": ending.result,
        "error": ending.error,
        "reason": ending.reason,
    }
    if ending.state is not None:
        data["state"] = ending.state
    if ending.task_result is not None:
        data["task_result"] = result_fields(ending.task_result)
    return data
