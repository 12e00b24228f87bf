"""Rate limits for the `read` and `write` scopes (AGENTTASKS["THROTTLE_RATES"], docs/rest.md#rate-limiting).

The anonymous principal is counted per client address, which is REMOTE_ADDR unless the site says
how many proxies it runs behind (REST_FRAMEWORK["NUM_PROXIES"]): a client writes whatever it
likes into X-Forwarded-For, so only the entries the site's own proxies appended are believed.
"""

from rest_framework.settings import api_settings
from rest_framework.throttling import SimpleRateThrottle

from ..conf import app_settings

WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def scope_of(method: str) -> str:
    return "write" if method.upper() in WRITE_METHODS else "read"


def client_address(request) -> str:
    """Return the client's address as NUM_PROXIES says; unset or 0 trusts no X-Forwarded-For.

    (DRF itself trusts the whole header when NUM_PROXIES is unset.)
    """
    remote = request.META.get("REMOTE_ADDR") or ""
    proxies = api_settings.NUM_PROXIES
    forwarded = request.META.get("HTTP_X_FORWARDED_FOR")
    if not proxies or not forwarded:
        return remote
    addresses = forwarded.split(",")
    # Each trusted proxy appended the address it saw: the n-th from the right is the client.
    return addresses[-min(int(proxies), len(addresses))].strip()


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
            ident = f"addr:{client_address(request)}"
        return f"agenttasks:throttle:{self.scope}:{ident}"


def throttles_for(request) -> list:
    """Return the throttle that applies to this request, if its scope has a rate."""
    scope = scope_of(request.method)
    if not (app_settings.THROTTLE_RATES or {}).get(scope):
        return []
    return [ScopeThrottle(scope)]
