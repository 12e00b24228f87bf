"""On PostgreSQL, `agenttasks_jobs_enqueued_v1` (`agenttasks/migrations/frozen/jobs_notify_v1.sql`):
each statement that enqueues django-q2 jobs notifies at its commit, so the pushers of
`agenttasks.broker.orm.ListeningORM` wait for jobs instead of polling the queue."""

from django.db import migrations

from agenttasks.sql import frozen, on_postgres

DROP = """
DROP TRIGGER IF EXISTS agenttasks_jobs_enqueued ON django_q_ormq;
DROP FUNCTION IF EXISTS agenttasks_jobs_enqueued_v1();
"""


class Migration(migrations.Migration):

    dependencies = [
        ("agenttasks", "0028_claim_runs_v6"),
        ("django_q", "0007_ormq"),
    ]

    operations = [
        migrations.RunPython(on_postgres(frozen("jobs_notify_v1.sql")), on_postgres(DROP)),
    ]
