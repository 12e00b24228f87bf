"""Who an MCP request acts for, and the conversation its tasks belong to.

Every task an MCP client starts is a task of one conversation that belongs to the client: the
conversation with no agent behind it (`lifecycle.host_conversation`). Its id is known before the
row exists, and the row is made by the first call that needs it, so a client that only lists the
tools leaves nothing behind:

- 2025-11-25 (the `initialize` handshake): one conversation per MCP session. The session id
  (`Mcp-Session-Id`) is signed with the site's SECRET_KEY and names the conversation, the
  principal, the negotiated version and whether the client declared form elicitation; a request
  of another principal, or with an id this server did not sign, is "Session not found".
- 2026-07-28 (stateless): one conversation per caller, its id derived from the principal (an
  HMAC of the user id under SECRET_KEY), so every request of a caller finds the same tasks.
"""

import hashlib
import hmac
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core import signing

from .. import ids, lifecycle
from ..models import Conversation
from ..toolkit.identity import user_of
from . import protocol

SESSION_SALT = "agenttasks.mcp.session"
TITLE = "MCP client"


@dataclass
class Caller:
    """The principal an MCP request acts for (a user, or None for the anonymous principal).

    `request` is the DRF request over HTTP (slots and throttles read it), None over stdio;
    `mount_url` is the app's absolute URL, for links to result files ("" over stdio).
    """

    user: Any
    request: Any = None
    mount_url: str = ""

    @classmethod
    def of(cls, request, mount_url: str = "") -> "Caller":
        return cls(user_of(request), request, mount_url)

    @property
    def owner_id(self):
        return self.user.pk if self.user is not None else None


@dataclass
class Session:
    """What one request runs in: its caller, its version and its conversation."""

    caller: Caller
    version: str
    conversation_id: str
    elicitation: bool = False  # the client declared form elicitation
    token: str = ""  # 2025-11-25: the Mcp-Session-Id
    tasks: bool = False  # 2026-07-28: the request declares the tasks extension (extension.py)

    @property
    def modern(self) -> bool:
        return self.version in protocol.MODERN

    def conversation(self) -> Conversation:
        """Return the session's conversation, made now if it is not yet (ConversationNotFound:
        gone)."""
        return lifecycle.host_conversation(
            self.conversation_id,
            owner=self.caller.user,
            title=TITLE,
            metadata={"source": "mcp", "protocolVersion": self.version},
        )

    def started(self) -> bool:
        """Say whether the conversation exists (a session that never started a task has none)."""
        return Conversation.objects.filter(pk=self.conversation_id).exists()


def open_session(caller: Caller, version: str, capabilities: Any) -> Session:
    """Open a new 2025-11-25 session (the answer to `initialize`), with its signed id."""
    conversation_id = ids.new_conversation_id()
    elicitation = protocol.form_elicitation(capabilities)
    payload = {"c": conversation_id, "u": caller.owner_id, "v": version, "e": elicitation}
    token = signing.dumps(payload, salt=SESSION_SALT, compress=True)
    return Session(caller, version, conversation_id, elicitation, token)


def not_found() -> protocol.McpError:
    return protocol.invalid_request("Session not found", status=404)


def resume(caller: Caller, token: str | None) -> Session:
    """Return the 2025-11-25 session a request names (400 without one, 404 for one not the
    caller's)."""
    if not token:
        raise protocol.invalid_request("Bad Request: Missing session ID")
    try:
        payload = signing.loads(token, salt=SESSION_SALT)
    except signing.BadSignature:
        raise not_found() from None
    if not isinstance(payload, dict) or payload.get("u") != caller.owner_id:
        raise not_found()
    conversation_id, version = payload.get("c"), payload.get("v")
    if not isinstance(conversation_id, str) or version not in protocol.HANDSHAKE:
        raise not_found()
    return Session(caller, version, conversation_id, bool(payload.get("e")), token)


def caller_conversation_id(owner_id) -> str:
    """Return the conversation of a caller's 2026-07-28 requests, derived from the principal."""
    key = settings.SECRET_KEY.encode()
    digest = hmac.new(key, f"{SESSION_SALT}.caller:{owner_id}".encode(), hashlib.sha256).digest()
    return "conv_" + "".join(ids.ALPHABET[b & 63] for b in digest[: ids.ID_LENGTH])


def for_caller(caller: Caller, envelope: protocol.Envelope) -> Session:
    """Return the session of a 2026-07-28 request: the caller's own conversation."""
    return Session(
        caller,
        envelope.version,
        caller_conversation_id(caller.owner_id),
        envelope.elicitation,
        tasks=envelope.tasks,
    )
