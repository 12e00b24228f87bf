"""The store's claims (store/claims.py): a win, a second delivery, housekeeping, unknown runs."""

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from agenttasks import store
from agenttasks.exceptions import RunNotFound
from agenttasks.models import Conversation, Run
from agenttasks.types import NewTask

from ..conftest import on_postgres
from .support import failed, reload, spawn, statements

pytestmark = pytest.mark.django_db


class TestClaim:
    def test_win(self, parent):
        task = spawn(parent)
        run = store.claim(task.run_id, "host:1:thread")
        assert run and run.status == "running" and run.worker == "host:1:thread"
        task = reload(task)
        assert task.status == "running" and task.started_at is not None
        assert task.run.heartbeat_at is not None
        types = list(task.conversation.events.values_list("type", flat=True))
        assert types[-2:] == ["run.started", "task.status"]

    def test_second_delivery_loses(self, parent):
        task = spawn(parent)
        assert store.claim(task.run_id, "w1")
        assert store.claim(task.run_id, "w2") is None
        assert reload(task).run.worker == "w1"

    def test_a_run_its_task_left_is_cancelled_not_run(self, parent):
        # 7.9.2: a pending task is stopped; a later claim loses and the run never runs.
        task = spawn(parent)
        assert store.finalize(task.id, task.run_id, "cancelled", summary="stopped")
        assert store.claim(task.run_id, "w1") is None
        assert reload(task).run.status == "cancelled"

    def test_stale_queued_run_is_cancelled_by_housekeeping(self, parent):
        task = failed(parent)
        stale = Run.objects.create(
            conversation=task.conversation,
            task=task,
            agent="worker",
            trigger="retry",
            status="queued",
        )
        assert store.claim(stale.id) is None
        stale.refresh_from_db()
        assert stale.status == "cancelled"

    def test_unknown_run(self, db):
        with pytest.raises(RunNotFound, match="tasks: run not found"):
            store.claim("run_nope")

    def test_taskless_run(self, parent):
        run = Run.objects.create(conversation=parent, agent="default", trigger="message")
        assert store.claim(run.id, "w1").status == "running"
        assert store.claim(run.id, "w1") is None

    def test_deleting_conversation_refuses(self, parent):
        task = spawn(parent)
        Conversation.objects.filter(pk=task.conversation_id).update(deleting_at=timezone.now())
        assert store.claim(task.run_id) is None

    @pytest.mark.django_db(transaction=True)
    def test_statement_count(self, user):
        task = store.create_task(NewTask(owner=user, agent="worker", input="x"))
        with CaptureQueriesContext(connection) as captured:
            assert store.claim(task.run_id, "w1")
        # PostgreSQL: one call of agenttasks_claim_v2. The ORM: lock task+conversation+run,
        # UPDATE run, UPDATE task, INSERT events.
        assert len(statements(captured)) == (1 if on_postgres() else 4), statements(captured)


@pytest.mark.skipif("not on_postgres()")
@pytest.mark.django_db(transaction=True)
def test_a_claims_plans_made_on_small_tables_read_no_whole_table(user):
    # A worker's connection keeps the claim's plans (generic plans, made once): those made while
    # the tables were small must still go by the indexes once they are large.
    def created(n):
        return [store.create_task(NewTask(owner=user, agent="worker", input="x")) for _ in range(n)]

    def claimed(tasks):
        claim = store.claim_many("w1", len(tasks), first=[t.run_id for t in tasks])
        assert len(claim.runs) == len(tasks)

    claimed(created(2))  # the plans are made on tables of a few rows
    claimed(created(300))
    tasks = created(3)
    with transaction.atomic(), connection.cursor() as cursor:
        read = (
            "SELECT coalesce(sum(seq_scan), 0) FROM pg_stat_xact_user_tables"
            " WHERE relname IN ('agenttasks_run', 'agenttasks_task', 'agenttasks_conversation')"
        )
        cursor.execute(read)
        before = cursor.fetchone()[0]
        claimed(tasks)
        cursor.execute(read)
        assert cursor.fetchone()[0] == before
