"""Transient `message.delta` events: the pieces of a streamed reply, for live stream readers.

A delta is never stored: it has no seq, no `id:` line, and a reconnecting reader does not get it
again (docs/rest.md#the-live-stream). The writer (a chat run, in a worker) publishes each piece;
every open stream of that conversation, in any process, receives it. On PostgreSQL the piece goes
through `pg_notify` on one channel (payloads are cut below its 8,000-byte limit; one sender's
notifications arrive in order) and each process's listener (`listen.hub`) hands it to its local
readers; elsewhere (SQLite: one process) it goes straight to them.
"""

import json
import logging
import threading
from collections import defaultdict

from django.db import connection

from .listen import hub

logger = logging.getLogger(__name__)

CHANNEL = "agenttasks_delta"
PIECE_CHARS = 1500  # a piece's JSON stays well under pg_notify's 8,000 bytes even escaped

_lock = threading.Lock()
_readers: dict[str, set] = defaultdict(set)


def subscribe(conversation_id: str, reader) -> None:
    """Call `reader(run_id, delta)` for each delta of the conversation, until unsubscribed."""
    with _lock:
        _readers[conversation_id].add(reader)
    hub.listen_to(CHANNEL, receive)


def unsubscribe(conversation_id: str, reader) -> None:
    with _lock:
        readers = _readers.get(conversation_id)
        if readers is not None:
            readers.discard(reader)
            if not readers:
                del _readers[conversation_id]


def deliver(conversation_id: str, run_id: str, delta: str) -> None:
    """Hand a delta to this process's readers of the conversation."""
    with _lock:
        readers = list(_readers.get(conversation_id, ()))
    for reader in readers:
        try:
            reader(run_id, delta)
        except Exception:
            logger.exception("deltas.reader_failed conversation=%s", conversation_id)


def receive(payload: str) -> None:
    """Deliver a delta that arrived as a PostgreSQL notification."""
    try:
        data = json.loads(payload)
        deliver(data["c"], data["r"], data["d"])
    except (ValueError, KeyError, TypeError):
        logger.warning("deltas.bad_payload %r", payload[:200])


def publish(conversation_id: str, run_id: str, delta: str) -> None:
    """Send a piece of a reply to every live reader of the conversation (never raises)."""
    if not delta:
        return
    try:
        if connection.vendor != "postgresql":
            deliver(conversation_id, run_id, delta)
            return
        with connection.cursor() as cursor:
            for start in range(0, len(delta), PIECE_CHARS):
                piece = delta[start : start + PIECE_CHARS]
                payload = json.dumps({"c": conversation_id, "r": run_id, "d": piece})
                cursor.execute("SELECT pg_notify(%s, %s)", [CHANNEL, payload])
    except Exception:
        # Deltas are a courtesy: the stored message.assistant is the record.
        logger.warning("deltas.publish_failed conversation=%s", conversation_id, exc_info=True)
