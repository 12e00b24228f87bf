"""Wake waiters in this process when a task settles, a conversation gets events or a run is
told to stop.

Writers in this process publish after commit. On PostgreSQL one listener thread per process also
LISTENs to the notifications the database triggers send at commit, so writes made by any process
wake waiters at once. It listens only to the channels this process has waiters on: a worker
process, which waits only for stop requests, is not woken by every event of every conversation.
And the triggers notify a conversation's events and a task's settling only while some process
says it listens to their channel (`ListenedChannel`), which a listener says while its waiters
wait: PostgreSQL commits notifying transactions one at a time. Waiters still poll, so nothing
depends on delivery.
"""

import logging
import os
import socket
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from contextlib import contextmanager
from typing import Protocol

from django.db import connections

logger = logging.getLogger(__name__)

# The channels the database's triggers notify (agenttasks/sql/notify_v1.sql writes them in).
TASK_ENDED_CHANNEL = "agenttasks_task_ended"
EVENTS_CHANNEL = "agenttasks_events"
STOP_CHANNEL = "agenttasks_run_stop"
# channel -> the prefix of the keys it wakes
CHANNELS = {TASK_ENDED_CHANNEL: "task:", EVENTS_CHANNEL: "conv:", STOP_CHANNEL: "stop:"}
CHANNEL_OF = {prefix: channel for channel, prefix in CHANNELS.items()}
LISTEN_POLL = 0.2  # seconds between checks for a channel newly asked for
# The channels the triggers notify only while some process says it listens there
# (ListenedChannel, agenttasks/sql/notify_v2.sql): a listener says so before it LISTENs, and
# again every LISTENED_RENEW seconds while its waiters need the channel; LISTENED_FOR after the
# last say-so the triggers stop notifying.
GATED_CHANNELS = frozenset({TASK_ENDED_CHANNEL, EVENTS_CHANNEL})
LISTENED_RENEW = 5.0
LISTENED_FOR = 30.0
LISTENER_PREFIX = "agenttasks "  # a listener session's name: this, then its process's name
HOST = socket.gethostname()


def task_key(task_id: str) -> str:
    return "task:" + task_id


def conversation_key(conversation_id: str) -> str:
    return "conv:" + conversation_id


def stop_key(run_id: str) -> str:
    return "stop:" + run_id


class Waiter(Protocol):
    """What a publication sets: a threading.Event, or anything else with `set()`."""

    def set(self) -> None: ...


