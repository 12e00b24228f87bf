"""The Streamable HTTP endpoint, `<mount>/mcp`: one JSON-RPC message per POST.

A DRF view with the REST API's own policies (docs/rest.md): its authentication classes (and the
REST token as a bearer token too: `Authorization: Bearer <key>` as well as `Token <key>`), the
identity rule (ALLOW_ANONYMOUS), the `read`/`write` throttles, its body reading
(MAX_REQUEST_BYTES, MAX_JSON_DEPTH) and the caps on waits and streams (toolkit.caps). A refusal is
a JSON-RPC error object in the body, with REST's HTTP status and words for identity (401) and
throttles (429), and the transport's status for the rest.

The `MCP-Protocol-Version` header routes a request: 2026-07-28 (stateless: the envelope is
checked, the caller's conversation is used), any other served version or none (2025-11-25:
`initialize` opens a session, every other message names it with `Mcp-Session-Id`). A request is
answered with JSON, or, when it may wait and the client accepts it, a Server-Sent Events stream
(api/streams.py drives it under WSGI and ASGI). GET opens a 2025-11-25 session's standalone
stream (notices.py); DELETE is not served (a session's tasks outlive it).
"""

import copy
import logging

from django.core.handlers.asgi import ASGIRequest
from django.http import HttpResponse
from rest_framework import exceptions
from rest_framework.authentication import TokenAuthentication
from rest_framework.views import set_rollback

from ..conf import app_settings
from ..store import faults
from ..toolkit import body as api_body
from ..toolkit import caps, errors, identity, streams
from ..toolkit.policies import AppPolicies
from ..toolkit.throttling import ScopeThrottle
from . import dispatch, protocol, sessions
from .calls import Exchange
from .notices import NoticeFollower
from .protocol import McpError

logger = logging.getLogger(__name__)

JSON = "application/json"
SSE = "text/event-stream"
READS = {"initialize", "ping", "server/discover", "tools/list", "logging/setLevel"}


def bearer_authenticators() -> list:
    """Return the REST API's authenticators, and its token authentication under `Bearer` as well."""
    out = []
    for authenticator in identity.authenticators():
        out.append(authenticator)
        if isinstance(authenticator, TokenAuthentication) and authenticator.keyword != "Bearer":
            bearer = copy.copy(authenticator)
            bearer.keyword = "Bearer"
            out.append(bearer)
    return out


def accepts(request) -> tuple[bool, bool]:
    """Say whether the client takes JSON and SSE answers (no Accept header: anything)."""
    header = request.META.get("HTTP_ACCEPT") or "*/*"
    types = {part.split(";", 1)[0].strip().lower() for part in header.split(",")}
    anything = "*/*" in types
    return (
        anything or JSON in types or "application/*" in types,
        anything or SSE in types or "text/*" in types,
    )


def sse_frame(message: dict) -> str:
    return f"event: message\ndata: {protocol.dumps(message)}\n\n"


def json_frame(message: dict) -> str:
    """Return a plain JSON answer: it carries the response alone."""
    return protocol.dumps(message) if "method" not in message else ""


def translate(exc) -> McpError:
    """DRF's and the API's refusals as JSON-RPC errors; anything else a logged internal error."""
    if isinstance(exc, McpError):
        return exc
    if isinstance(exc, exceptions.MethodNotAllowed):
        return protocol.invalid_request(
            "Method not allowed", status=405, headers={"Allow": "GET, POST"}
        )
    if isinstance(
        exc,
        (
            exceptions.NotAuthenticated,
            exceptions.AuthenticationFailed,
            exceptions.Throttled,
            exceptions.PermissionDenied,
        ),
    ):
        exc = errors.translate(exc, {})  # REST's 401, 403 and 429, in REST's words
    if isinstance(exc, errors.ApiError):
        if exc.status in (401, 403, 429):
            data = {"status": exc.status, "code": exc.code, **(exc.details or {})}
            return protocol.invalid_request(
                exc.message, data=data, status=exc.status, headers=exc.headers
            )
        if exc.message == "Malformed JSON body":
            return McpError(protocol.PARSE_ERROR, "Parse error: malformed JSON body")
        if exc.message == "The request body must be a JSON object":  # a batch, or a scalar
            return protocol.invalid_request(protocol.NOT_ONE_MESSAGE)
        return protocol.invalid_request(exc.message, status=exc.status)
    if faults.lost_connection(exc):
        logger.warning("mcp.database_unavailable", exc_info=(type(exc), exc, exc.__traceback__))
        unavailable = errors.unavailable()
        return McpError(
            protocol.INTERNAL_ERROR,
            unavailable.message,
            status=unavailable.status,
            headers=unavailable.headers,
        )
    logger.error("mcp.internal_error", exc_info=(type(exc), exc, exc.__traceback__))
    return protocol.internal_error()


