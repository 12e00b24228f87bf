"""Delayed starts and priorities: `Run.not_before` (a queued run is not claimed before it),
`Task.priority`, and on PostgreSQL `agenttasks_claim_runs_v3`
(`agenttasks/migrations/frozen/claim_runs_v3.sql`): the claim of several runs that leaves the
runs not yet due, and takes the due ones fairly (wake-ups first, owner by owner, priority).

`agenttasks_claim_runs_v2` stays installed for the code of earlier versions."""

from django.db import migrations, models

from agenttasks.sql import frozen, on_postgres

DROP_V3 = "DROP FUNCTION IF EXISTS agenttasks_claim_runs_v3(text, integer, timestamptz, text[]);"


class Migration(migrations.Migration):

    dependencies = [
        ('agenttasks', '0019_provider_limits'),
    ]

    operations = [
        migrations.AddField(
            model_name='run',
            name='not_before',
            field=models.DateTimeField(blank=True, help_text='A queued run is not claimed before this (a delayed start).', null=True, verbose_name='not before'),
        ),
        migrations.AddField(
            model_name='task',
            name='priority',
            field=models.SmallIntegerField(db_default=0, default=0, help_text="Higher first: claims take a higher priority first, within each owner's share.", verbose_name='priority'),
        ),
        migrations.AddIndex(
            model_name='run',
            index=models.Index(condition=models.Q(('not_before__isnull', False), ('status', 'queued')), fields=['not_before'], name='agenttasks_run_waiting_idx'),
        ),
        migrations.RunPython(on_postgres(frozen("claim_runs_v3.sql")), on_postgres(DROP_V3)),
    ]
