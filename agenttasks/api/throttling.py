"""Rate limits for the `read` and `write` scopes (AGENTTASKS["THROTTLE_RATES"], docs/rest.md#rate-limiting)."""

from rest_framework.throttling import SimpleRateThrottle

from ..conf import app_settings

WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def scope_of(method: str) -> str:
    return "write" if method.upper() in WRITE_METHODS else "read"


class ScopeThrottle(SimpleRateThrottle):
    """Per resolved user, or per client address for the anonymous principal."""

    def __init__(self, scope: str):
        self.scope = scope
        super().__init__()

    def get_rate(self):
        return (app_settings.THROTTLE_RATES or {}).get(self.scope)

    def get_cache_key(self, request, view):
        user = getattr(request, "user", None)
        if user is not None and user.is_authenticated:
            ident = f"user:{user.pk}"
        else:
            ident = f"addr:{self.get_ident(request)}"
        return f"agenttasks:throttle:{self.scope}:{ident}"


def throttles_for(request) -> list:
    """The throttle that applies to this request, if its scope has a rate."""
    scope = scope_of(request.method)
    if not (app_settings.THROTTLE_RATES or {}).get(scope):
        return []
    return [ScopeThrottle(scope)]
