"""The hot transitions on PostgreSQL, each one statement: create, claim and end.

Each calls a versioned SQL function of `agenttasks/sql/` (`agenttasks_create_task_v4`,
`agenttasks_claim_v2`, `agenttasks_claim_runs_v8`, `agenttasks_end_v3`), as procrastinate does
for its jobs. The function takes the same row locks in the same order as the ORM path
(`store.locking`), re-checks the same run-bound predicate on the locked rows, writes, and appends
the events; the rows come back as JSON, so nothing is read again. The ORM path (SQLite) keeps the
same contract: the differential test (tests/store/test_differential.py) runs both on PostgreSQL.
"""

import functools
import json
from contextlib import AbstractContextManager, nullcontext
from datetime import date, datetime
from typing import Any, TypeVar

from django.db import IntegrityError, connection, models, transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from ..exceptions import RunNotFound, TaskNotFound, TransitionError
from ..models import Conversation, Run, Task
from ..types import Claimed, Ended, Ending, RunOutcome, usage_counts
from .locking import announce_events
from .rows import result_fields

M = TypeVar("M", bound=models.Model)

CHECK_VIOLATION = "23514"


def enabled() -> bool:
    """Say whether the transitions run as SQL functions (PostgreSQL)."""
    return connection.vendor == "postgresql"


class JSON:
    """A jsonb argument."""

    def __init__(self, value: Any) -> None:
        self.text = json.dumps(value, default=_plain)


def _plain(value: Any) -> str:
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


def _call(function: str, *args: Any) -> Any:
    """Call a SQL function with `args` (JSON ones as jsonb) and return its one value."""
    placeholders = ", ".join("%s::jsonb" if isinstance(a, JSON) else "%s" for a in args)
    params = [a.text if isinstance(a, JSON) else a for a in args]
    # Alone it is its own transaction; inside the caller's, a savepoint keeps a failure from
    # poisoning what the caller does next.
    savepoint: AbstractContextManager[Any] = (
        transaction.atomic() if connection.in_atomic_block else nullcontext()
    )
    try:
        with savepoint, connection.cursor() as cursor:
            cursor.execute(f"SELECT {function}({placeholders})", params)
            return cursor.fetchone()[0]
    except IntegrityError as exc:
        cause = exc.__cause__
        if getattr(cause, "sqlstate", None) == CHECK_VIOLATION:
            # The transition trigger (migration 0016) refused a status change: the same bug
            # `store.rows.set_status` reports on the ORM path.
            raise TransitionError(cause.diag.message_primary) from exc  # type: ignore[union-attr]
        raise


def _answer(value: Any) -> dict[str, Any]:
    """Decode a jsonb answer (Django reads jsonb as text: JSONField decodes it itself)."""
    answer: dict[str, Any] = json.loads(value) if isinstance(value, str) else value
    return answer


def row(instance: models.Model) -> dict[str, Any]:
    """Return a model instance as {column: value}, the shape jsonb_populate_record reads."""
    return {column: getattr(instance, attname) for attname, column, _ in _columns(type(instance))}


def instance(model: type[M], data: dict[str, Any]) -> M:
    """Build a model instance from a row the database returned as JSON."""
    columns = _columns(model)
    values = [
        parse_datetime(data[column]) if is_time and data[column] is not None else data[column]
        for _, column, is_time in columns
    ]
    return model.from_db(connection.alias, [attname for attname, _, _ in columns], values)


@functools.cache
def _columns(model: type[models.Model]) -> list[tuple[str, str, bool]]:
    """(attribute, column, is a timestamp) of each concrete field, in the table's order."""
    out = []
    for field in model._meta.concrete_fields:
        assert field.column is not None  # concrete fields have one
        out.append((field.attname, field.column, isinstance(field, models.DateTimeField)))
    return out


def _linked(answer: dict[str, Any]) -> tuple[Task | None, Run]:
    """The task and run of an answer, linked to their conversation as the ORM would."""
    conversation = instance(Conversation, answer["conversation"])
    run = instance(Run, answer["run"])
    run.conversation = conversation
    if answer.get("task") is None:
        return None, run
    task = instance(Task, answer["task"])
    task.conversation = conversation
    task.run = run
    run.task = task
    return task, run


