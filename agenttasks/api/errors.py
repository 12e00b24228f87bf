"""The uniform error envelope: `{"error": {"code", "message", "details"?}}`, for every error.

The app's views use `handle` as their exception handler (never the host's EXCEPTION_HANDLER), so
every refusal is an envelope with the status and code of docs/rest.md#errors, and anything that is
not a refusal is a logged 500 whose body carries no traceback.
"""

import logging
import math
import re

from django.core.exceptions import PermissionDenied, RequestDataTooBig
from django.http import Http404, JsonResponse
from rest_framework import exceptions
from rest_framework.response import Response
from rest_framework.views import set_rollback

from ..conf import app_settings
from ..exceptions import TaskError
from ..files import FileRefused

logger = logging.getLogger("agenttasks.api")

INTERNAL_MESSAGE = "An unexpected error occurred"
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


def translate(exc, context) -> ApiError | None:
    """Map DRF's and Django's exceptions onto the envelope; None for a real fault."""
    request = context.get("request")
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, TaskError) and exc.status_code < 500:
        # A refusal of the lifecycle carries its own status, code, message and details.
        return ApiError(exc.status_code, exc.code, exc.api_message(), exc.api_details())
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


def handle(exc, context):
    """Handle an exception of the app's views (docs/rest.md#errors)."""
    error = translate(exc, context)
    set_rollback()
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
