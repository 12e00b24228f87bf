"""Transient `message.delta` events: the pieces of a streamed reply, for live stream readers.

A delta is never stored: it has no seq, no `id:` line, and a reconnecting reader does not get it
again (docs/rest.md#the-live-stream). The writer (a chat run, in a worker) publishes each piece;
every open stream of that conversation, in any process, receives it.

A delta costs nothing when nobody follows its conversation: a process whose streams read a
conversation announces it on `agenttasks_follow` (when the stream opens, and again every
FOLLOW_REFRESH seconds), and every worker process keeps the followed conversations in memory
(FOLLOW_TTL after the last announcement). On PostgreSQL the pieces of a followed conversation
are coalesced: one sender thread per process sends what arrived since its last send at most
every FLUSH_EVERY seconds (a few notifications a second per run, each under pg_notify's 8,000
bytes), in order, and the rest of a reply before its stored `message.assistant`. Each process's
listener (`listen.hub`) hands them to its local readers. Elsewhere (SQLite: one process) a
piece goes straight to this process's readers.
"""

import json
import logging
import threading
import time
from collections import defaultdict

from django.db import connection, connections

from .listen import hub, raw_connection

logger = logging.getLogger(__name__)

CHANNEL = "agenttasks_delta"
FOLLOW_CHANNEL = "agenttasks_follow"
PIECE_CHARS = 1500  # a piece's JSON stays well under pg_notify's 8,000 bytes even escaped
FLUSH_EVERY = 0.25  # seconds: at most four notifications a second per run (and its last)
FOLLOW_REFRESH = 5.0  # seconds between a reader process's announcements
FOLLOW_TTL = 3 * FOLLOW_REFRESH  # a worker forgets a follower it has not heard from since
END_WAIT = 2.0  # seconds a reply's end waits for its last pieces to be sent

_lock = threading.Lock()
_readers: dict[str, set] = defaultdict(set)
_followed: dict[str, float] = {}  # conversation -> monotonic time its follow lapses


# --- readers -------------------------------------------------------------------------------


def subscribe(conversation_id: str, reader) -> None:
    """Call `reader(run_id, delta)` for each delta of the conversation, until unsubscribed."""
    with _lock:
        _readers[conversation_id].add(reader)
    hub.listen_to(CHANNEL, receive)
    hub.repeat(FOLLOW_CHANNEL, conversation_id, FOLLOW_REFRESH)


def unsubscribe(conversation_id: str, reader) -> None:
    with _lock:
        readers = _readers.get(conversation_id)
        if readers is not None:
            readers.discard(reader)
            if not readers:
                del _readers[conversation_id]
                hub.stop_repeating(FOLLOW_CHANNEL, conversation_id)


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


# --- writers -------------------------------------------------------------------------------


def watch_followers() -> None:
    """Keep track of the conversations other processes follow (a worker process, PostgreSQL)."""
    hub.listen_to(FOLLOW_CHANNEL, _heard_follower)


def _heard_follower(conversation_id: str) -> None:
    with _lock:
        _followed[conversation_id] = time.monotonic() + FOLLOW_TTL


def followed(conversation_id: str) -> bool:
    """Say whether a live reader, in this process or another, follows the conversation."""
    with _lock:
        if conversation_id in _readers:
            return True
        lapses = _followed.get(conversation_id)
        if lapses is None:
            return False
        if lapses < time.monotonic():
            del _followed[conversation_id]
            return False
        return True


def publish(conversation_id: str, run_id: str, delta: str) -> None:
    """Send a piece of a reply to every live reader of the conversation (never blocks or raises)."""
    if not delta or not followed(conversation_id):
        return
    if connection.vendor != "postgresql":
        deliver(conversation_id, run_id, delta)
        return
    sender().add(conversation_id, run_id, delta)


def end_reply(run_id: str) -> None:
    """Send what is left of a run's streamed reply now (before its message.assistant)."""
    current = _sender
    if current is not None and current.is_alive() and current.holds(run_id):
        current.flush(run_id)


class _Sender(threading.Thread):
    """This process's sender of delta notifications: coalesced, in order, on one connection."""

    def __init__(self):
        super().__init__(name="agenttasks-deltas", daemon=True)
        self._cond = threading.Condition()
        self._pending: dict[str, tuple[str, list[str]]] = {}  # run -> (conversation, pieces)
        self._since = 0.0  # when the oldest pending piece arrived (monotonic)
        self._urgent: list[threading.Event] = []  # reply ends waiting for their send
        self._stopping = False
        self._conn = None
        self._sent = 0  # numbers the payloads: PostgreSQL folds identical ones of a transaction

    def holds(self, run_id: str) -> bool:
        with self._cond:
            return run_id in self._pending

    def add(self, conversation_id: str, run_id: str, delta: str) -> None:
        with self._cond:
            if not self._pending:
                self._since = time.monotonic()
                self._cond.notify()
            self._pending.setdefault(run_id, (conversation_id, []))[1].append(delta)

    def flush(self, run_id: str) -> None:
        sent = threading.Event()
        with self._cond:
            self._urgent.append(sent)
            self._cond.notify()
        if not sent.wait(END_WAIT):
            logger.warning("deltas.flush_slow run=%s", run_id)

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self.join(5)

    def run(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._urgent and not self._stopping:
                    self._close()  # idle: hold no session
                    self._cond.wait(FOLLOW_REFRESH)
                if self._stopping:
                    self._close()
                    return
                due = self._since + FLUSH_EVERY - time.monotonic()
                if due > 0 and not self._urgent:
                    self._cond.wait(due)
                    continue
                pending, self._pending = self._pending, {}
                urgent, self._urgent = self._urgent, []
            self._send(pending)
            for event in urgent:
                event.set()

    def _send(self, pending: dict[str, tuple[str, list[str]]]) -> None:
        payloads = []
        for run_id, (conversation_id, pieces) in pending.items():
            text = "".join(pieces)
            for start in range(0, len(text), PIECE_CHARS):
                piece = text[start : start + PIECE_CHARS]
                self._sent += 1
                payload = {"c": conversation_id, "r": run_id, "d": piece, "n": self._sent}
                payloads.append(json.dumps(payload))
        if not payloads:
            return
        try:
            if self._conn is None:
                self._conn = raw_connection(connections["default"].settings_dict)
            # unnest keeps the array's order, and a transaction's notifications keep theirs.
            self._conn.execute(
                "SELECT pg_notify(%s, p) FROM unnest(%s::text[]) AS p", [CHANNEL, payloads]
            )
        except Exception:
            # Deltas are a courtesy: the stored message.assistant is the record.
            logger.warning("deltas.send_failed pieces=%d", len(payloads), exc_info=True)
            self._close()

    def _close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except Exception:
                pass
            self._conn = None


_sender: _Sender | None = None
_sender_lock = threading.Lock()


def sender() -> _Sender:
    """Return this process's delta sender, starting it (again after a fork) when needed."""
    global _sender
    with _sender_lock:
        if _sender is None or not _sender.is_alive():
            _sender = _Sender()
            _sender.start()
        return _sender


def stop() -> None:
    """Stop the sender thread (tests do this before the test database is dropped)."""
    global _sender
    with _sender_lock:
        current, _sender = _sender, None
    if current is not None:
        current.stop()
