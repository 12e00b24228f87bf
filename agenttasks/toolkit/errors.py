"""The uniform error envelope: `{"error": {"code", "message", "details"?}}`, for every error.

The app's views use `handle` as their exception handler (never the host's EXCEPTION_HANDLER), so
every refusal is an envelope with the status and code of docs/rest.md#errors, and anything that is
not a refusal is a logged 500 whose body carries no traceback.
"""

import logging
import math
import re

from django.core.exceptions import PermissionDenied, RequestDataTooBig
from django.db import connection
from django.http import Http404, JsonResponse
from rest_framework import exceptions
from rest_framework.response import Response
from rest_framework.views import set_rollback

from ..conf import app_settings
from ..exceptions import (
    ActionNotFound,
    ActionPending,
    ActionResolved,
    ActiveTaskLimit,
    AlreadyFinal,
    ConversationBusy,
    ConversationNotFound,
    InvalidField,
    NotRetryable,
    RetryConflict,
    RetryLimit,
    RunNotFound,
    RunNotWaiting,
    ScheduleNotFound,
    TaskBusy,
    TaskError,
    TaskLimit,
    TaskNotFound,
)
from ..store import faults
from ..store.files import FileRefused

logger = logging.getLogger("agenttasks.api")

INTERNAL_MESSAGE = "An unexpected error occurred"
UNAVAILABLE_MESSAGE = "The service is briefly unavailable; try again in a moment"
LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def encodable(value):
    """Replace lone surrogates (valid in a JSON string, not in UTF-8) with U+FFFD, throughout."""
    if isinstance(value, str):
        return LONE_SURROGATE.sub("\ufffd", value)
    if isinstance(value, dict):
        return {encodable(k): encodable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [encodable(v) for v in value]
    return value


class ApiError(Exception):
    """A refusal with its HTTP status, code, message and optional details."""

    def __init__(self, status: int, code: str, message: str, details=None, headers=None):
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.details = details
        self.headers = headers or {}

    def body(self) -> dict:
        """Return the envelope; messages and details may quote the client's text, so it is made
        encodable."""
        error = {"code": self.code, "message": encodable(self.message)}
        if self.details is not None:
            error["details"] = encodable(self.details)
        return {"error": error}


def validation(message: str, *fields: str) -> ApiError:
    """400 VALIDATION_ERROR; the named request fields are the ones at fault."""
    details = {"fields": {f: [message] for f in fields}} if fields else None
    return ApiError(400, "VALIDATION_ERROR", message, details)


def not_found(message: str) -> ApiError:
    return ApiError(404, "NOT_FOUND", message)


def forbidden(what: str) -> ApiError:
    return ApiError(403, "FORBIDDEN", f"You do not have access to this {what}")


def conflict(code: str, message: str, details=None) -> ApiError:
    return ApiError(409, code, message, details)


def body_too_large(limit: int) -> ApiError:
    return validation(f"The request body is larger than {limit} bytes")


def route_not_found(request) -> ApiError:
    return not_found(f"Route not found: {request.method} {request.path}")


def method_not_allowed(request) -> ApiError:
    return ApiError(
        405, "METHOD_NOT_ALLOWED", f"Method {request.method} is not allowed on {request.path}"
    )


def refusal(exc: TaskError) -> ApiError:
    """Word a refusal of the lifecycle for REST from its code and data (docs/rest.md#errors).

    REST's words are also A2A's, MCP's and the admin's; the model tools have their own
    (`runtime.task_tools.model_text`), and Python reads `str(exc)`.
    """
    message, details = _words(exc)
    return ApiError(exc.status_code, exc.code, message, details)


def _words(exc: TaskError) -> tuple[str, dict | None]:
    match exc:
        case TaskNotFound(task_id=task_id) if task_id:
            return f"Task not found: {task_id}", None
        case ConversationNotFound(conversation_id=conversation_id) if conversation_id:
            return f"Conversation not found: {conversation_id}", None
        case RunNotFound(run_id=run_id) if run_id:
            return f"Run not found: {run_id}", None
        case ScheduleNotFound(schedule_id=schedule_id) if schedule_id:
            return f"Schedule not found: {schedule_id}", None
        case InvalidField(field=field):
            return str(exc), {"fields": {field: [str(exc)]}}
        case ActionNotFound(action_id=action_id) if action_id:
            return f"Action not found: {action_id}", None
        case TaskLimit(limit=limit):
            return (
                f"The conversation that spawned this task already has {limit} tasks running; "
                "wait for one to finish",
                {"limit": limit},
            )
        case ActiveTaskLimit(limit=limit):
            return f"You already have {limit} active tasks; wait for one to finish", {
                "limit": limit
            }
        case (
            NotRetryable(delegate=True, status=status, task_id=task_id)
            | TaskBusy(delegate=True, status=status, task_id=task_id)
        ):
            return f"Task {task_id} is a delegate task; it is driven by its caller", {
                "status": status
            }
        case NotRetryable(status=status, task_id=task_id):
            return f"Only a failed task can be retried; task {task_id} is {status}", {
                "status": status
            }
        case RetryLimit(limit=limit, task_id=task_id, attempt=attempt):
            return (
                f"Task {task_id} has already used its {limit} attempts; create a new task instead",
                {"limit": limit, "attempt": attempt},
            )
        case RetryConflict():
            return "Another request claimed this task first; try again", None
        case AlreadyFinal(status=status, task_id=task_id):
            return f"Task {task_id} has already {status}", {"status": status}
        case TaskBusy(status=status, task_id=task_id):
            return (
                f"Task {task_id} is {status}; wait for it to finish or cancel it",
                {"status": status},
            )
        case ActionPending(action_ids=action_ids, task_id=task_id):
            return (
                f"Task {task_id} is waiting on an approval or a question; answer it first",
                {"actionIds": action_ids},
            )
        case ConversationBusy(conversation_id=conversation_id, action_ids=[_, *_] as action_ids):
            return (
                f"Conversation {conversation_id} is waiting on an approval or a question",
                {"actionIds": action_ids},
            )
        case ConversationBusy(conversation_id=conversation_id, run_id=run_id):
            return f"Conversation {conversation_id} has a run in progress", {"runId": run_id}
        case RunNotWaiting(run_id=run_id):
            return f"Run {run_id} is no longer waiting its turn", None
        case ActionResolved(action_id=action_id, status=status, reason=reason):
            return f"Action {action_id} {reason}", {"status": status}
    return str(exc), None


def translate(exc, context) -> ApiError | None:
    """Map DRF's and Django's exceptions onto the envelope; None for a real fault."""
    request = context.get("request")
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, TaskError) and exc.status_code < 500:
        return refusal(exc)
    if isinstance(exc, FileRefused):
        return ApiError(exc.status, exc.code, exc.message, exc.details)
    if isinstance(exc, (exceptions.NotAuthenticated, exceptions.AuthenticationFailed)):
        # Always 401 (DRF would answer 403 when the first authenticator sends no challenge).
        message = (
            "Authentication required"
            if isinstance(exc, exceptions.NotAuthenticated)
            else str(exc.detail)
        )
        headers = {}
        auth_header = getattr(exc, "auth_header", None)
        if auth_header:
            headers["WWW-Authenticate"] = auth_header
        return ApiError(401, "identity_required", message, headers=headers)
    if isinstance(exc, exceptions.Throttled):
        wait = max(1, math.ceil(getattr(exc, "wait", None) or 1))
        return ApiError(
            429,
            "rate_limited",
            f"Request was throttled; try again in {wait} seconds",
            {"retryAfter": wait},
            {"Retry-After": str(wait)},
        )
    if isinstance(exc, exceptions.MethodNotAllowed) and request is not None:
        return method_not_allowed(request)
    if isinstance(exc, exceptions.UnsupportedMediaType):
        return ApiError(415, "unsupported_media_type", str(exc.detail))
    if isinstance(exc, (exceptions.PermissionDenied, PermissionDenied)):
        detail = getattr(exc, "detail", None) or (exc.args[0] if exc.args else "")
        return ApiError(403, "FORBIDDEN", str(detail) or "You do not have permission")
    if isinstance(exc, RequestDataTooBig):
        return body_too_large(app_settings.MAX_REQUEST_BYTES)
    if isinstance(exc, (exceptions.NotFound, Http404)) and request is not None:
        return route_not_found(request)
    if isinstance(exc, exceptions.ParseError):
        return validation("Malformed JSON body")
    return None


