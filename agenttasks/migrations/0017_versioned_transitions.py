"""PostgreSQL: the create and the ending as versioned functions loaded from `.sql` files, with
the constants they share with Python written in when they were frozen (`agenttasks.sql`):
`agenttasks_create_task_v3` (`migrations/frozen/create_task_v3.sql`) and `agenttasks_end_v1`
(`migrations/frozen/end_v1.sql`).

The functions they replace (`agenttasks_create_task`, `_v2`, `agenttasks_end`) stay installed
for the code of earlier versions; nothing of this version calls them."""

from django.db import migrations

from agenttasks.sql import frozen, on_postgres

DROP = """
DROP FUNCTION IF EXISTS agenttasks_end_v1(jsonb);
DROP FUNCTION IF EXISTS agenttasks_create_task_v3(
    jsonb, jsonb, jsonb, jsonb, integer, integer, jsonb, boolean);
"""


def install() -> str:
    return frozen("create_task_v3.sql") + "\n" + frozen("end_v1.sql")


class Migration(migrations.Migration):
    dependencies = [
        ("agenttasks", "0016_task_transitions"),
        ("django_q", "0007_ormq"),  # the create writes the first run's job there
    ]

    operations = [migrations.RunPython(on_postgres(install), on_postgres(DROP))]
