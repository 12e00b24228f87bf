"""On PostgreSQL, `agenttasks_events_appended_v2`
(`agenttasks/migrations/frozen/events_appended_v2.sql`): the trigger of appended events updates
each conversation's last_seq by its primary key. Version 1's join could keep a plan that read
every conversation for each append."""

from django.db import migrations

from agenttasks.sql import frozen, on_postgres

BACK_TO_V1 = """
DROP TRIGGER agenttasks_events_appended ON agenttasks_event;
CREATE TRIGGER agenttasks_events_appended
    AFTER INSERT ON agenttasks_event REFERENCING NEW TABLE AS appended
    FOR EACH STATEMENT EXECUTE FUNCTION agenttasks_events_appended_v1();
DROP FUNCTION agenttasks_events_appended_v2();
"""


class Migration(migrations.Migration):

    dependencies = [
        ("agenttasks", "0026_claim_runs_v5"),
    ]

    operations = [
        migrations.RunPython(
            on_postgres(frozen("events_appended_v2.sql")), on_postgres(BACK_TO_V1)
        ),
    ]
