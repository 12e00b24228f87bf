"""Parked runs and the per-owner limit on runs in flight: `Run.parked_turn` (the turn a run
parked for its provider's limit keeps), and on PostgreSQL `agenttasks_claim_runs_v4`
(`agenttasks/migrations/frozen/claim_runs_v4.sql`): the claim of several runs that leaves queued
the task runs of an owner with MAX_RUNNING_PER_USER of them running.

`agenttasks_claim_runs_v3` stays installed for the code of earlier versions."""

from django.db import migrations, models

from agenttasks.sql import frozen, on_postgres

DROP_V4 = (
    "DROP FUNCTION IF EXISTS agenttasks_claim_runs_v4(text, integer, timestamptz, text[], integer);"
)


class Migration(migrations.Migration):

    dependencies = [
        ('agenttasks', '0020_delayed_starts_and_priorities'),
    ]

    operations = [
        migrations.AddField(
            model_name='run',
            name='parked_turn',
            field=models.JSONField(blank=True, help_text="A run parked while it waits for its provider's limit: the turn it holds (endpoint, start, tokens, permit) and since when it has waited.", null=True, verbose_name='parked turn'),
        ),
        migrations.RunPython(on_postgres(frozen("claim_runs_v4.sql")), on_postgres(DROP_V4)),
    ]
