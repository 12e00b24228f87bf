"""PostgreSQL: the create and the ending as versioned functions loaded from `.sql` files, with
the constants they share with Python written in (`agenttasks.sql.render`):
`agenttasks_create_task_v3` (`migrations/sql/create_task_v3.sql`) and `agenttasks_end_v1`
(`migrations/sql/end_v1.sql`).

The functions they replace (`agenttasks_create_task`, `_v2`, `agenttasks_end`) stay installed
for the code of earlier versions; nothing of this version calls them."""

from django.db import migrations

from agenttasks.sql import on_postgres, render

DROP = """
DROP FUNCTION IF EXISTS agenttasks_end_v1(jsonb);
DROP FUNCTION IF EXISTS agenttasks_create_task_v3(
    jsonb, jsonb, jsonb, jsonb, integer, integer, jsonb, boolean);
"""


def install() -> str:
    return render("create_task_v3.sql") + "\n" + render("end_v1.sql")


class Migration(migrations.Migration):
    dependencies = [
        ("agenttasks", "0016_task_transitions"),
        ("django_q", "0007_ormq"),  # the create writes the first run's job there
    ]

    operations = [migrations.RunPython(on_postgres(install), on_postgres(DROP))]
