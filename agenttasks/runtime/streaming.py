"""Streamed chat completions (docs/delegation.md#streaming): read the server's SSE chunks.

With `stream: true` an OpenAI-compatible server answers `text/event-stream`: one
`data: <chunk>` line per piece, `data: [DONE]` at the end. Each chunk's `choices[0].delta` holds a
piece of the content and pieces of tool calls (by `index`: the `id` and the name come first, the
`arguments` string in pieces); with `stream_options.include_usage` a last chunk carries `usage`.
The Accumulator joins them into the message a non-streamed answer would have had, and hands each
content piece on as it arrives.
"""

import json
from collections.abc import Callable


class StreamError(ValueError):
    """A stream the server broke; the client reports it as a ModelError."""


class StreamCut(StreamError):
    """A stream that ended before it said it was complete: a failure that may pass."""


CUT_TEXT = "Model server stream ended before the reply was complete"


class Accumulator:
    """Join streamed chunks into one message; each content piece also goes to `on_piece`."""

    def __init__(self, on_piece: Callable[[str], None] | None = None):
        self.parts: list[str] = []
        self.calls: dict[int, dict] = {}
        self.usage = None
        self.on_piece = on_piece
        self.done = False  # [DONE] came
        self.finished = False  # a chunk gave a finish_reason
        self.finish_reason = ""
        self.seen_content = False

    def line(self, line: str) -> None:
        """Take one line of the event stream (comments, event names and blanks are ignored)."""
        if not line.startswith("data:"):
            return
        data = line[5:].strip()
        if data == "[DONE]":
            self.done = True
            return
        try:
            chunk = json.loads(data)
        except ValueError:
            raise StreamError(f"Model server sent a malformed stream chunk: {data[:200]}") from None
        if not isinstance(chunk, dict):
            return
        if isinstance(chunk.get("error"), dict):
            message = chunk["error"].get("message") or "error"
            raise StreamError(f"Model server stream failed: {message}")
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        choices = chunk.get("choices") or []
        if choices and isinstance(choices[0], dict) and choices[0].get("finish_reason"):
            self.finished = True
            self.finish_reason = str(choices[0]["finish_reason"])
        delta = choices[0].get("delta") if choices and isinstance(choices[0], dict) else None
        if isinstance(delta, dict):
            self._delta(delta)

    def _delta(self, delta: dict) -> None:
        piece = delta.get("content")
        if isinstance(piece, str):
            self.seen_content = True
            if piece:
                self.parts.append(piece)
                if self.on_piece is not None:
                    self.on_piece(piece)
        for call in delta.get("tool_calls") or []:
            if not isinstance(call, dict):
                continue
            index = call.get("index", len(self.calls))
            slot = self.calls.setdefault(
                index, {"id": "", "type": "function", "function": {"name": "", "arguments": ""}}
            )
            if call.get("id"):
                slot["id"] = call["id"]
            if call.get("type"):
                slot["type"] = call["type"]
            function = call.get("function") or {}
            if isinstance(function.get("name"), str):
                slot["function"]["name"] += function["name"]
            if isinstance(function.get("arguments"), str):
                slot["function"]["arguments"] += function["arguments"]

    def ended(self) -> None:
        """Take the end of the stream: one that never said it was complete ([DONE] or a
        finish_reason) was cut, and its text is not a reply."""
        if not (self.done or self.finished):
            raise StreamCut(CUT_TEXT)

    def message(self) -> tuple[dict, object]:
        """Return the joined message (as `choices[0].message` would be) and the usage."""
        message: dict = {"content": "".join(self.parts) if self.seen_content else None}
        if self.calls:
            message["tool_calls"] = [self.calls[i] for i in sorted(self.calls)]
        return message, self.usage
