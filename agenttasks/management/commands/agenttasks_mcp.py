"""Serve the MCP tools over stdio for one user, for a host that starts the server as a command."""

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from agenttasks.mcp import available


class Command(BaseCommand):
    help = (
        "Serve agenttasks' MCP tools on stdin/stdout (newline-delimited JSON-RPC) for one user; "
        "the tasks are theirs, as over REST (docs/mcp.md#stdio)."
    )

    def add_arguments(self, parser):
        parser.add_argument("--user", required=True, help="The username the tasks belong to.")

    def handle(self, *args, user, **options):
        if not available():
            raise CommandError('agenttasks_mcp needs the mcp extra: pip install "agenttasks[mcp]"')
        model = get_user_model()
        found = model._default_manager.filter(**{model.USERNAME_FIELD: user}).first()
        if found is None or not found.is_active:
            raise CommandError(f"No active user {user!r}")
        # The extra is optional: its modules are imported only once it is known to be there.
        from agenttasks.mcp.stdio import serve

        serve(found)
