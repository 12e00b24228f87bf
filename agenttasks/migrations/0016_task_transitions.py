"""PostgreSQL: the transition table checked on every write of a task's status, by a trigger
(`agenttasks/sql/task_transitions_v1.sql`) whose allowed pairs come from `states.TRANSITIONS`.

A task is created `pending` (the one pair from no status), so only updates are checked."""

from django.db import migrations

from agenttasks.sql import read
from agenttasks.states import TRANSITIONS

DROP_V1 = """
DROP TRIGGER IF EXISTS agenttasks_task_transition ON agenttasks_task;
DROP FUNCTION IF EXISTS agenttasks_task_transition_v1();
"""


def allowed_pairs() -> str:
    """Return the table's pairs between two statuses as SQL text literals ('from>to')."""
    pairs = sorted(f"'{src}>{dst}'" for src, dst in TRANSITIONS if src is not None)
    return ", ".join(pairs)


def install(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        with schema_editor.connection.cursor() as cursor:
            cursor.execute(read("task_transitions_v1.sql").replace(":allowed", allowed_pairs()))


def uninstall(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        with schema_editor.connection.cursor() as cursor:
            cursor.execute(DROP_V1)


class Migration(migrations.Migration):
    dependencies = [("agenttasks", "0015_run_notify")]

    operations = [migrations.RunPython(install, uninstall)]