def unavailable() -> ApiError:
    """A request the database's absence stopped (a restart, a lost connection): try it again.

    The broken connection is dropped now (a pool discards it), so the next request on this
    thread gets a healthy one.
    """
    if not connection.in_atomic_block:
        connection.close()
    return ApiError(503, "SERVICE_UNAVAILABLE", UNAVAILABLE_MESSAGE, headers={"Retry-After": "1"})


def handle(exc, context):
    """Handle an exception of the app's views (docs/rest.md#errors)."""
    error = translate(exc, context)
    set_rollback()
    if error is None and faults.lost_connection(exc):
        logger.warning("api.database_unavailable", exc_info=(type(exc), exc, exc.__traceback__))
        error = unavailable()
    if error is None:
        logger.error("api.internal_error", exc_info=(type(exc), exc, exc.__traceback__))
        error = ApiError(500, "INTERNAL_ERROR", INTERNAL_MESSAGE)
    return Response(error.body(), status=error.status, headers=error.headers)


def json_error(error: ApiError) -> JsonResponse:
    """Render an envelope outside DRF (the catch-all route)."""
    response = JsonResponse(
        error.body(), status=error.status, json_dumps_params={"separators": (",", ":")}
    )
    for name, value in error.headers.items():
        response[name] = value
    return response