class McpView(AppPolicies):
    """`<mount>/mcp`: POST a JSON-RPC message, GET a session's stream."""

    schema = None  # not part of the REST API's OpenAPI document
    http_method_names = ["get", "post", "delete"]
    # DELETE is answered (a 405 that says why), not allowed: every answer's Allow says so.
    allowed_methods = ["GET", "POST"]
    request_id = None
    data: dict | None = None
    body_error: errors.ApiError | None = None

    def get_authenticators(self):
        return bearer_authenticators()

    def check_throttles(self, request):
        # The body is read first to learn the method; its refusal waits until after the throttle.
        if request.method == "POST":
            try:
                self.data = api_body.parse(request)
            except errors.ApiError as exc:
                self.body_error = exc
        super().check_throttles(request)

    def get_throttles(self):
        scope = "read" if self.reads() else "write"
        return [ScopeThrottle(scope)] if (app_settings.THROTTLE_RATES or {}).get(scope) else []

    def reads(self) -> bool:
        if self.request.method == "GET":
            return True
        data = self.data if isinstance(self.data, dict) else {}
        method = data.get("method")
        params = data.get("params")
        params = params if isinstance(params, dict) else {}
        if method == "tools/call":
            return params.get("name") == "task_status"
        return method in READS or (method == "notifications/initialized")

    def handle_exception(self, exc):
        if isinstance(exc, (exceptions.NotAuthenticated, exceptions.AuthenticationFailed)):
            # The challenge REST sends (WWW-Authenticate), as DRF's own handler sets it.
            exc.auth_header = self.get_authenticate_header(self.request)
        error = translate(exc)
        set_rollback()
        return self.reply(protocol.error_response(self.request_id, error), error.status, error)

    def reply(self, message: dict, status: int = 200, error: McpError | None = None):
        response = HttpResponse(protocol.dumps(message), status=status, content_type=JSON)
        for name, value in (error.headers if error else {}).items():
            response[name] = value
        return response

    # --- POST ------------------------------------------------------------------------------

    def post(self, request):
        if self.body_error is not None:
            raise self.body_error
        if self.data is None:
            raise protocol.invalid_request(protocol.NOT_ONE_MESSAGE)
        message = protocol.read(self.data)
        if message.kind == protocol.REQUEST:
            self.request_id = message.id
        json_ok, sse_ok = accepts(request)
        if not (json_ok or sse_ok):
            raise protocol.invalid_request(
                f"Not Acceptable: the client must accept {JSON} or {SSE}", status=406
            )
        caller = sessions.Caller.of(request, mount_url(request))
        version = request.headers.get(protocol.PROTOCOL_HEADER)
        if version is not None and version not in protocol.HANDSHAKE:
            return self.modern(message, caller, version)
        return self.legacy(message, caller)

    def modern(self, message: protocol.Message, caller, version: str):
        """2026-07-28: one self-contained request; no session, no client notifications."""
        if message.kind != protocol.REQUEST:
            if version not in protocol.MODERN:
                raise protocol.unsupported(version)
            return HttpResponse(status=202)  # acknowledged and dropped, as the SDK's server does
        envelope = protocol.envelope(message, self.request.headers)
        return self.serve(sessions.for_caller(caller, envelope), message)

    def legacy(self, message: protocol.Message, caller):
        """2025-11-25 (and the handshake versions before it): sessions."""
        token = self.request.headers.get(protocol.SESSION_HEADER)
        if message.kind == protocol.REQUEST and message.method == "initialize" and not token:
            session, response = dispatch.initialize(caller, message)
            out = self.reply(response)
            out[protocol.SESSION_HEADER] = session.token
            return out
        session = sessions.resume(caller, token)
        if message.kind == protocol.REQUEST and message.method == "initialize":
            raise protocol.invalid_request("This session is initialized already")
        if message.kind == protocol.NOTIFICATION:
            dispatch.notified(session, message)
            return HttpResponse(status=202)
        if message.kind == protocol.RESPONSE:
            dispatch.responded(session, message)
            return HttpResponse(status=202)
        return self.serve(session, message)

    def serve(self, session: sessions.Session, message: protocol.Message):
        json_ok, sse_ok = accepts(self.request)
        stream = sse_ok and (
            not json_ok or message.method in ("tools/call", "subscriptions/listen")
        )
        django_request = self.request._request
        exchange = Exchange(
            session,
            message,
            frame=sse_frame if stream else json_frame,
            streaming=stream,
            cancel_on_close=session.modern,
            take=self.take,
            client_fd=caps.client_socket(django_request),  # None under ASGI
            name_header=self.request.headers.get(protocol.NAME_HEADER),
        )
        out = dispatch.answer(exchange)
        if isinstance(out, dict):
            return self.reply(out) if json_ok else self.single_event(out)
        if stream:
            response = streams.serve(out, django_request)
            if session.token:
                response[protocol.SESSION_HEADER] = session.token
            return response
        return self.waited(out)

    def waited(self, follower: streams.Follower):
        """Follow a call to its answer in this thread (the client takes no stream)."""
        text = "".join(t for t in streams.sync_stream(follower) if t != streams.KEEPALIVE)
        return HttpResponse(text, content_type=JSON)

    def single_event(self, message: dict):
        response = HttpResponse(sse_frame(message), content_type=SSE)
        response["Cache-Control"] = "no-cache"
        return response

    def take(self, kind: str) -> caps.Held:
        """Take one of the caller's places: a stream's is renewed while it runs; a wait's lease
        covers the longest wait (MAX_STATUS_WAIT), as /wait's does."""
        lease = float(app_settings.SLOT_LEASE_SECONDS)
        if kind == caps.STREAM:
            return caps.take(self.request, kind, app_settings.MAX_STREAMS_PER_USER, lease)
        lease += float(app_settings.MAX_STATUS_WAIT)
        return caps.take(self.request, kind, app_settings.MAX_WAITS_PER_USER, lease)

    # --- GET: a session's standalone stream ------------------------------------------------

    def get(self, request):
        """Return what the session's tasks' endings owe it, as notifications (2025-11-25).

        Under ASGI the stream stays open (it holds no thread) until STREAM_MAX_SECONDS, and the
        client opens it again; under WSGI it sends what is owed now and closes, telling the
        client to come back in STREAM_KEEPALIVE_SECONDS, so no server thread waits on it.
        """
        version = request.headers.get(protocol.PROTOCOL_HEADER)
        if version is not None and version not in protocol.HANDSHAKE:
            raise protocol.invalid_request(
                "Method not allowed", status=405, headers={"Allow": "POST"}
            )
        if not accepts(request)[1]:
            raise protocol.invalid_request(
                f"Not Acceptable: the client must accept {SSE}", status=406
            )
        caller = sessions.Caller.of(request, mount_url(request))
        session = sessions.resume(caller, request.headers.get(protocol.SESSION_HEADER))
        django_request = request._request
        if isinstance(django_request, ASGIRequest):
            held = self.take(caps.STREAM)
            follower = NoticeFollower(session, sse_frame, held=held)
            response = streams.serve(follower, django_request)
        else:
            follower = NoticeFollower(session, sse_frame)
            owed = "".join(follower.opening())
            retry = int(float(app_settings.STREAM_KEEPALIVE_SECONDS) * 1000)
            response = HttpResponse(f"retry: {retry}\ndata:\n\n{owed}", content_type=SSE)
            response["Cache-Control"] = "no-cache"
        response[protocol.SESSION_HEADER] = session.token
        return response

    def delete(self, request):
        raise protocol.invalid_request(
            "Sessions are not ended: their conversation and its tasks outlive them",
            status=405,
            headers={"Allow": "GET, POST"},
        )


def mount_url(request) -> str:
    """Return the app's absolute mount URL, from the path this request came in on."""
    path = request.path.rstrip("/")
    return request.build_absolute_uri(path[: -len("/mcp")] if path.endswith("/mcp") else path)
