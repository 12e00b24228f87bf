"""JSON-RPC and the protocol's versions: messages in and out, errors, the 2026-07-28 envelope.

A request is checked against the wire types of the version it speaks (`mcp_types.methods`): a
method that version does not have is METHOD_NOT_FOUND, params of the wrong shape INVALID_PARAMS.
Results are shaped, and checked, the same way before they go out. Every refusal is an `McpError`:
a JSON-RPC error object, and the HTTP status the Streamable HTTP transport answers it with.
"""

import base64
import binascii
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from mcp_types import (
    CLIENT_CAPABILITIES_META_KEY,
    CLIENT_INFO_META_KEY,
    PROTOCOL_VERSION_META_KEY,
    UnsupportedProtocolVersionErrorData,
    methods,
)
from mcp_types.jsonrpc import (
    HEADER_MISMATCH,
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
    UNSUPPORTED_PROTOCOL_VERSION,
)
from mcp_types.version import (
    HANDSHAKE_PROTOCOL_VERSIONS,
    LATEST_HANDSHAKE_VERSION,
    MODERN_PROTOCOL_VERSIONS,
)
from pydantic import ValidationError

HANDSHAKE: tuple[str, ...] = tuple(HANDSHAKE_PROTOCOL_VERSIONS)  # the initialize handshake
MODERN: tuple[str, ...] = tuple(MODERN_PROTOCOL_VERSIONS)  # stateless, per-request envelope
LATEST_HANDSHAKE = LATEST_HANDSHAKE_VERSION

TASKS_EXTENSION = "io.modelcontextprotocol/tasks"  # SEP-2663 (extension.py)
PROTOCOL_HEADER = "MCP-Protocol-Version"
SESSION_HEADER = "Mcp-Session-Id"
METHOD_HEADER = "Mcp-Method"
NAME_HEADER = "Mcp-Name"
# The param a 2026-07-28 client mirrors into Mcp-Name, by method.
NAMED = {"tools/call": "name", "prompts/get": "name", "resources/read": "uri"}

# The HTTP status of a JSON-RPC error (as the SDK's server answers them); others are 200.
HTTP_STATUS = {
    PARSE_ERROR: 400,
    INVALID_REQUEST: 400,
    INVALID_PARAMS: 400,
    HEADER_MISMATCH: 400,
    UNSUPPORTED_PROTOCOL_VERSION: 400,
    METHOD_NOT_FOUND: 404,
    INTERNAL_ERROR: 500,
}
NOT_ONE_MESSAGE = "Body must be a single JSON-RPC request, notification or response object"


class McpError(Exception):
    """A refusal: a JSON-RPC error object and the HTTP status that carries it."""

    def __init__(self, code: int, message: str, data: Any = None, *, status=None, headers=None):
        super().__init__(message)
        self.code, self.message, self.data = code, message, data
        self.status: int = status or HTTP_STATUS.get(code, 200)
        self.headers: dict[str, str] = headers or {}

    def body(self) -> dict:
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.data is not None:
            error["data"] = self.data
        return error


def invalid_request(message: str, **kwargs) -> McpError:
    return McpError(INVALID_REQUEST, message, **kwargs)


def invalid_params(message: str) -> McpError:
    return McpError(INVALID_PARAMS, message)


def method_not_found(method: str) -> McpError:
    return McpError(METHOD_NOT_FOUND, f"Method not found: {method}")


def internal_error() -> McpError:
    return McpError(INTERNAL_ERROR, "An unexpected error occurred")


# --- messages out ------------------------------------------------------------------------------


def response(request_id, result: dict) -> dict:
    return {"jsonrpc": "2.0", "id": request_id, "result": result}


def error_response(request_id, error: McpError) -> dict:
    """Return an error response; `id` is null when the request's own could not be read."""
    return {"jsonrpc": "2.0", "id": request_id, "error": error.body()}


def notification(method: str, params: dict) -> dict:
    return {"jsonrpc": "2.0", "method": method, "params": params}


def server_request(request_id: str, method: str, params: dict) -> dict:
    return {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}


def dumps(message: dict) -> str:
    return json.dumps(message, separators=(",", ":"), ensure_ascii=False)


# --- messages in -------------------------------------------------------------------------------

REQUEST, NOTIFICATION, RESPONSE = "request", "notification", "response"


@dataclass
class Message:
    """One JSON-RPC message as received."""

    kind: str
    id: Any = None
    method: str = ""
    params: dict = field(default_factory=dict)
    raw_params: Any = None  # as sent (None when absent): the version's wire types check it
    result: Any = None
    error: Any = None

    @property
    def meta(self) -> dict:
        meta = self.params.get("_meta")
        return meta if isinstance(meta, dict) else {}


def _plain_id(value) -> bool:
    return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


