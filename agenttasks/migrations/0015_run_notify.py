"""PostgreSQL: `agenttasks_create_task_v2` (`agenttasks/sql/create_v2.sql`), a create that
notifies the worker processes listening on `agenttasks_runs` instead of writing a job."""

from django.db import migrations

from agenttasks.sql import read

DROP_V2 = """
DROP FUNCTION IF EXISTS agenttasks_create_task_v2(
    jsonb, jsonb, jsonb, jsonb, integer, integer, jsonb, boolean);
"""


def install(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        with schema_editor.connection.cursor() as cursor:
            cursor.execute(read("create_v2.sql"))


def uninstall(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        with schema_editor.connection.cursor() as cursor:
            cursor.execute(DROP_V2)


class Migration(migrations.Migration):
    dependencies = [("agenttasks", "0014_deliveries")]

    operations = [migrations.RunPython(install, uninstall)]
