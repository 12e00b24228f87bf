"""On PostgreSQL, `agenttasks_task_changed_v1` (`agenttasks/migrations/frozen/task_changes_v1.sql`):
one row trigger checks a task's status change against the transition table, moves its two status
counters, owes its deliveries and notifies its settling, where four triggers did, and an insert is
counted by a row trigger. The functions of the triggers it replaces stay for the way back."""

from django.db import migrations

from agenttasks.sql import frozen, on_postgres

BACK = """
DROP TRIGGER agenttasks_task_changed ON agenttasks_task;
DROP TRIGGER agenttasks_task_inserted ON agenttasks_task;
DROP FUNCTION agenttasks_task_changed_v1();
CREATE TRIGGER agenttasks_task_transition
    BEFORE UPDATE OF status ON agenttasks_task
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION agenttasks_task_transition_v1();
CREATE TRIGGER agenttasks_task_counted_insert AFTER INSERT ON agenttasks_task
    REFERENCING NEW TABLE AS counted_new
    FOR EACH STATEMENT EXECUTE FUNCTION agenttasks_count_tasks_v2();
CREATE TRIGGER agenttasks_task_counted_update AFTER UPDATE ON agenttasks_task
    REFERENCING OLD TABLE AS counted_old NEW TABLE AS counted_new
    FOR EACH STATEMENT EXECUTE FUNCTION agenttasks_count_tasks_v2();
CREATE TRIGGER agenttasks_owe_deliveries AFTER UPDATE OF status ON agenttasks_task
    FOR EACH ROW WHEN (NEW.status IN ('cancelled', 'completed', 'failed', 'waiting_for_input')
                       AND OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION agenttasks_owe_deliveries_v1();
CREATE TRIGGER agenttasks_task_settled
    AFTER UPDATE OF status ON agenttasks_task
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION agenttasks_task_settled_v2();
"""


class Migration(migrations.Migration):

    dependencies = [
        ("agenttasks", "0035_listened_channels"),
    ]

    operations = [
        migrations.RunPython(on_postgres(frozen("task_changes_v1.sql")), on_postgres(BACK)),
    ]
