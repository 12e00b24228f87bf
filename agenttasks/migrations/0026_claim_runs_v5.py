"""On PostgreSQL, `agenttasks_claim_runs_v5` (`agenttasks/migrations/frozen/claim_runs_v5.sql`):
the claim of several runs looks for due runs again only while its last look found as many as it
asked for (version 4 went on until a look found nothing new, reading the queue again for each
run committed meanwhile).

`agenttasks_claim_runs_v4` stays installed for the code of earlier versions."""

from django.db import migrations

from agenttasks.sql import frozen, on_postgres

DROP_V5 = (
    "DROP FUNCTION IF EXISTS "
    "agenttasks_claim_runs_v5(text, integer, timestamptz, text[], integer, jsonb);"
)


class Migration(migrations.Migration):

    dependencies = [
        ("agenttasks", "0025_traceparent"),
    ]

    operations = [
        migrations.RunPython(on_postgres(frozen("claim_runs_v5.sql")), on_postgres(DROP_V5)),
    ]
