"""PostgreSQL: `agenttasks_create_task_v2` (`agenttasks/migrations/frozen/create_v2.sql`), a create that
notifies the worker processes listening on `agenttasks_runs` instead of writing a job."""

from django.db import migrations

from agenttasks.sql import frozen, on_postgres

DROP_V2 = """
DROP FUNCTION IF EXISTS agenttasks_create_task_v2(
    jsonb, jsonb, jsonb, jsonb, integer, integer, jsonb, boolean);
"""


def install() -> str:
    return frozen("create_v2.sql")


class Migration(migrations.Migration):
    dependencies = [("agenttasks", "0014_deliveries")]

    operations = [migrations.RunPython(on_postgres(install), on_postgres(DROP_V2))]