class Hub:
    """A registry of in-process waiters by key, fed locally and by PostgreSQL notifications."""

    def __init__(self):
        self._lock = threading.Lock()
        self._waiters: dict[str, set[Waiter]] = defaultdict(set)
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._channels: set[str] = set()  # the channels some waiter of this process needs
        self._handlers: dict[str, Callable[[str], None]] = {}  # channels whose payload is data
        # Called each time the listener LISTENs to the channel (a new session may have missed
        # what was sent while it had none).
        self._on_listening: dict[str, Callable[[], None]] = {}
        self.listening: set[str] = set()  # the channels the listener has LISTENed to
        self._repeats: dict[tuple[str, str], tuple[float, float]] = {}  # -> (every, next at)
        self.enabled = True  # tests turn in-process wake-ups off to prove the polling path

    @contextmanager
    def subscribe(self, key: str, event: threading.Event | None = None):
        """Yield an Event (a new one, or the given one) set whenever `key` is published."""
        event = event or threading.Event()
        self.add(key, event)
        try:
            yield event
        finally:
            self.discard(key, event)

    def add(self, key: str, event: Waiter, *, listen: bool = True) -> None:
        """Set `event` whenever `key` is published, until discarded.

        `listen=False` takes only this process's own publications, not other processes' writes.
        """
        with self._lock:
            self._waiters[key].add(event)
            if listen:
                self._channels.add(CHANNEL_OF[key.split(":", 1)[0] + ":"])
        if listen:
            self._ensure_listening()

    def listen_to(
        self,
        channel: str,
        handler: Callable[[str], None],
        on_listening: Callable[[], None] | None = None,
    ) -> None:
        """Hand every notification on `channel` to `handler(payload)` (PostgreSQL only).

        `on_listening()` runs whenever the listener starts listening there, in a new session too.
        """
        with self._lock:
            self._handlers[channel] = handler
            if on_listening is not None:
                self._on_listening[channel] = on_listening
            self._channels.add(channel)
        self._ensure_listening()

    def repeat(self, channel: str, payload: str, every: float) -> None:
        """Notify `channel` with `payload` now and every `every` seconds, until told to stop.

        The first is sent once the listener LISTENs to every channel asked for before it.
        """
        with self._lock:
            self._repeats[(channel, payload)] = (every, 0.0)
        self._ensure_listening()

    def announced(self, channel: str, payload: str) -> bool:
        """Say whether a repeated notification has gone out at least once in this session."""
        with self._lock:
            return self._repeats.get((channel, payload), (0.0, 0.0))[1] > 0

    def stop_repeating(self, channel: str, payload: str) -> None:
        with self._lock:
            self._repeats.pop((channel, payload), None)

    def discard(self, key: str, event: Waiter) -> None:
        with self._lock:
            waiters = self._waiters.get(key)
            if waiters is not None:
                waiters.discard(event)
                if not waiters:
                    del self._waiters[key]

    def publish(self, key: str) -> None:
        if not self.enabled:
            return
        with self._lock:
            waiters = list(self._waiters.get(key, ()))
        for event in waiters:
            event.set()

    def _ensure_listening(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        if connections["default"].vendor != "postgresql":
            return
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._stop.clear()
                self._thread = threading.Thread(
                    target=self._listen, name="agenttasks-listen", daemon=True
                )
                self._thread.start()

    def stop(self) -> None:
        """Stop the listener thread (tests do this before the test database is dropped)."""
        self._stop.set()
        thread = self._thread
        if thread is not None:
            thread.join(5)
        self._thread = None

    def _needed(self) -> set[str]:
        """The channels this process's waiters and handlers need now."""
        with self._lock:
            prefixes = {key.split(":", 1)[0] + ":" for key in self._waiters}
            return {c for c in self._channels if c in self._handlers or CHANNELS.get(c) in prefixes}

    def _send_repeats(self, conn) -> None:
        now = time.monotonic()
        with self._lock:
            due = [key for key, (_, at) in self._repeats.items() if at <= now]
            for key in due:
                self._repeats[key] = (self._repeats[key][0], now + self._repeats[key][0])
        for channel, payload in due:
            conn.execute("SELECT pg_notify(%s, %s)", [channel, payload])

    def _listen(self) -> None:
        while not self._stop.is_set():
            try:
                # Named for the process: the reaper reads a connected listener as a sign of life.
                name = listener_name(process_name())
                with raw_connection(connections["default"].settings_dict, name) as conn:
                    listening = self.listening = set()
                    with self._lock:  # a new session: say every repeated notification again
                        self._repeats = {k: (every, 0.0) for k, (every, _) in self._repeats.items()}
                    renew_at = 0.0
                    while not self._stop.is_set():
                        new = self._channels - listening
                        if new & GATED_CHANNELS or time.monotonic() >= renew_at:
                            _say_listened(conn, self._needed() & GATED_CHANNELS)
                            renew_at = time.monotonic() + LISTENED_RENEW
                        if new:
                            # Every channel again, in one statement (LISTEN twice is harmless):
                            # the session's last query then names all it listens to.
                            channels = sorted(listening | new)
                            conn.execute("; ".join(f"LISTEN {c}" for c in channels))
                            listening.update(new)
                            for channel in sorted(new):
                                started = self._on_listening.get(channel)
                                if started is not None:
                                    started()
                        self._send_repeats(conn)
                        for note in conn.notifies(timeout=LISTEN_POLL):
                            handler = self._handlers.get(note.channel)
                            if handler is not None:
                                handler(note.payload)
                            else:
                                self.publish(CHANNELS.get(note.channel, "") + note.payload)
            except Exception:
                if self._stop.is_set():
                    return
                logger.warning("listen.reconnect", exc_info=True)
                self._stop.wait(1.0)


def _say_listened(conn, channels: set[str]) -> None:
    """Say that this process listens to `channels` for the next LISTENED_FOR seconds.

    A failure is logged, not raised: the waiters still poll, and the listener still LISTENs.
    """
    if not channels:
        return
    from ..models import ListenedChannel  # lazily: the app registry is ready by now

    table = ListenedChannel._meta.db_table
    try:
        # In the channels' order, so that two processes saying so at once never deadlock.
        conn.execute(
            f"INSERT INTO {table} (channel, until)"
            " SELECT channel, now() + make_interval(secs => %s)"
            " FROM unnest(%s::text[]) AS channel"
            f" ON CONFLICT (channel) DO UPDATE SET until = greatest({table}.until, excluded.until)",
            [LISTENED_FOR, sorted(channels)],
        )
    except Exception:
        logger.warning("listen.listened_not_said channels=%s", sorted(channels), exc_info=True)


def process_name() -> str:
    """Name this process: its host and pid (a worker process's identity)."""
    return f"{HOST}:{os.getpid()}"


def listener_name(process: str) -> str:
    """Name the listener session of a process (PostgreSQL keeps 63 bytes of a session's name)."""
    return (LISTENER_PREFIX + process)[:63]


def raw_connection(settings: dict, application_name: str | None = None):
    """Return a psycopg connection of its own (autocommit) to the database of Django's `settings`."""
    import psycopg  # lazily: an optional dependency, needed on PostgreSQL only

    params = {
        "dbname": settings["NAME"],
        "user": settings.get("USER") or None,
        "password": settings.get("PASSWORD") or None,
        "host": settings.get("HOST") or None,
        "port": settings.get("PORT") or None,
        "application_name": application_name,
    }
    return psycopg.connect(autocommit=True, **{k: v for k, v in params.items() if v})


hub = Hub()
