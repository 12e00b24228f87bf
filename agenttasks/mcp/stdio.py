"""MCP over stdio, for a host that starts the server as a command (`manage.py agenttasks_mcp`).

Newline-delimited JSON-RPC on stdin and stdout, for one user: the same methods, tools and texts
as the HTTP endpoint (dispatch.py). Each request runs in a thread of its own, so a call that
waits does not hold up the next message (a cancel, an elicitation's answer). Stdout carries
protocol messages only: everything else the process prints goes to stderr.

The era is read from the messages: `initialize` opens one 2025-11-25 session for the process
(and a watcher that sends its notices, notices.py); a request carrying the 2026-07-28 envelope
in `params._meta` is served statelessly, on the user's caller conversation. On both, a call is
cancelled by `notifications/cancelled` (stdio has no stream to close).
"""

import json
import logging
import sys
import threading
from typing import IO, Any

from django.db import close_old_connections, connection

from ..conf import app_settings
from ..toolkit import streams
from ..toolkit.streams import Follower
from . import dispatch, protocol, sessions
from .calls import Exchange
from .notices import NoticeFollower

logger = logging.getLogger(__name__)


class StdioServer:
    """Serve one user's MCP client over a pair of byte streams."""

    def __init__(self, user: Any, reader: IO[bytes], writer: IO[bytes]):
        self.caller = sessions.Caller(user)
        self.reader, self.writer = reader, writer
        self.session: sessions.Session | None = None
        self.lock = threading.Lock()
        self.closed = threading.Event()

    # --- out ---------------------------------------------------------------------------------

    def frame(self, message: dict) -> str:
        return protocol.dumps(message) + "\n"

    def write(self, text: str) -> None:
        if not text or text == streams.KEEPALIVE:
            return
        with self.lock:
            self.writer.write(text.encode("utf-8"))
            self.writer.flush()

    def send(self, message: dict) -> None:
        self.write(self.frame(message))

    # --- in ----------------------------------------------------------------------------------

    def serve(self) -> None:
        """Read messages until stdin closes; each is handled in a thread of its own."""
        limit = int(app_settings.MAX_REQUEST_BYTES)
        for line in self.reader:
            if not line.strip():
                continue
            if len(line) > limit:
                error = protocol.invalid_request(f"The message is larger than {limit} bytes")
                self.send(protocol.error_response(None, error))
                continue
            try:
                message = protocol.read(json.loads(line.decode("utf-8")))
            except (ValueError, RecursionError):
                self.send(protocol.error_response(None, protocol.McpError(-32700, "Parse error")))
                continue
            except protocol.McpError as error:
                self.send(protocol.error_response(None, error))
                continue
            threading.Thread(target=self.handle, args=(message,), daemon=True).start()
        self.closed.set()

    def handle(self, message: protocol.Message) -> None:
        request_id = message.id if message.kind == protocol.REQUEST else None
        try:
            self.dispatch(message)
        except protocol.McpError as error:
            if message.kind == protocol.REQUEST:
                self.send(protocol.error_response(request_id, error))
        except Exception:
            logger.exception("mcp.stdio_failed method=%s", message.method)
            if message.kind == protocol.REQUEST:
                self.send(protocol.error_response(request_id, protocol.internal_error()))
        finally:
            connection.close()  # this thread's own connection

    def dispatch(self, message: protocol.Message) -> None:
        close_old_connections()
        if message.kind == protocol.REQUEST and message.method == "initialize":
            session, response = dispatch.initialize(self.caller, message)
            self.session = session
            self.send(response)
            threading.Thread(target=self.watch, args=(session,), daemon=True).start()
            return
        session = self.session_of(message)
        if message.kind == protocol.NOTIFICATION:
            dispatch.notified(session, message)
            return
        if message.kind == protocol.RESPONSE:
            dispatch.responded(session, message)
            return
        exchange = Exchange(session, message, frame=self.frame, streaming=True)
        out = dispatch.answer(exchange)
        if isinstance(out, Follower):
            for text in streams.sync_stream(out):
                self.write(text)
        else:
            self.send(out)

    def session_of(self, message: protocol.Message) -> sessions.Session:
        if "io.modelcontextprotocol/protocolVersion" in message.meta:
            return sessions.for_caller(self.caller, protocol.envelope(message, None))
        if self.session is not None:
            return self.session
        if message.kind != protocol.REQUEST:  # a 2026-07-28 notification carries no envelope
            modern = protocol.Envelope(protocol.MODERN[-1], {})
            return sessions.for_caller(self.caller, modern)
        raise protocol.invalid_request(
            "Send initialize first, or a 2026-07-28 request with its envelope in params._meta"
        )

    def watch(self, session: sessions.Session) -> None:
        """Send the session's notices while the client is connected (one stream after another)."""
        try:
            while not self.closed.is_set():
                for text in streams.sync_stream(NoticeFollower(session, self.frame)):
                    self.write(text)
                    if self.closed.is_set():
                        return
        except Exception:
            logger.exception("mcp.stdio_watch_failed")
        finally:
            connection.close()


def serve(user: Any) -> None:
    """Serve MCP on this process's stdin and stdout until stdin closes."""
    reader, writer = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # whatever else prints must not corrupt the protocol
    StdioServer(user, reader, writer).serve()
