"""Identity and ownership (docs/rest.md#authentication-and-isolation): the app's own rule, whatever the host's defaults.

A request is served for a *principal*: the authenticated user, or the anonymous principal
(`None`) where ALLOW_ANONYMOUS (or, for listing tasks, ALLOW_ANONYMOUS_LIST) lets it in. A
resource is reachable only when its owner equals the principal; there is no staff bypass.
"""

from django.utils.module_loading import import_string
from rest_framework import exceptions
from rest_framework.permissions import BasePermission
from rest_framework.settings import api_settings

from ..conf import app_settings
from . import errors


def user_of(request):
    """Return the authenticated user, or None."""
    user = getattr(request, "user", None)
    return user if user is not None and user.is_authenticated else None


def owner_id(request):
    """Return the principal's user id (None for the anonymous principal)."""
    user = user_of(request)
    return user.pk if user is not None else None


class IdentityRequired(BasePermission):
    """Let in an authenticated user, or the anonymous principal where the settings allow it."""

    def has_permission(self, request, view) -> bool:
        if user_of(request) is not None:
            return True
        if app_settings.ALLOW_ANONYMOUS:
            return True
        if getattr(view, "anonymous_list", False) and app_settings.ALLOW_ANONYMOUS_LIST:
            return True
        # Always a 401, whichever authenticator comes first (DRF would say 403 for sessions).
        raise exceptions.NotAuthenticated()


def check_owner(request, resource_owner_id, what: str) -> None:
    """Refuse (403) a resource the principal does not own."""
    if resource_owner_id != owner_id(request):
        raise errors.forbidden(what)


def authenticators() -> list:
    """Return the site's authenticators (AUTHENTICATION_CLASSES, else DRF's defaults), for every
    view."""
    classes = app_settings.AUTHENTICATION_CLASSES
    if classes is None:
        classes = api_settings.DEFAULT_AUTHENTICATION_CLASSES
    return [import_string(c)() if isinstance(c, str) else c() for c in classes]
