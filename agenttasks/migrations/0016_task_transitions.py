"""PostgreSQL: the transition table checked on every write of a task's status, by a trigger
(`agenttasks/migrations/frozen/task_transitions_v1.sql`) whose allowed pairs come from `states.TRANSITIONS`.

A task is created `pending` (the one pair from no status), so only updates are checked."""

from django.db import migrations

from agenttasks.sql import frozen, on_postgres

DROP_V1 = """
DROP TRIGGER IF EXISTS agenttasks_task_transition ON agenttasks_task;
DROP FUNCTION IF EXISTS agenttasks_task_transition_v1();
"""


def install() -> str:
    return frozen("task_transitions_v1.sql")


class Migration(migrations.Migration):
    dependencies = [("agenttasks", "0015_run_notify")]

    operations = [migrations.RunPython(on_postgres(install), on_postgres(DROP_V1))]
