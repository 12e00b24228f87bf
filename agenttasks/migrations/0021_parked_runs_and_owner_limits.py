"""Parked runs and the per-owner limit on runs in flight: `Run.limited_since` (since when a run
parked for its provider's limit has waited), `ProviderBudget.parked_lines` (where each owner's
parked runs' turns would end), and on PostgreSQL `agenttasks_claim_runs_v4`
(`agenttasks/migrations/frozen/claim_runs_v4.sql`): the claim of several runs that leaves queued
the task runs of an owner with MAX_RUNNING_PER_USER of them running, and the runs of an agent
whose model endpoint's line of turns is full; and `agenttasks_reserve_v1`
(`frozen/reserve_v1.sql`): a request's turn in its endpoint's budget in one statement.

`agenttasks_claim_runs_v3` stays installed for the code of earlier versions."""

from django.db import migrations, models

from agenttasks.sql import frozen, on_postgres

DROP_V4 = (
    "DROP FUNCTION IF EXISTS "
    "agenttasks_claim_runs_v4(text, integer, timestamptz, text[], integer, jsonb);"
)


class Migration(migrations.Migration):

    dependencies = [
        ('agenttasks', '0020_delayed_starts_and_priorities'),
    ]

    operations = [
        migrations.AddField(
            model_name='run',
            name='limited_since',
            field=models.DateTimeField(blank=True, help_text="A run parked for its provider's limit has waited since then (its patience counts from then).", null=True, verbose_name='waiting for its limit since'),
        ),
        migrations.AddField(
            model_name='providerbudget',
            name='parked_lines',
            field=models.JSONField(blank=True, default=dict, help_text="Where the line of each owner's runs of each priority parked for this endpoint ends, by `owner:priority`: a parked run comes back at its place in it.", verbose_name="parked runs' lines"),
        ),
        migrations.RunPython(on_postgres(frozen("claim_runs_v4.sql")), on_postgres(DROP_V4)),
        migrations.RunPython(
            on_postgres(frozen("reserve_v1.sql")),
            on_postgres("DROP FUNCTION IF EXISTS agenttasks_reserve_v1(jsonb);"),
        ),
    ]
