"""Database triggers: the conversation's seq counter, and PostgreSQL notifications.

- Every inserted event moves its conversation's `last_seq` and `updated_at`, so appending events
  is one INSERT; the writer reads the next seq from the conversation row it has locked.
- On PostgreSQL, each event notifies `agenttasks_events` (payload: conversation id) and each task
  that settles notifies `agenttasks_task_ended` (payload: task id), so stream readers and status
  waiters in other processes wake at commit instead of at their next poll.
"""

from django.db import migrations

POSTGRES_FORWARD = """
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

CREATE OR REPLACE FUNCTION agenttasks_task_settled() RETURNS trigger AS $$
BEGIN
    IF NEW.status IN ('completed', 'failed', 'cancelled', 'waiting_for_input') THEN
        PERFORM pg_notify('agenttasks_task_ended', NEW.id);
    END IF;
    RETURN NULL;
END
$$ LANGUAGE plpgsql;

CREATE TRIGGER agenttasks_task_settled
    AFTER UPDATE OF status ON agenttasks_task
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION agenttasks_task_settled();
"""

POSTGRES_BACKWARD = """
DROP TRIGGER IF EXISTS agenttasks_task_settled ON agenttasks_task;
DROP FUNCTION IF EXISTS agenttasks_task_settled();
DROP TRIGGER IF EXISTS agenttasks_event_appended ON agenttasks_event;
DROP FUNCTION IF EXISTS agenttasks_event_appended();
"""

SQLITE_FORWARD = """
CREATE TRIGGER agenttasks_event_appended AFTER INSERT ON agenttasks_event
BEGIN
    UPDATE agenttasks_conversation
       SET last_seq = NEW.seq, updated_at = NEW.created_at
     WHERE id = NEW.conversation_id AND last_seq < NEW.seq;
END;
"""

SQLITE_BACKWARD = "DROP TRIGGER IF EXISTS agenttasks_event_appended;"


def _run(sql_by_vendor):
    def run(apps, schema_editor):
        sql = sql_by_vendor.get(schema_editor.connection.vendor)
        if sql is None:
            raise RuntimeError(
                f"agenttasks supports PostgreSQL and SQLite, not {schema_editor.connection.vendor}"
            )
        if schema_editor.connection.vendor == "sqlite":
            schema_editor.execute(sql)
        else:
            with schema_editor.connection.cursor() as cursor:
                cursor.execute(sql)

    return run


class Migration(migrations.Migration):
    dependencies = [("agenttasks", "0001_initial")]

    operations = [
        migrations.RunPython(
            _run({"postgresql": POSTGRES_FORWARD, "sqlite": SQLITE_FORWARD}),
            _run({"postgresql": POSTGRES_BACKWARD, "sqlite": SQLITE_BACKWARD}),
        ),
    ]
