"""Events a runtime appends to a conversation's log outside any transition."""

from collections.abc import Iterable
from typing import Any

from django.db import transaction

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
