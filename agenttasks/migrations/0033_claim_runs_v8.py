"""On PostgreSQL, `agenttasks_claim_runs_v8` (`agenttasks/migrations/frozen/claim_runs_v8.sql`):
a claim's statements go by their indexes even on plans its connection made while the tables were
small (version 7's look for runs not yet started then read the whole run table at every claim).

`agenttasks_claim_runs_v7` stays installed for the code of earlier versions."""

from django.db import migrations

from agenttasks.sql import frozen, on_postgres

DROP_V8 = (
    "DROP FUNCTION IF EXISTS "
    "agenttasks_claim_runs_v8(text, integer, timestamptz, text[], integer, jsonb);"
)


class Migration(migrations.Migration):

    dependencies = [
        ("agenttasks", "0032_run_turns"),
    ]

    operations = [
        migrations.RunPython(on_postgres(frozen("claim_runs_v8.sql")), on_postgres(DROP_V8)),
    ]
