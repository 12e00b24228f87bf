"""On PostgreSQL, `agenttasks_claim_runs_v6` (`agenttasks/migrations/frozen/claim_runs_v6.sql`):
under MAX_RUNNING_PER_USER the claims of several runs take turns, so an owner never has more task
runs in flight than the limit (version 5's claims, racing, could pass over each other's runs and
take those owners' next ones).

`agenttasks_claim_runs_v5` stays installed for the code of earlier versions."""

from django.db import migrations

from agenttasks.sql import frozen, on_postgres

DROP_V6 = (
    "DROP FUNCTION IF EXISTS "
    "agenttasks_claim_runs_v6(text, integer, timestamptz, text[], integer, jsonb);"
)


class Migration(migrations.Migration):

    dependencies = [
        ("agenttasks", "0027_events_appended_v2"),
    ]

    operations = [
        migrations.RunPython(on_postgres(frozen("claim_runs_v6.sql")), on_postgres(DROP_V6)),
    ]
