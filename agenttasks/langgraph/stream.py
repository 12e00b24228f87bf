"""A run's stream in LangGraph's events (docs/langgraph.md#streaming), read from the event log
the REST stream reads (a `toolkit.streams` follower, served under WSGI and ASGI alike).

- `metadata` first: `{run_id, attempt}`;
- `values`: the thread's values after each message the run writes, and once it settles (with
  `__interrupt__` when it stopped at one);
- `updates`: `{"agent": {"messages": [message]}}` per message, `{"__interrupt__": [...]}`;
- `messages` (mode `messages-tuple`): each piece of the reply as it streams, `[chunk, metadata]`;
- `custom`: the run's progress;
- `error` when the run failed. An event from the log carries its `seq` as `id:`, so a join with
  `Last-Event-ID` replays nothing already sent.
"""

import collections
import json
import logging
from collections.abc import Callable

from ..broker import deltas
from ..models import Event, Run
from ..states import RUN_ENDED, RunStatus
from ..toolkit import caps
from ..toolkit.streams import Follower
from . import shapes

logger = logging.getLogger("agenttasks.langgraph")
WRITTEN = ("message.user", "message.assistant", "tool.result", "task.notification")
WATCHED = (*WRITTEN, "task.progress", "run.progress")


def _json(value) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str)


def frame(event: str, data, seq: int | None = None) -> str:
    head = f"id: {seq}\n" if seq is not None else ""
    return f"{head}event: {event}\ndata: {_json(data)}\n\n"


class RunStream(Follower):
    """One run followed in LangGraph's stream modes until it ends or stops at an interrupt."""

    def __init__(
        self,
        conversation_id: str,
        run_id: str,
        modes: list[str],
        *,
        after: int | None = None,
        joined: bool = False,
        held: caps.Held | None = None,
        client_fd: int | None = None,
    ):
        super().__init__(held, client_fd)
        self.conversation_id, self.run_id, self.modes = conversation_id, run_id, set(modes)
        self.joined = joined
        self.resume = after
        self.pieces: collections.deque = collections.deque()
        self._reader: Callable[[str, str], None] | None = None

    # --- transient pieces of the reply ----------------------------------------------------------

    def attach(self, woken) -> None:
        if "messages-tuple" not in self.modes:
            return

        def reader(run_id: str, piece: str) -> None:
            if run_id == self.run_id:
                self.pieces.append(piece)
                woken.set()

        self._reader = reader
        deltas.subscribe(self.conversation_id, reader)

    def release(self) -> None:
        if self._reader is not None:
            deltas.unsubscribe(self.conversation_id, self._reader)
            self._reader = None
        super().release()

    def pending(self) -> str:
        out = []
        while self.pieces:
            chunk = {"type": "AIMessageChunk", "content": self.pieces.popleft(), "id": self.run_id}
            out.append(frame("messages", [chunk, self.tags()]))
        return "".join(out)

    def tags(self) -> dict:
        return {
            "run_id": self.run_id,
            "langgraph_node": shapes.NODE,
            "thread_id": self.conversation_id,
        }

    # --- reads ----------------------------------------------------------------------------------

    def opening(self) -> list[str]:
        run = Run.objects.get(pk=self.run_id)
        out = [frame("metadata", {"run_id": self.run_id, "attempt": max(run.attempt, 1)})]
        if self.resume is not None:
            self.last = self.resume  # a join that reconnects: nothing already sent again
        elif self.joined:
            self.last = self.started_at_seq()
        else:
            self.last = self.started_at_seq()
            if "values" in self.modes:
                out.append(frame("values", shapes.values(self.conversation_id)))
        return out

    def started_at_seq(self) -> int:
        """The seq before the run's first event (its message), so it is streamed too."""
        first = (
            Event.objects.filter(conversation_id=self.conversation_id, run_id=self.run_id)
            .order_by("seq")
            .values_list("seq", flat=True)
            .first()
        )
        if first is not None:
            return first - 1
        return (
            Event.objects.filter(conversation_id=self.conversation_id)
            .order_by("-seq")
            .values_list("seq", flat=True)
            .first()
            or 0
        )

    def poll(self) -> str:
        # The run first: a run read settled has committed every event it wrote, so the read of
        # the log after it misses none of them.
        run = Run.objects.filter(pk=self.run_id).first()
        out = []
        while batch := self.next_events(WATCHED):
            for event in batch:
                self.last = event.seq
                if event.run_id == self.run_id:
                    out.append(self.event_frames(event))
        if run is None or run.status in RUN_ENDED or run.status == RunStatus.PAUSED:
            out.append(self.settled(run))
            self.done = True
        return "".join(out)

    def event_frames(self, event: Event) -> str:
        if event.type in ("task.progress", "run.progress"):
            if "custom" not in self.modes:
                return ""
            return frame("custom", (event.data or {}).get("state") or event.data, event.seq)
        message = shapes.message(event)
        if message is None:
            return ""
        out = []
        if "messages-tuple" in self.modes and event.type in ("message.assistant", "tool.result"):
            out.append(frame("messages", [message, self.tags()], event.seq))
        if "updates" in self.modes:
            out.append(frame("updates", {shapes.NODE: {"messages": [message]}}, event.seq))
        if "values" in self.modes:
            out.append(
                frame("values", shapes.values(self.conversation_id, through=event.seq), event.seq)
            )
        if "debug" in self.modes or "events" in self.modes:
            kind = "debug" if "debug" in self.modes else "events"
            out.append(frame(kind, {"type": event.type, "payload": message}, event.seq))
        return "".join(out)

    def settled(self, run: Run | None) -> str:
        """The last events: an interrupt's, or the error of a failed run."""
        if run is None or run.status == RunStatus.ROLLED_BACK:
            return ""
        if run.status == RunStatus.PAUSED:
            pending = shapes.interrupts(self.conversation_id)
            out = []
            if "updates" in self.modes:
                out.append(frame("updates", {"__interrupt__": pending}))
            if "values" in self.modes:
                values = shapes.values(self.conversation_id)
                out.append(frame("values", {**values, "__interrupt__": pending}))
            return "".join(out)
        if run.status == RunStatus.FAILED:
            return frame("error", {"error": "RunError", "message": run.error})
        return ""

    def failed(self, exc: Exception) -> str:
        logger.error("langgraph.stream_failed run=%s", self.run_id, exc_info=exc)
        return frame("error", {"error": "InternalError", "message": "Internal server error"})
