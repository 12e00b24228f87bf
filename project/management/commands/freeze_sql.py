"""Freeze a new SQL version for the migration that installs it (agenttasks/sql/__init__.py).

`python manage.py freeze_sql end_v3.sql` writes `agenttasks/migrations/frozen/end_v3.sql`: the
template with today's constants written in. A frozen file is never rewritten; a change is a new
version.
"""

from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from agenttasks import sql


class Command(BaseCommand):
    help = "Write the frozen text of new SQL templates (agenttasks/sql/NAME.sql)."

    def add_arguments(self, parser):
        parser.add_argument("names", nargs="+", help="template file names, e.g. end_v3.sql")

    def handle(self, *names, **options):
        folder = Path(str(sql.FROZEN))
        for name in options["names"]:
            if name not in sql.templates():
                raise CommandError(f"no template agenttasks/sql/{name}")
            target = folder / name
            if target.exists():
                raise CommandError(f"{target} is frozen already; a change is a new version")
            target.write_text(sql.render(name), encoding="utf-8")
            self.stdout.write(f"froze {target}")
