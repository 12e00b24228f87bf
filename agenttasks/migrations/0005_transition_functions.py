"""The hot transitions as SQL functions on PostgreSQL: create, claim and end (one statement each).

`agenttasks.store.postgres` calls them; the ORM path (SQLite) keeps the same contract. Each takes
the store's row locks in its documented order (task, conversation, run, parent conversation,
then actions and wake-ups), re-checks its predicate on the locked rows, and appends its events.
"""

from django.db import migrations

from agenttasks.sql import frozen, on_postgres

FORWARD = frozen("transition_functions_v0.sql")

BACKWARD = """
DROP FUNCTION IF EXISTS agenttasks_end CASCADE;
DROP FUNCTION IF EXISTS agenttasks_claim_run CASCADE;
DROP FUNCTION IF EXISTS agenttasks_create_task CASCADE;
DROP FUNCTION IF EXISTS agenttasks_record_end CASCADE;
DROP FUNCTION IF EXISTS agenttasks_cancel_actions CASCADE;
DROP FUNCTION IF EXISTS agenttasks_status_events CASCADE;
DROP FUNCTION IF EXISTS agenttasks_run_finished CASCADE;
DROP FUNCTION IF EXISTS agenttasks_usage CASCADE;
DROP FUNCTION IF EXISTS agenttasks_append CASCADE;
DROP FUNCTION IF EXISTS agenttasks_event CASCADE;
DROP FUNCTION IF EXISTS agenttasks_new_id CASCADE;
"""


class Migration(migrations.Migration):
    dependencies = [
        ("agenttasks", "0004_run_counted_usage"),
        ("django_q", "0007_ormq"),  # agenttasks_create_task writes the first run's job there
    ]

    operations = [migrations.RunPython(on_postgres(FORWARD), on_postgres(BACKWARD))]
