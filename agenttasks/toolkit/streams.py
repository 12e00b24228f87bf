"""Following a conversation's log as a live stream: what every surface's stream serves.

A `Follower` follows one conversation: it opens (a snapshot, a replay), then sends what each new
committed event or transient delta brings. `sync_stream` drives it under WSGI (one thread per open
stream) and `async_stream` under ASGI (the database reads run in the request's own thread). The
driver waits on the in-process hub, which PostgreSQL NOTIFY also feeds, and polls every POLL
seconds as well, so a write by any process on any database reaches the client within 250 ms.

Each open stream holds one of its user's MAX_STREAMS_PER_USER places (toolkit.caps), renewed while
it runs and given back when it ends. A WSGI stream checks its connection every CLIENT_CHECK seconds
and ends when the client has gone; under ASGI the server cancels it at the disconnect. REST's
events stream is `api.streams.EventStream`; A2A and MCP follow with followers of their own.
"""

import asyncio
import logging
import time
from collections.abc import Collection

from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIRequest
from django.http import StreamingHttpResponse

from ..broker.listen import conversation_key, hub
from ..conf import app_settings
from ..models import Conversation, Event
from . import caps

logger = logging.getLogger("agenttasks.api")

POLL = 0.2  # the polling fallback: well under the 250 ms a new event may take to arrive
DELETED_CHECK = 1.0
CLIENT_CHECK = 1.0
BATCH = 200
KEEPALIVE = ": keep-alive\n\n"


class Follower:
    """What a stream driver (`sync_stream`, `async_stream`) follows: one conversation's log.

    The REST events stream (`EventStream`), an A2A task's (a2a/stream.py) and MCP's (mcp/) are
    followers. `opening` and `poll` read the database (under ASGI in the request's thread);
    `pending` does not. A follower sets `done` when it has sent its last frame. This class holds
    what every follower shares: its place under the user's cap (`held`), renewed while it runs,
    and whether its WSGI client has gone.
    """

    conversation_id: str
    last = 0  # the seq of the last event read

    def __init__(self, held: caps.Held | None = None, client_fd: int | None = None):
        self.held = held or caps.Held(None, "", 0)
        self.client_fd = client_fd
        self.done = False
        self._client_checked = self._renewed = self._deletion_checked = time.monotonic()

    def attach(self, woken) -> None:
        """Receive what is transient while the stream is open (nothing, unless overridden)."""

    def opening(self) -> list[str]:
        raise NotImplementedError

    def poll(self) -> str:
        raise NotImplementedError

    def pending(self) -> str:
        """Return what waits to be sent without reading the database ("" unless overridden)."""
        return ""

    def failed(self, exc: Exception) -> str:
        raise NotImplementedError

    def client_gone(self) -> bool:
        """Say whether the (WSGI) client closed the connection; checked every CLIENT_CHECK seconds."""
        now = time.monotonic()
        if now - self._client_checked < CLIENT_CHECK:
            return False
        self._client_checked = now
        return caps.gone(self.client_fd)

    def place_due(self) -> bool:
        """Say whether the place's lease is a third of the way through (time to renew it)."""
        return time.monotonic() - self._renewed >= self.held.seconds / 3

    def keep_place(self) -> None:
        """Renew the place's lease; end the stream if the place was lost meanwhile."""
        self._renewed = time.monotonic()
        if not self.held.renew():
            logger.warning("api.stream_slot_lost conversation=%s", self.conversation_id)
            self.done = True

    def deleted(self) -> bool:
        """Say whether the conversation is being deleted or gone; read every DELETED_CHECK seconds."""
        now = time.monotonic()
        if now - self._deletion_checked < DELETED_CHECK:
            return False
        self._deletion_checked = now
        return not Conversation.objects.visible().filter(pk=self.conversation_id).exists()

    def next_events(self, types: Collection[str] = ()) -> list[Event]:
        """Return the conversation's next events after `last` (of `types`, if any), BATCH at most."""
        events = Event.objects.filter(conversation_id=self.conversation_id, seq__gt=self.last)
        if types:
            events = events.filter(type__in=types)
        return list(events.order_by("seq")[:BATCH])

    def release(self) -> None:
        self.held.release()


def _settings() -> tuple[float, float]:
    return float(app_settings.STREAM_KEEPALIVE_SECONDS), float(app_settings.STREAM_MAX_SECONDS)


def sync_stream(stream: Follower):
    """Drive a stream from a WSGI worker thread."""
    keepalive, limit = _settings()
    started = time.monotonic()
    try:
        with hub.subscribe(conversation_key(stream.conversation_id)) as woken:
            stream.attach(woken)
            for text in stream.opening():
                if text:
                    yield text
            sent = time.monotonic()
            while not stream.done and time.monotonic() - started < limit:
                woken.clear()
                # Deltas first: a reply's pieces come before the message that stores it.
                text = stream.pending() + stream.poll()
                if text:
                    yield text
                    sent = time.monotonic()
                    continue
                if stream.done or stream.client_gone():
                    break
                if stream.place_due():
                    stream.keep_place()
                if time.monotonic() - sent >= keepalive:
                    yield KEEPALIVE
                    sent = time.monotonic()
                woken.wait(POLL)
    except GeneratorExit:
        raise
    except Exception as exc:
        yield stream.failed(exc)
    finally:
        stream.release()


async def async_stream(stream: Follower):
    """Drive a stream from the event loop (ASGI); the ORM runs in the request's thread."""
    keepalive, limit = _settings()
    started = time.monotonic()
    try:
        with hub.subscribe(conversation_key(stream.conversation_id)) as woken:
            stream.attach(woken)
            for text in await sync_to_async(stream.opening)():
                if text:
                    yield text
            sent = time.monotonic()
            while not stream.done and time.monotonic() - started < limit:
                woken.clear()
                text = stream.pending() + await sync_to_async(stream.poll)()
                if text:
                    yield text
                    sent = time.monotonic()
                    continue
                if stream.done:
                    break
                if stream.place_due():
                    await sync_to_async(stream.keep_place)()
                if time.monotonic() - sent >= keepalive:
                    yield KEEPALIVE
                    sent = time.monotonic()
                waited = 0.0
                while waited < POLL and not woken.is_set():
                    await asyncio.sleep(0.02)
                    waited += 0.02
    except (GeneratorExit, asyncio.CancelledError):
        raise
    except Exception as exc:
        yield stream.failed(exc)
    finally:
        # Also after a disconnect (the server cancels this task): give the place back now.
        await sync_to_async(stream.release)()


def serve(stream: Follower, request) -> "StreamResponse":
    """Return the streaming response of a follower, driven as the server runs (WSGI or ASGI)."""
    asgi = isinstance(request, ASGIRequest)
    return StreamResponse(async_stream(stream) if asgi else sync_stream(stream), stream)


class StreamResponse(StreamingHttpResponse):
    """An SSE response that gives its place back when the server closes it, even if it never
    started iterating (a generator that never ran has no `finally` to run)."""

    def __init__(self, content, stream: Follower):
        super().__init__(content, content_type="text/event-stream")
        self.stream = stream
        self["Cache-Control"] = "no-cache"
        self["X-Accel-Buffering"] = "no"

    def close(self):
        try:
            self.stream.release()
        finally:
            super().close()
