"""Create the demo superuser (and its API token) if missing, and print how to use the demo."""

import ipaddress

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from rest_framework.authtoken.models import Token

from agenttasks.conf import app_settings
from project.settings import DEMO_SECRET_KEY

USERNAME = "admin"
PASSWORD = "admin"


def insecure_choices(user) -> list[str]:
    """The demo settings' choices that are unsafe on a reachable server, still in effect."""
    found = []
    if settings.DEBUG:
        found.append("DEBUG is on (DJANGO_DEBUG=0 turns it off)")
    if "*" in settings.ALLOWED_HOSTS:
        found.append('ALLOWED_HOSTS is "*"')
    if settings.SECRET_KEY == DEMO_SECRET_KEY:
        found.append("SECRET_KEY is the fixed demo key (set DJANGO_SECRET_KEY)")
    if user.check_password(PASSWORD):
        found.append(f"the superuser is {USERNAME} / {PASSWORD}")
    return found


def loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


class Command(BaseCommand):
    help = "Create the demo superuser admin/admin with an API token, and print the URLs."

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", default="8000")

    def handle(self, *args, host, port, **options):
        User = get_user_model()
        user, created = User.objects.get_or_create(
            username=USERNAME, defaults={"is_staff": True, "is_superuser": True}
        )
        if created:
            user.set_password(PASSWORD)
            user.save()
        token, _ = Token.objects.get_or_create(user=user)
        shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host
        base = f"http://[{shown}]:{port}" if ":" in shown else f"http://{shown}:{port}"
        lines = [
            "",
            f"  Playground: {base}/   (sign in as {USERNAME}: start a task or a conversation)",
            f"  Admin:     {base}/admin/   (user {USERNAME}, password {PASSWORD})",
            f"  REST API:  {base}/api/agents/   (header: Authorization: Token {token.key})",
        ]
        if app_settings.METRICS_ENABLED:
            lines.append(
                f"  Metrics:   {base}/api/agents/metrics   (DEMO_METRICS=0 turns them off)"
            )
        unsafe = insecure_choices(user)
        if unsafe:
            lines.append(
                "  Demo settings, unsafe on a reachable server: " + "; ".join(unsafe) + "."
            )
        if loopback(host):
            lines.append(f"  Listening on {host} only (make run HOST=0.0.0.0 opens it to others).")
        else:
            lines.append(
                f"  WARNING: listening on {host}: anyone who can reach this machine can use it"
                + (" with the settings above." if unsafe else ".")
            )
        lines += ["  Stop both the web server and the cluster with Ctrl-C.", ""]
        self.stdout.write("\n".join(lines))
