"""The demo's pages: the playground and its own sign-in page."""

from django.contrib.auth.views import LoginView
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
    return render(request, "home.html")
