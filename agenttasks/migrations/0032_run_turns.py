"""A run carries its conversation's owner and its task's priority, and the queued runs are
indexed in turn order (owner, priority, age), the wake-ups apart: a claim
(`agenttasks_claim_runs_v7` on PostgreSQL, `agenttasks/migrations/frozen/claim_runs_v7.sql`)
walks the owners and takes a few runs of each instead of ranking every queued run.

The priority column is added by statement, with its default in the database, since SQLite would
rebuild the run table to add a column Django declares NOT NULL. The unfinished runs get their
owner and priority from their conversation and task (the running ones count against
MAX_RUNNING_PER_USER by their owner). `agenttasks_claim_runs_v6` stays installed
for the code of earlier versions."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

from agenttasks.sql import frozen, on_postgres

ADD_PRIORITY = "ALTER TABLE agenttasks_run ADD COLUMN priority integer DEFAULT 0 NOT NULL"
DROP_PRIORITY = "ALTER TABLE agenttasks_run DROP COLUMN priority"
FILL = """
UPDATE agenttasks_run SET
    owner_id = (SELECT c.owner_id FROM agenttasks_conversation c
                 WHERE c.id = agenttasks_run.conversation_id),
    priority = coalesce((SELECT t.priority FROM agenttasks_task t
                          WHERE t.id = agenttasks_run.task_id), 0)
 WHERE status IN ('queued', 'running', 'paused', 'waiting')
"""
DROP_V7 = (
    "DROP FUNCTION IF EXISTS "
    "agenttasks_claim_runs_v7(text, integer, timestamptz, text[], integer, jsonb);"
)


class Migration(migrations.Migration):
    dependencies = [
        ("agenttasks", "0031_budget_accepted_reports"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AddField(
            model_name="run",
            name="owner",
            field=models.ForeignKey(
                blank=True,
                db_constraint=False,
                db_index=False,
                editable=False,
                null=True,
                on_delete=django.db.models.deletion.DO_NOTHING,
                related_name="+",
                to=settings.AUTH_USER_MODEL,
                verbose_name="owner",
            ),
        ),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AddField(
                    model_name="run",
                    name="priority",
                    field=models.IntegerField(
                        db_default=0, default=0, editable=False, verbose_name="priority"
                    ),
                ),
            ],
            database_operations=[migrations.RunSQL(ADD_PRIORITY, DROP_PRIORITY)],
        ),
        migrations.RunSQL(FILL, migrations.RunSQL.noop),
        migrations.AddIndex(
            model_name="run",
            index=models.Index(
                condition=models.Q(("status", "queued")),
                fields=["owner", "-priority", "queued_at", "id"],
                name="agenttasks_run_turn_idx",
            ),
        ),
        migrations.AddIndex(
            model_name="run",
            index=models.Index(
                condition=models.Q(("status", "queued"), ("trigger", "wakeup")),
                fields=["queued_at", "id"],
                name="agenttasks_run_wakeup_idx",
            ),
        ),
        migrations.RunPython(on_postgres(frozen("claim_runs_v7.sql")), on_postgres(DROP_V7)),
    ]
