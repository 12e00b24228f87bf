"""PostgreSQL: the helpers of the transitions with the id format and the trigger names written
in from Python (`agenttasks/migrations/frozen/helpers_v1.sql`), and the create, the claims, the ending and the
append on them: `agenttasks_create_task_v4`, `agenttasks_claim_v2` (`_tasks_v2`, `_runs_v2`),
`agenttasks_end_v2` and `agenttasks_append_to_v2`. The notifying triggers of migrations 0002 and
0006 get functions with the channels of `agenttasks.broker.listen` and the statuses of `states.NOTIFIED`
written in (`agenttasks/migrations/frozen/notify_v1.sql`).

The functions they replace stay installed for the code of earlier versions; nothing of this
version calls them."""

from django.db import migrations

from agenttasks.sql import frozen, on_postgres

FILES = (
    "helpers_v1.sql",
    "create_task_v4.sql",
    "claim_v2.sql",
    "end_v2.sql",
    "events_v2.sql",
    "notify_v1.sql",
)

DROP = """
DROP TRIGGER agenttasks_task_settled ON agenttasks_task;
CREATE TRIGGER agenttasks_task_settled
    AFTER UPDATE OF status ON agenttasks_task
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION agenttasks_task_settled();
DROP FUNCTION agenttasks_task_settled_v1();
DROP TRIGGER agenttasks_run_stop_requested ON agenttasks_run;
CREATE TRIGGER agenttasks_run_stop_requested
    AFTER UPDATE OF stop_request ON agenttasks_run
    FOR EACH ROW WHEN (NEW.stop_request <> '' AND OLD.stop_request IS DISTINCT FROM NEW.stop_request)
    EXECUTE FUNCTION agenttasks_run_stop_requested();
DROP FUNCTION agenttasks_run_stop_requested_v1();
DROP TRIGGER agenttasks_events_appended ON agenttasks_event;
CREATE TRIGGER agenttasks_events_appended
    AFTER INSERT ON agenttasks_event REFERENCING NEW TABLE AS appended
    FOR EACH STATEMENT EXECUTE FUNCTION agenttasks_events_appended();
DROP FUNCTION agenttasks_events_appended_v1();
DROP FUNCTION agenttasks_append_to_v2(text, jsonb, timestamptz);
DROP FUNCTION agenttasks_end_v2(jsonb);
DROP FUNCTION agenttasks_claim_runs_v2(text, integer, timestamptz, text[]);
DROP FUNCTION agenttasks_claim_tasks_v2(text[], text, timestamptz, integer, boolean);
DROP FUNCTION agenttasks_claim_v2(text, text, timestamptz, boolean, boolean);
DROP FUNCTION agenttasks_create_task_v4(
    jsonb, jsonb, jsonb, jsonb, integer, integer, jsonb, boolean);
DROP FUNCTION agenttasks_record_end_v1(agenttasks_run, jsonb, timestamptz);
DROP FUNCTION agenttasks_cancel_actions_v1(text, timestamptz);
DROP FUNCTION agenttasks_status_events_v1(agenttasks_task, text, text);
DROP FUNCTION agenttasks_run_finished_v1(agenttasks_run);
DROP FUNCTION agenttasks_usage_v1(agenttasks_run);
DROP FUNCTION agenttasks_append_v1(jsonb, timestamptz);
DROP FUNCTION agenttasks_event_v1(text, text, jsonb, text, text);
DROP FUNCTION agenttasks_trigger_name_v1(text);
DROP FUNCTION agenttasks_new_id_v1(text);
"""


def install() -> str:
    return "\n".join(frozen(name) for name in FILES)


class Migration(migrations.Migration):
    dependencies = [("agenttasks", "0017_versioned_transitions")]

    operations = [migrations.RunPython(on_postgres(install), on_postgres(DROP))]
