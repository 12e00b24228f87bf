"""Run one reaper pass now: fail orphaned runs, re-enqueue forgotten ones, time out actions."""

import json

from django.core.management.base import BaseCommand

from agenttasks.execution import reaper


class Command(BaseCommand):
    help = "Run one agenttasks reaper pass (safe beside running clusters)."

    def add_arguments(self, parser):
        parser.add_argument(
            "--dry-run", action="store_true", help="Report what would be done; change nothing."
        )

    def handle(self, *args, dry_run=False, **options):
        if dry_run:
            report = reaper.preview()
            for key, values in report.items():
                self.stdout.write(
                    f"{key}: {len(values)}" + (f" {json.dumps(values)}" if values else "")
                )
            return
        result = reaper.reap()
        self.stdout.write(
            f"failed: {len(result['failed'])}"
            + (f" {json.dumps(result['failed'])}" if result["failed"] else "")
        )
