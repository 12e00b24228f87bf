"""Create the demo superuser (and its API token) if missing, and print how to use them."""

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from rest_framework.authtoken.models import Token

USERNAME = "admin"
PASSWORD = "admin"


class Command(BaseCommand):
    help = "Create the demo superuser admin/admin with an API token, and print the URLs."

    def add_arguments(self, parser):
        parser.add_argument("--port", default="8000")

    def handle(self, *args, port, **options):
        User = get_user_model()
        user, created = User.objects.get_or_create(
            username=USERNAME, defaults={"is_staff": True, "is_superuser": True}
        )
        if created:
            user.set_password(PASSWORD)
            user.save()
        token, _ = Token.objects.get_or_create(user=user)
        base = f"http://127.0.0.1:{port}"
        self.stdout.write(
            "\n".join(
                [
                    "",
                    f"  Admin:     {base}/admin/   (user {USERNAME}, password {PASSWORD})",
                    f"  REST API:  {base}/api/agents/   (header: Authorization: Token {token.key})",
                    "  Stop both the web server and the cluster with Ctrl-C.",
                    "",
                ]
            )
        )
