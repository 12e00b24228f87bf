"""Many runs in flight per worker process: the claim of several runs, and the processes' slots.

- PostgreSQL: `agenttasks_claim_v1` (one run), `agenttasks_claim_tasks_v1` (the runs of several
  tasks at once) and `agenttasks_claim_runs_v1` (up to a number of queued runs in one statement),
  from `agenttasks/migrations/frozen/claim_v1.sql`.
  They replace 0005's `agenttasks_claim_run`.
- PostgreSQL: the task counts' trigger takes its row locks in status order
  (`agenttasks/migrations/frozen/task_counts_v2.sql`), so a claim of many runs and the endings do not deadlock.
- PostgreSQL: `agenttasks_append_to_v1`, a runtime's events appended in one statement
  (`agenttasks/migrations/frozen/events_v1.sql`).
- `WorkerProcess`: each worker process's slots and runs in flight, for metrics and health.
"""

import importlib

from django.db import migrations, models

from agenttasks.sql import frozen

DROP_V1 = """
DROP FUNCTION IF EXISTS agenttasks_claim_runs_v1(text, integer, timestamptz, text[]);
DROP FUNCTION IF EXISTS agenttasks_claim_tasks_v1(text[], text, timestamptz, integer, boolean);
DROP FUNCTION IF EXISTS agenttasks_claim_v1(text, text, timestamptz, boolean, boolean);
DROP FUNCTION IF EXISTS agenttasks_append_to_v1(text, jsonb, timestamptz);
"""
# The triggers back on 0012's function (which version 2 leaves in place).
COUNTS_V1 = "\n".join(
    f"CREATE OR REPLACE TRIGGER agenttasks_task_counted_{op.lower()} AFTER {op} ON agenttasks_task"
    f"{tables} FOR EACH STATEMENT EXECUTE FUNCTION agenttasks_count_tasks();"
    for op, tables in (
        ("INSERT", " REFERENCING NEW TABLE AS counted_new"),
        ("UPDATE", " REFERENCING OLD TABLE AS counted_old NEW TABLE AS counted_new"),
        ("DELETE", " REFERENCING OLD TABLE AS counted_old"),
        ("TRUNCATE", ""),
    )
) + "\nDROP FUNCTION IF EXISTS agenttasks_count_tasks_v2();"
DROP_CLAIM_RUN = "DROP FUNCTION IF EXISTS agenttasks_claim_run(text, text, timestamptz);"


def install(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        with schema_editor.connection.cursor() as cursor:
            cursor.execute(frozen("claim_v1.sql"))
            cursor.execute(DROP_CLAIM_RUN)
            cursor.execute(frozen("task_counts_v2.sql"))
            cursor.execute(frozen("events_v1.sql"))


def uninstall(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        # 0005's functions again (CREATE OR REPLACE), agenttasks_claim_run among them, and
        # 0012's task counts.
        functions = importlib.import_module("agenttasks.migrations.0005_transition_functions")
        with schema_editor.connection.cursor() as cursor:
            cursor.execute(DROP_V1)
            cursor.execute(functions.FORWARD)
            cursor.execute(COUNTS_V1)


class Migration(migrations.Migration):

    dependencies = [
        ('agenttasks', '0012_task_counts'),
    ]

    operations = [
        migrations.CreateModel(
            name='WorkerProcess',
            fields=[
                ('id', models.CharField(max_length=200, primary_key=True, serialize=False, verbose_name='process')),
                ('node', models.CharField(max_length=200, verbose_name='node')),
                ('slots', models.PositiveIntegerField(verbose_name='slots')),
                ('busy', models.PositiveIntegerField(default=0, verbose_name='runs in flight')),
                ('started_at', models.DateTimeField(verbose_name='started')),
                ('seen_at', models.DateTimeField(verbose_name='seen')),
            ],
            options={
                'verbose_name': 'worker process',
                'verbose_name_plural': 'worker processes',
            },
        ),
        migrations.RunPython(install, uninstall),
    ]
