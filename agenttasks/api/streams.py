"""The events stream (docs/rest.md#the-live-stream): Server-Sent Events over one conversation's log.

A stream sends a snapshot (no `id:`), replays the events after the resume point, then sends each
new event as it is committed. It waits on the in-process hub, which PostgreSQL NOTIFY also feeds,
and polls every POLL seconds as well, so a write by any process on any database reaches the
client within 250 ms. Events are read by `seq > last sent`, and every writer numbers events under
the conversation's row lock until it commits, so a stream never skips or repeats one.

The same `EventStream` is driven by a generator under WSGI (one thread per open stream) and by an
async generator under ASGI (the database reads run in the request's own thread).

Each open stream holds one of its user's MAX_STREAMS_PER_USER places (api.slots), renewed while it
runs and given back when it ends. A WSGI stream checks its connection every CLIENT_CHECK seconds
and ends when the client has gone; under ASGI the server cancels it at the disconnect.
"""

import asyncio
import collections
import json
import logging
import time
from collections.abc import Callable, Collection

from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIRequest
from django.http import StreamingHttpResponse

from .. import deltas
from ..conf import app_settings
from ..listen import conversation_key, hub
from ..models import Conversation, Event, Run, Task
from ..states import RUN_ACTIVE, TERMINAL
from . import errors, slots
from .serializers import EventSerializer, TaskSerializer, pending_actions

logger = logging.getLogger("agenttasks.api")

POLL = 0.2  # the polling fallback: well under the 250 ms a new event may take to arrive
DELETED_CHECK = 1.0
CLIENT_CHECK = 1.0
BATCH = 200
KEEPALIVE = ": keep-alive\n\n"
ERROR_FRAME = (
    "event: error\ndata: "
    + json.dumps(
        {"error": {"code": "INTERNAL_ERROR", "message": errors.INTERNAL_MESSAGE}},
        separators=(",", ":"),
    )
    + "\n\n"
)


def _json(value) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def frame(event: Event) -> str:
    """Return one event as `id:`, `event:` and a one-line `data:`."""
    return (
        f"id: {event.seq}\nevent: {event.type}\ndata: {_json(EventSerializer.present(event))}\n\n"
    )


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

    def __init__(self, held: slots.Held | None = None, client_fd: int | None = None):
        self.held = held or slots.Held(None, "", 0)
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
        return slots.gone(self.client_fd)

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


class EventStream(Follower):
    """What one open stream has sent, and how to read what comes next."""

    def __init__(
        self,
        conversation_id: str,
        task_id: str | None,
        resume: int | None,
        until: bool,
        held: slots.Held | None = None,
        client_fd: int | None = None,
    ):
        super().__init__(held, client_fd)
        self.conversation_id = conversation_id
        self.task_id = task_id
        self.resume = resume
        self.until_terminal = until
        self.deltas: collections.deque = collections.deque()  # (run id, piece), not yet sent
        self._reader: Callable[[str, str], None] | None = None

    def release(self) -> None:
        self.detach()
        super().release()

    def failed(self, exc: Exception) -> str:
        logger.error("api.stream_failed conversation=%s", self.conversation_id, exc_info=exc)
        return ERROR_FRAME

    # --- transient deltas (message.delta: never stored, no id, never replayed) ----------------

    def attach(self, woken) -> None:
        """Receive the deltas of the conversation's runs while the stream is open."""

        def reader(run_id: str, piece: str) -> None:
            self.deltas.append((run_id, piece))
            woken.set()

        self._reader = reader
        deltas.subscribe(self.conversation_id, reader)

    def detach(self) -> None:
        if self._reader is not None:
            deltas.unsubscribe(self.conversation_id, self._reader)
            self._reader = None

    def pending(self) -> str:
        """Return what waits to be sent without reading the database: the deltas received."""
        return self.delta_frames()

    def delta_frames(self) -> str:
        """Return the deltas received since the last call, as `message.delta` frames without `id:`."""
        out = []
        while self.deltas:
            run_id, piece = self.deltas.popleft()
            out.append(
                f"event: message.delta\ndata: {_json({'runId': run_id, 'delta': piece})}\n\n"
            )
        return "".join(out)

    # --- reads (each runs in a thread that may use the ORM) -----------------------------------

    def opening(self) -> list[str]:
        """Return the snapshot, then the replay of the events after the resume point."""
        return [self.snapshot(), self.replay()]

    def snapshot(self) -> str:
        """Return the first message: the conversation's state now. Sets the resume point."""
        conversation = Conversation.objects.get(pk=self.conversation_id)
        body = {"conversationId": conversation.id, "lastSeq": conversation.last_seq}
        if self.task_id:
            task = (
                Task.objects.select_related("run")
                .prefetch_related("files")
                .filter(pk=self.task_id)
                .first()
            )
            if task is not None:
                body["task"] = TaskSerializer.present(task)
        actions = pending_actions(conversation.id)
        if actions:
            body["pendingActions"] = actions
        active = (
            Run.objects.filter(conversation_id=conversation.id, status__in=RUN_ACTIVE)
            .order_by("-created_at", "-id")
            .values_list("id", flat=True)
            .first()
        )
        if active:
            body["activeRunId"] = active
        self.last = conversation.last_seq if self.resume is None else self.resume
        return f"event: snapshot\ndata: {_json(body)}\n\n"

    def replay(self) -> str:
        """Return every event after the resume point; ends the stream if the task is already over."""
        chunks = []
        while not self.done:
            text, count = self._read()
            chunks.append(text)
            if count < BATCH:
                break
        if not self.done and self.until_terminal and self._task_over():
            self.done = True
        return "".join(chunks)

    def poll(self) -> str:
        """Return the events committed since the last read ("" when none); notices a deletion."""
        text, count = self._read()
        if not count and self.deleted():
            self.done = True
        return text

    def _read(self) -> tuple[str, int]:
        events = self.next_events()
        out = []
        for event in events:
            out.append(frame(event))
            self.last = event.seq
            if self.until_terminal and self._ends_stream(event):
                self.done = True
                break
        return "".join(out), len(events)

    def _ends_stream(self, event: Event) -> bool:
        """A terminal task.status of the conversation's own task, not since superseded."""
        return (
            event.type == "task.status"
            and event.task_id == self.task_id
            and (event.data or {}).get("to") in TERMINAL
            and not Event.objects.filter(
                conversation_id=self.conversation_id,
                type="task.status",
                task_id=self.task_id,
                seq__gt=event.seq,
            ).exists()
        )

    def _task_over(self) -> bool:
        return Task.objects.filter(pk=self.task_id, status__in=TERMINAL).exists()


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
