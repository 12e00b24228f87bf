"""The events stream (docs/rest.md#the-live-stream): Server-Sent Events over one conversation's log.

A stream sends a snapshot (no `id:`), replays the events after the resume point, then sends each
new event as it is committed (a `toolkit.streams` driver serves it). Events are read by
`seq > last sent`, and every writer numbers events under the conversation's row lock until it
commits, so a stream never skips or repeats one. The admin's live page follows the same stream.
"""

import collections
import json
import logging
from collections.abc import Callable

from ..broker import deltas
from ..models import Conversation, Event, Run, Task
from ..states import TERMINAL
from ..toolkit import caps, errors
from ..toolkit.streams import BATCH, Follower
from .serializers import EventSerializer, TaskSerializer, pending_actions

logger = logging.getLogger("agenttasks.api")

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


class EventStream(Follower):
    """What one open stream has sent, and how to read what comes next."""

    def __init__(
        self,
        conversation_id: str,
        task_id: str | None,
        resume: int | None,
        until: bool,
        held: caps.Held | None = None,
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
            Run.objects.active()
            .filter(conversation_id=conversation.id)
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
