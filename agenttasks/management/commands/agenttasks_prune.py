"""Delete files past their retention, and optionally the conversations of old finished tasks."""

from datetime import timedelta

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from agenttasks import files, lifecycle
from agenttasks.exceptions import ConversationNotFound
from agenttasks.models import Task
from agenttasks.states import TERMINAL


class Command(BaseCommand):
    help = (
        "Delete stored files older than their agent's retentionDays; with "
        "--finished-older-than-days N, also delete the conversations (with their whole tree) "
        "of tasks created over REST or by site code that finished more than N days ago."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--dry-run", action="store_true", help="Report what would be deleted; change nothing."
        )
        parser.add_argument(
            "--finished-older-than-days",
            type=float,
            default=None,
            metavar="N",
            help="Also delete finished tasks' conversations older than N days.",
        )

    def handle(self, *args, dry_run=False, finished_older_than_days=None, **options):
        removed = files.prune(dry_run=dry_run)
        verb = "would delete" if dry_run else "deleted"
        self.stdout.write(f"files {verb}: {len(removed)}")
        if finished_older_than_days is None:
            return
        if finished_older_than_days < 0:
            raise CommandError("--finished-older-than-days must be 0 or more")
        cutoff = timezone.now() - timedelta(days=finished_older_than_days)
        # Top-level tasks only: a spawned task's hidden conversation goes with its parent's tree.
        conversations = list(
            Task.objects.filter(
                status__in=TERMINAL,
                finished_at__lt=cutoff,
                parent_conversation__isnull=True,
                conversation__hidden=False,
                conversation__deleting_at__isnull=True,
            ).values_list("conversation_id", flat=True)
        )
        deleted = 0
        for conversation_id in conversations:
            if dry_run:
                continue
            try:
                lifecycle.delete_conversation(conversation_id)
            except ConversationNotFound:
                continue
            deleted += 1
        count = len(conversations) if dry_run else deleted
        self.stdout.write(f"finished tasks' conversations {verb}: {count}")
