"""Leaner writes: fewer indexes, one conversation update per event INSERT, targeted notifications.

- Foreign keys that lead a composite index lose their own index.
- PostgreSQL: the `varchar_pattern_ops` copies Django adds to indexed text columns (for LIKE,
  which no query of agenttasks uses) are dropped; every status change updates every index of a
  table, so each one costs on the hot path.
- PostgreSQL: the event trigger runs once per INSERT statement, not per row: one UPDATE of each
  conversation's `last_seq` and one NOTIFY per conversation however many events are appended.
- PostgreSQL: a run told to stop notifies `agenttasks_run_stop`, the only channel a worker
  process listens to (so workers are not woken by every event of every conversation).
"""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

from agenttasks.sql import on_postgres


DROP_LIKE_INDEXES = """
DO $$
DECLARE r record;
BEGIN
    FOR r IN SELECT indexname FROM pg_indexes
              WHERE schemaname = current_schema() AND tablename LIKE 'agenttasks\\_%'
                AND indexname LIKE '%\\_like'
    LOOP
        EXECUTE 'DROP INDEX ' || quote_ident(r.indexname);
    END LOOP;
END
$$;
"""

STOP_TRIGGER = """
CREATE OR REPLACE FUNCTION agenttasks_run_stop_requested() RETURNS trigger AS $$
BEGIN
    PERFORM pg_notify('agenttasks_run_stop', NEW.id);
    RETURN NULL;
END
$$ LANGUAGE plpgsql;

DROP TRIGGER IF EXISTS agenttasks_run_stop_requested ON agenttasks_run;
CREATE TRIGGER agenttasks_run_stop_requested
    AFTER UPDATE OF stop_request ON agenttasks_run
    FOR EACH ROW WHEN (NEW.stop_request <> '' AND OLD.stop_request IS DISTINCT FROM NEW.stop_request)
    EXECUTE FUNCTION agenttasks_run_stop_requested();
"""

NO_STOP_TRIGGER = """
DROP TRIGGER IF EXISTS agenttasks_run_stop_requested ON agenttasks_run;
DROP FUNCTION IF EXISTS agenttasks_run_stop_requested();
"""

STATEMENT_TRIGGER = """
CREATE OR REPLACE FUNCTION agenttasks_events_appended() RETURNS trigger AS $$
BEGIN
    UPDATE agenttasks_conversation c
       SET last_seq = n.seq, updated_at = n.created_at
      FROM (SELECT conversation_id, max(seq) AS seq, max(created_at) AS created_at
              FROM appended GROUP BY conversation_id) n
     WHERE c.id = n.conversation_id AND c.last_seq < n.seq;
    PERFORM pg_notify('agenttasks_events', conversation_id)
       FROM (SELECT DISTINCT conversation_id FROM appended) d;
    RETURN NULL;
END
$$ LANGUAGE plpgsql;

DROP TRIGGER IF EXISTS agenttasks_event_appended ON agenttasks_event;
DROP FUNCTION IF EXISTS agenttasks_event_appended();
DROP TRIGGER IF EXISTS agenttasks_events_appended ON agenttasks_event;
CREATE TRIGGER agenttasks_events_appended
    AFTER INSERT ON agenttasks_event REFERENCING NEW TABLE AS appended
    FOR EACH STATEMENT EXECUTE FUNCTION agenttasks_events_appended();
"""

ROW_TRIGGER = """
DROP TRIGGER IF EXISTS agenttasks_events_appended ON agenttasks_event;
DROP FUNCTION IF EXISTS agenttasks_events_appended();
CREATE OR REPLACE FUNCTION agenttasks_event_appended() RETURNS trigger AS $$
BEGIN
    UPDATE agenttasks_conversation
       SET last_seq = NEW.seq, updated_at = NEW.created_at
     WHERE id = NEW.conversation_id AND last_seq < NEW.seq;
    PERFORM pg_notify('agenttasks_events', NEW.conversation_id);
    RETURN NULL;
END
$$ LANGUAGE plpgsql;
CREATE TRIGGER agenttasks_event_appended
    AFTER INSERT ON agenttasks_event
    FOR EACH ROW EXECUTE FUNCTION agenttasks_event_appended();
"""


# SQLite rebuilds agenttasks_conversation to drop an index, which a trigger naming it would not
# survive: the trigger is taken down for the rebuild and put back after it.
SQLITE_TRIGGER = """
CREATE TRIGGER agenttasks_event_appended AFTER INSERT ON agenttasks_event
BEGIN
    UPDATE agenttasks_conversation
       SET last_seq = NEW.seq, updated_at = NEW.created_at
     WHERE id = NEW.conversation_id AND last_seq < NEW.seq;
END;
"""
SQLITE_NO_TRIGGER = "DROP TRIGGER IF EXISTS agenttasks_event_appended;"


def on_sqlite(sql):
    def run(apps, schema_editor):
        if schema_editor.connection.vendor == "sqlite":
            schema_editor.execute(sql)

    return run


class Migration(migrations.Migration):

    dependencies = [
        ('agenttasks', '0005_transition_functions'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.RunPython(on_sqlite(SQLITE_NO_TRIGGER), on_sqlite(SQLITE_TRIGGER)),
        migrations.AlterField(
            model_name='conversation',
            name='owner',
            field=models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='agenttasks_conversations', to=settings.AUTH_USER_MODEL, verbose_name='owner'),
        ),
        migrations.AlterField(
            model_name='pendingaction',
            name='conversation',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='actions', to='agenttasks.conversation', verbose_name='conversation'),
        ),
        migrations.AlterField(
            model_name='run',
            name='conversation',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='runs', to='agenttasks.conversation', verbose_name='conversation'),
        ),
        migrations.AlterField(
            model_name='task',
            name='owner',
            field=models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='agenttasks_tasks', to=settings.AUTH_USER_MODEL, verbose_name='owner'),
        ),
        migrations.AlterField(
            model_name='task',
            name='parent_conversation',
            field=models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='spawned_tasks', to='agenttasks.conversation', verbose_name='parent conversation'),
        ),
        migrations.RunPython(on_sqlite(SQLITE_TRIGGER), on_sqlite(SQLITE_NO_TRIGGER)),
        migrations.RunPython(on_postgres(DROP_LIKE_INDEXES), migrations.RunPython.noop),
        migrations.RunPython(on_postgres(STATEMENT_TRIGGER), on_postgres(ROW_TRIGGER)),
        migrations.RunPython(on_postgres(STOP_TRIGGER), on_postgres(NO_STOP_TRIGGER)),
    ]