def read(data: Any) -> Message:
    """Read one JSON-RPC message (a request, a notification or a response); no batches."""
    if not isinstance(data, dict) or data.get("jsonrpc") != "2.0":
        raise invalid_request(NOT_ONE_MESSAGE)
    if "method" in data:
        method, params = data["method"], data.get("params")
        if not isinstance(method, str) or not method:
            raise invalid_request("method must be a non-empty string")
        if params is not None and not isinstance(params, dict):
            raise invalid_request("params must be an object")
        if "id" not in data:
            return Message(NOTIFICATION, method=method, params=params or {}, raw_params=params)
        if not _plain_id(data["id"]):
            raise invalid_request("id must be a string or an integer")
        return Message(REQUEST, data["id"], method, params or {}, raw_params=params)
    has_result, has_error = "result" in data, "error" in data
    if _plain_id(data.get("id")) and has_result != has_error:
        return Message(RESPONSE, data["id"], result=data.get("result"), error=data.get("error"))
    raise invalid_request(NOT_ONE_MESSAGE)


def _fault(exc: ValidationError) -> str:
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first.get("loc", ()) if p != "params")
    return f"Invalid params: {where + ': ' if where else ''}{first.get('msg', 'invalid')}"


def check(message: Message, version: str) -> Any:
    """Check a request against its version's wire types; return it parsed."""
    try:
        return methods.parse_client_request(message.method, version, message.raw_params)
    except KeyError:
        raise method_not_found(message.method) from None
    except ValidationError as exc:
        raise invalid_params(_fault(exc)) from None


def shape(method: str, version: str, result: dict) -> dict:
    """Shape a result as the version's wire types have it (checking it on the way)."""
    if version in MODERN:
        result = {"resultType": "complete", **result}  # 2026-07-28 tags every result
    try:
        return methods.serialize_server_result(method, version, result)
    except KeyError:  # a method the version's tables do not list (ping before 2026, …)
        return result


def negotiate(requested: Any) -> str:
    """Choose the handshake version to answer an initialize with: the client's, if served."""
    return requested if requested in HANDSHAKE else LATEST_HANDSHAKE


def unsupported(requested: Any) -> McpError:
    """UNSUPPORTED_PROTOCOL_VERSION, naming every version served (the modern ones first)."""
    data = UnsupportedProtocolVersionErrorData(
        supported=[*MODERN, *HANDSHAKE], requested=str(requested)
    )
    return McpError(
        UNSUPPORTED_PROTOCOL_VERSION, "Unsupported protocol version", data.model_dump(mode="json")
    )


def form_elicitation(capabilities: Any) -> bool:
    """Say whether client capabilities declare form elicitation (`{}` means form, for old clients)."""
    if not isinstance(capabilities, dict):
        return False
    elicitation = capabilities.get("elicitation")
    return isinstance(elicitation, dict) and ("form" in elicitation or "url" not in elicitation)


# --- the 2026-07-28 envelope -------------------------------------------------------------------


@dataclass
class Envelope:
    """What a 2026-07-28 request says about its client, in `params._meta`."""

    version: str
    capabilities: dict
    client_info: Any = None

    @property
    def elicitation(self) -> bool:
        return form_elicitation(self.capabilities)

    @property
    def tasks(self) -> bool:
        """Whether the client declares the tasks extension on this request."""
        extensions = self.capabilities.get("extensions")
        return isinstance(extensions, dict) and isinstance(extensions.get(TASKS_EXTENSION), dict)


_SENTINEL = re.compile(r"^=\?base64\?(?P<payload>.*)\?=$")


def decode_header(value: str | None) -> str | None:
    """Decode a header value as sent, or the UTF-8 text of a `=?base64?…?=` one (None if malformed)."""
    if value is None:
        return None
    match = _SENTINEL.fullmatch(value)
    if match is None:
        return value
    try:
        decoded = base64.b64decode(match["payload"], validate=True)
        return decoded.decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None


def envelope(message: Message, headers: Mapping[str, str] | None) -> Envelope:
    """Check a 2026-07-28 request's envelope, and its routing headers over HTTP (`headers`).

    The rungs, first failure wins: `_meta` carries the protocol version and the client's
    capabilities (INVALID_PARAMS); the headers repeat the version, the method and the name
    (HEADER_MISMATCH); the version is served (UNSUPPORTED_PROTOCOL_VERSION).
    """
    meta = message.meta
    missing = [
        k for k in (PROTOCOL_VERSION_META_KEY, CLIENT_CAPABILITIES_META_KEY) if k not in meta
    ]
    if missing:
        raise invalid_params(
            f"params._meta is missing the required envelope key(s): {', '.join(missing)}"
        )
    version = meta[PROTOCOL_VERSION_META_KEY]
    if headers is not None:
        if headers.get(PROTOCOL_HEADER) != version:
            raise McpError(
                HEADER_MISMATCH,
                f"{PROTOCOL_HEADER} header does not match the request envelope's protocol version",
            )
        if headers.get(METHOD_HEADER) != message.method:
            raise McpError(HEADER_MISMATCH, f"{METHOD_HEADER} header does not match the method")
        key = NAMED.get(message.method)
        value = message.params.get(key) if key else None
        if value is not None and decode_header(headers.get(NAME_HEADER)) != value:
            raise McpError(HEADER_MISMATCH, f"{NAME_HEADER} header does not match the {key!r}")
    if not isinstance(version, str):
        raise invalid_params("the protocol-version envelope value must be a string")
    if version not in MODERN:
        raise unsupported(version)
    capabilities = meta[CLIENT_CAPABILITIES_META_KEY]
    return Envelope(
        version,
        capabilities if isinstance(capabilities, dict) else {},
        meta.get(CLIENT_INFO_META_KEY),
    )
