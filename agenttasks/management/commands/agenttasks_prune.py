"""Prune what is past its age (RETENTION), as the daily schedule does; --dry-run only reports."""

from django.core.management.base import BaseCommand, CommandError

from agenttasks.operations import retention


class Command(BaseCommand):
    help = (
        "Delete finished conversation trees older than RETENTION['finished_days'] (with their "
        "events, runs, tasks, wake-ups, actions and files), files past their agent's "
        "retentionDays, expired idempotency keys and old django-q2 failure rows, at most 1,000 "
        "rows per transaction. --dry-run reports what would go and changes nothing."
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
            help="Prune finished trees idle for more than N days (instead of finished_days).",
        )

    def handle(self, *args, dry_run=False, finished_older_than_days=None, **options):
        if finished_older_than_days is not None and finished_older_than_days < 0:
            raise CommandError("--finished-older-than-days must be 0 or more")
        report = retention.prune(dry_run=dry_run, finished_days=finished_older_than_days)
        for line in report.lines():
            self.stdout.write(line)
