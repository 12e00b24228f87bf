"""On PostgreSQL, `agenttasks_end_v3` (`agenttasks/migrations/frozen/end_v3.sql`): an ending's
answer also says whether messages wait to re-open its task and which A2A push configs it owes, so
its effects ask neither in statements of their own. `agenttasks_end_v2`, which it calls, stays."""

from django.db import migrations

from agenttasks.sql import frozen, on_postgres


class Migration(migrations.Migration):

    dependencies = [
        ("agenttasks", "0033_claim_runs_v8"),
    ]

    operations = [
        migrations.RunPython(
            on_postgres(frozen("end_v3.sql")),
            on_postgres("DROP FUNCTION IF EXISTS agenttasks_end_v3(jsonb);"),
        ),
    ]