def event(
    conversation_id: str, type: str, data: dict[str, Any], run_id: str, task_id: str
) -> dict[str, Any]:
    """Return an event as `agenttasks_append_v1` takes it (the function numbers it)."""
    return {
        "conversation_id": conversation_id,
        "type": type,
        "data": data,
        "run_id": run_id,
        "task_id": task_id,
    }


def append_to(conversation_id: str, events: list[dict[str, Any]]) -> bool:
    """Append events to one conversation (locked here); False when there is no such one."""
    appended: bool = _call(
        "agenttasks_append_to_v2", conversation_id, JSON(events), timezone.now().isoformat()
    )
    return appended


def create(
    conversation: Conversation,
    run: Run,
    task: Task,
    events: list[dict[str, Any]],
    *,
    owner_limit: int,
    parent_cap: int,
    job: dict[str, Any] | None,
    notify: bool = False,
) -> str:
    """Insert a task with its conversation, first run, events and job (or, with `notify`, tell
    the listening workers); return the verdict.

    'created', or why not: 'owner_limit', 'parent_gone' or 'parent_cap'.
    """
    verdict: str = _call(
        "agenttasks_create_task_v4",
        JSON(row(conversation)),
        JSON(row(run)),
        JSON(row(task)),
        JSON(events),
        owner_limit,
        parent_cap,
        JSON(job),
        notify,
    )
    return verdict


def claim(run_id: str, worker: str, now: datetime) -> Run | None:
    """Move a queued run (and its task) to running; None when it is not the one to run."""
    value = _call("agenttasks_claim_v2", run_id, worker, now.isoformat(), False, True)
    if value is None:
        return None
    answer = _answer(value)
    if answer.get("missing"):
        raise RunNotFound()
    return _linked(answer)[1]


def claim_many(
    worker: str,
    limit: int,
    now: datetime,
    first: list[str],
    per_owner: int,
    agent_room: dict[str, int],
) -> Claimed:
    """Claim up to `limit` queued runs, those in `first` first, then in fair order, at most
    `per_owner` of an owner's tasks running (0: no limit) and `agent_room[agent]` runs of an
    agent; one statement."""
    answer = _answer(
        _call(
            "agenttasks_claim_runs_v8",
            worker,
            limit,
            now.isoformat(),
            first,
            per_owner,
            JSON(agent_room),
        )
    )
    runs = [_linked(claim)[1] for claim in answer["claims"]]
    next_at = answer.get("next_at")
    return Claimed(runs, int(answer["passed"]), parse_datetime(next_at) if next_at else None)


def end(
    task_id: str,
    run_id: str,
    ending: Ending,
    *,
    outcome: RunOutcome | None,
    after_turn: Ending | None,
    lease_cutoff: datetime | None,
    rollback_attempt: bool,
) -> Ended:
    """`store.end` as one statement."""
    params: dict[str, Any] = {
        "task_id": task_id,
        "run_id": run_id,
        "ending": _ending(ending),
        "rollback_attempt": rollback_attempt,
        "now": timezone.now(),
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
    answer = _answer(_call("agenttasks_end_v3", JSON(params)))
    if answer.get("missing"):
        raise TaskNotFound(task_id)
    task = _linked(answer)[0] if answer.get("task") is not None else None
    if task is not None and "messages_wait" in answer:
        task.messages_wait_at_end = answer["messages_wait"]
        task.push_configs_at_end = answer["push_configs"]
    announce_events(c for c in answer.get("conversations") or () if c)
    return Ended(recorded=answer["recorded"], task=task)


def _ending(ending: Ending) -> dict[str, Any]:
    data: dict[str, Any] = {
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


def reserve(p: dict[str, Any]) -> dict[str, Any]:
    """Reserve a request's turn in its endpoint's budget (`agenttasks_reserve_v1`, one
    statement; flow.budgets builds `p` and reads the answer)."""
    return _answer(_call("agenttasks_reserve_v1", JSON(p)))
