"""The operating endpoints: `GET /health` for load balancers, `GET /metrics` for Prometheus.

Plain Django views, outside the REST API's authentication and throttles: a load balancer or a
scraper carries no user. Details and metrics are guarded by tokens of their own
(docs/rest.md#health-and-metrics); errors use the API's envelope.
"""

import hmac

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from rest_framework import exceptions
from rest_framework.request import Request

from ..conf import app_settings
from ..operations import health as health_check
from ..operations import metrics as collected
from ..toolkit import errors
from ..toolkit.identity import authenticators

SAFE_METHODS = ("GET", "HEAD")


def _bearer(request: HttpRequest) -> str:
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def _carries(request: HttpRequest, secret: str | None) -> bool:
    """Whether the request carries `secret` as its bearer token (never when it is unset)."""
    token = _bearer(request)
    return bool(secret and token) and hmac.compare_digest(token.encode(), str(secret).encode())


def _is_staff(request: HttpRequest) -> bool:
    """Whether a staff user made the request: by session, or any way the REST API accepts one."""
    user = getattr(request, "user", None)
    if user is not None and user.is_authenticated:
        return bool(user.is_staff)
    api_request = Request(request)
    for authenticator in authenticators():
        try:
            found = authenticator.authenticate(api_request)
        except exceptions.APIException:
            return False  # a credential that fails gives no details; health still answers
        if found is not None:
            return bool(getattr(found[0], "is_staff", False))
    return False


# Read-only views: exempt from CSRF so that a write method meets the JSON 405, not Django's HTML 403.
@csrf_exempt
def health(request: HttpRequest) -> HttpResponse:
    """200 {"status": "ok"} or 503 {"status": "degraded", "reasons": [...]}; details for staff."""
    if request.method not in SAFE_METHODS:
        return errors.json_error(errors.method_not_allowed(request))
    details = _carries(request, app_settings.HEALTH_TOKEN) or _is_staff(request)
    healthy, body = health_check.check(details=details)
    response = JsonResponse(body, status=200 if healthy else 503)
    response["Cache-Control"] = "no-store"
    return response


@csrf_exempt
def metrics(request: HttpRequest) -> HttpResponse:
    """Return the Prometheus text format, when METRICS_ENABLED (and with METRICS_TOKEN when set)."""
    if not app_settings.METRICS_ENABLED:
        off = errors.route_not_found(request)
        off.message += " (metrics are off: set AGENTTASKS['METRICS_ENABLED'] = True)"
        return errors.json_error(off)
    if request.method not in SAFE_METHODS:
        return errors.json_error(errors.method_not_allowed(request))
    if app_settings.METRICS_TOKEN and not _carries(request, app_settings.METRICS_TOKEN):
        return errors.json_error(
            errors.ApiError(
                401,
                "identity_required",
                "The metrics need the METRICS_TOKEN as a bearer token",
                headers={"WWW-Authenticate": 'Bearer realm="metrics"'},
            )
        )
    body, content_type = collected.exposition(request.headers.get("Accept", ""))
    response = HttpResponse(body, content_type=content_type)
    response["Cache-Control"] = "no-store"
    return response
