"""The channels some process listens to (`ListenedChannel`) and, on PostgreSQL, the notifying
triggers of `agenttasks/migrations/frozen/notify_v2.sql`: a conversation's events and a task's
settling notify only while their channel is listened to."""

from django.db import migrations, models

from agenttasks.sql import frozen, on_postgres

BACK_TO_V2 = """
DROP TRIGGER agenttasks_events_appended ON agenttasks_event;
CREATE TRIGGER agenttasks_events_appended
    AFTER INSERT ON agenttasks_event REFERENCING NEW TABLE AS appended
    FOR EACH STATEMENT EXECUTE FUNCTION agenttasks_events_appended_v2();
DROP TRIGGER agenttasks_task_settled ON agenttasks_task;
CREATE TRIGGER agenttasks_task_settled
    AFTER UPDATE OF status ON agenttasks_task
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION agenttasks_task_settled_v1();
DROP FUNCTION agenttasks_events_appended_v3();
DROP FUNCTION agenttasks_task_settled_v2();
DROP FUNCTION agenttasks_listened_v1(text);
"""


class Migration(migrations.Migration):

    dependencies = [
        ("agenttasks", "0034_end_v3"),
    ]

    operations = [
        migrations.CreateModel(
            name="ListenedChannel",
            fields=[
                (
                    "channel",
                    models.CharField(
                        max_length=63, primary_key=True, serialize=False, verbose_name="channel"
                    ),
                ),
                ("until", models.DateTimeField(verbose_name="listened until")),
            ],
            options={
                "verbose_name": "listened channel",
                "verbose_name_plural": "listened channels",
            },
        ),
        migrations.RunPython(on_postgres(frozen("notify_v2.sql")), on_postgres(BACK_TO_V2)),
    ]
