"""Events a runtime appends to a conversation's log outside any transition."""

import json
from collections.abc import Iterable, Sequence
from typing import Any

from django.db import connection, transaction

from ..exceptions import ConversationNotFound
from . import postgres
from .locking import Log, announce_events, lock_conversation, retried


@retried
def append_events(
    conversation_id: str, events: Iterable[tuple[str, dict[str, Any], str, str]]
) -> None:
    """Append (type, data, run_id, task_id) events to a conversation in one short transaction.

    On PostgreSQL it is one statement (`agenttasks_append_to_v2`).
    """
    if postgres.enabled():
        rows = [postgres.event(conversation_id, t, d, r, k) for t, d, r, k in events]
        if not postgres.append_to(conversation_id, rows):
            raise ConversationNotFound(conversation_id)
        announce_events([conversation_id])
        return
    with transaction.atomic():
        log = Log()
        lock_conversation(conversation_id, log)
        for t, d, r, k in events:
            log.add(conversation_id, t, d, run_id=r, task_id=k)
        log.flush()


def read_log(conversation_id: str, types: Sequence[str]) -> list[tuple[str, Any, str | None]]:
    """Read a conversation's events of `types` in order, as (type, data, run_id).

    A chat run reads its transcript at every model turn: plain SQL, without the ORM's compiling
    of a query and its model instances.
    """
    marks = ", ".join(["%s"] * len(types))
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT type, data, run_id FROM agenttasks_event"
            f" WHERE conversation_id = %s AND type IN ({marks}) ORDER BY seq",
            [conversation_id, *types],
        )
        rows = cursor.fetchall()
    # Django's backends hand a JSON column over as text (JSONField decodes it).
    return [(t, json.loads(d) if isinstance(d, str) else d, r) for t, d, r in rows]


def last_of_run(conversation_id: str, run_id: str, types: Sequence[str]) -> tuple[str, Any] | None:
    """Return the (type, data) of the latest event of `types` a run appended to a conversation."""
    marks = ", ".join(["%s"] * len(types))
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT type, data FROM agenttasks_event WHERE conversation_id = %s AND run_id = %s"
            f" AND type IN ({marks}) ORDER BY seq DESC LIMIT 1",
            [conversation_id, run_id, *types],
        )
        row = cursor.fetchone()
    if row is None:
        return None
    return row[0], json.loads(row[1]) if isinstance(row[1], str) else row[1]
