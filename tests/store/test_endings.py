"""How runs end (store/endings.py): record_run_end and finalize; each one's win, lose and
unknown-id answers."""

import pytest
from django.db import DatabaseError, connection
from django.test.utils import CaptureQueriesContext

from agenttasks import store
from agenttasks.exceptions import RunNotFound, TaskNotFound
from agenttasks.models import PendingAction, Run, TaskResult, Wakeup
from agenttasks.types import NewTask, RunOutcome

from ..conftest import failing_inserts, on_postgres
from .support import APPROVAL, reload, spawn, started, statements

pytestmark = pytest.mark.django_db


# --- record_run_end --------------------------------------------------------------------------


class TestRecordRunEnd:
    def test_records_outcome_and_leaves_the_task(self, parent):
        task = started(parent)
        outcome = RunOutcome(
            task.run_id, "completed", text="ok", usage={"inputTokens": 1, "outputTokens": 2}
        )
        run = store.record_run_end(task.run_id, outcome)
        assert run.status == "completed" and run.output == "ok" and run.total_tokens == 3
        assert reload(task).status == "running"
        types = list(task.conversation.events.values_list("type", flat=True))
        assert types[-2:] == ["message.assistant", "run.finished"]

    def test_second_end_loses(self, parent):
        task = started(parent)
        assert store.record_run_end(task.run_id, RunOutcome(task.run_id, "failed", error="x"))
        assert store.record_run_end(task.run_id, RunOutcome(task.run_id, "completed")) is None
        assert Run.objects.get(pk=task.run_id).error == "x"

    def test_unknown_run(self, db):
        with pytest.raises(RunNotFound):
            store.record_run_end("run_nope", RunOutcome("run_nope", "completed"))


# --- finalize --------------------------------------------------------------------------------


class TestFinalize:
    def test_is_run_bound(self, parent):
        # 7.7.2
        task = started(parent)
        assert store.finalize(task.id, "run_other", "completed", result="r") is None
        won = store.finalize(
            task.id, task.run_id, "completed", summary="s", result="r", state={"n": 1}
        )
        assert won
        task = reload(task)
        assert (task.status, task.summary, task.result, task.state) == (
            "completed",
            "s",
            "r",
            {"n": 1},
        )
        assert task.finished_at is not None
        assert store.finalize(task.id, task.run_id, "failed", result="late") is None
        assert reload(task).status == "completed"

    def test_failed_writes_error_and_debt(self, parent):
        task = started(parent)
        assert store.finalize(task.id, task.run_id, "failed", summary="boom", result="boom!")
        task = reload(task)
        assert task.error == "boom!"
        debt = Wakeup.objects.get()
        assert (debt.status, debt.state, debt.run_id, debt.conversation_id) == (
            "failed",
            "pending",
            task.run_id,
            parent.id,
        )
        assert debt.truncated  # the result is longer than the summary

    def test_cancellation_owes_nothing_and_ends_a_queued_run(self, parent):
        task = spawn(parent)
        assert store.finalize(
            task.id, task.run_id, "cancelled", summary="stopped", reason="stopped"
        )
        task = reload(task)
        assert task.run.status == "cancelled" and not Wakeup.objects.exists()
        last = task.conversation.events.order_by("-seq").first()
        assert last.data["reason"] == "stopped" and last.data["from"] == "pending"

    def test_running_run_gets_the_stop_request(self, parent):
        task = started(parent)
        assert store.finalize(task.id, task.run_id, "cancelled")
        run = reload(task).run
        assert run.status == "running" and run.stop_request == "now"

    def test_paused_run_and_its_actions_end_with_it(self, parent):
        task = started(parent)
        assert store.pause(task.id, task.run_id, actions=[APPROVAL])
        assert store.finalize(
            task.id, task.run_id, "cancelled", summary="stopped while awaiting approval"
        )
        assert reload(task).run.status == "cancelled"
        assert PendingAction.objects.get().status == "cancelled"

    def test_writes_the_task_result(self, parent):
        task = started(parent)
        store.finalize(
            task.id,
            task.run_id,
            "completed",
            result="r",
            task_result={"content": "r", "usage": {"inputTokens": 1}},
        )
        assert TaskResult.objects.get(task=task).content == "r"

    def test_unknown_task(self, db):
        with pytest.raises(TaskNotFound, match="tasks: not found"):
            store.finalize("task_nope", "run_x", "completed")

    def test_no_debt_without_parent_or_for_delegates(self, parent, user):
        solo = store.create_task(NewTask(owner=user, agent="worker", input="x"))
        store.claim(solo.run_id)
        assert store.finalize(solo.id, solo.run_id, "completed", result="r")
        child = spawn(parent, kind="delegate")
        assert store.finalize(child.id, child.run_id, "failed", result="r")
        assert not Wakeup.objects.exists()

    def test_debt_is_atomic_with_the_ending(self, parent):
        # 7.9.6: an error after the status write, inside the transaction, keeps neither.
        task = started(parent)
        with failing_inserts("agenttasks_wakeup"), pytest.raises(DatabaseError):
            store.finalize(task.id, task.run_id, "completed", result="r")
        assert reload(task).status == "running" and not Wakeup.objects.exists()
        assert store.finalize(task.id, task.run_id, "completed", result="r")
        assert Wakeup.objects.count() == 1

    @pytest.mark.django_db(transaction=True)
    def test_statement_count_with_debt(self, parent):
        task = started(parent)
        store.record_run_end(task.run_id, RunOutcome(task.run_id, "completed", text="ok"))
        with CaptureQueriesContext(connection) as captured:
            assert store.finalize(task.id, task.run_id, "completed", summary="ok", result="ok")
        # PostgreSQL: one call of agenttasks_end (its trigger records the deliveries owed). The
        # ORM: lock task+conversation+run, lock parent, UPDATE task, look up its push configs
        # (none: no delivery owed, no insert), INSERT wake-up, INSERT events.
        assert len(statements(captured)) == (1 if on_postgres() else 6), statements(captured)
