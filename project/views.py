"""The demo's pages: the playground and its own sign-in page."""

from django.contrib.auth.views import LoginView
from django.db import connection
from django.http import HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_safe


class SignInView(LoginView):
    """The playground's sign-in page, in its style (the admin's login is for operators)."""

    template_name = "login.html"
    redirect_authenticated_user = True
    next_page = "home"


sign_in = SignInView.as_view()


@require_safe
def home(request):
    """The playground; an anonymous visitor gets the sign-in page in its place.

    Rendered at `/` rather than redirected, so `/` answers 200 to everyone with the header's
    links to the API, and signing in lands back here.
    """
    if not request.user.is_authenticated:
        return sign_in(request)
    # Pieces of a reply cross from the cluster's process to this one by NOTIFY only.
    return render(request, "home.html", {"streams_deltas": connection.vendor == "postgresql"})


# The tab icon of every page, the admin's too (browsers ask for /favicon.ico unless told).
FAVICON = (
    '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 16 16">'
    '<rect width="16" height="16" rx="3" fill="#24292f"/>'
    '<path d="M4 8h8M8 4v8" stroke="#fff" stroke-width="2"/></svg>'
)


@require_safe
def favicon(request):
    """Answer /favicon.ico (an SVG: browsers read it by its type, not its name)."""
    response = HttpResponse(FAVICON, content_type="image/svg+xml")
    response["Cache-Control"] = "public, max-age=86400"
    return response
