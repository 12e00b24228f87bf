"""The store's task transitions (store/tasks.py): create, retry, advance, pause and answer,
re-open and stop; each one's win, lose and unknown-id answers."""

from datetime import timedelta

import pytest
from django.utils import timezone

from agenttasks import ids, store
from agenttasks.exceptions import (
    ConversationNotFound,
    TaskError,
    TaskLimit,
    TaskNotFound,
)
from agenttasks.models import Comment, Conversation, PendingAction, Run, Task, TaskResult, Wakeup
from agenttasks.states import TaskStatus
from agenttasks.types import ActionRequest, NewTask, RunOutcome, StopOutcome

from ..factories import TaskFactory
from .support import APPROVAL, failed, reload, spawn, started

pytestmark = pytest.mark.django_db


# --- create_task / discard_spawn -------------------------------------------------------------


class TestCreateTask:
    def test_writes_conversation_task_run_and_events(self, parent):
        task = spawn(parent, kind="sequence", state={"step": 1})
        task = reload(task)
        assert task.status == "pending" and task.attempt == 1 and task.continuations == 0
        assert task.run.status == "queued" and task.run.trigger == "initial"
        assert task.run_id != task.id
        assert task.conversation.hidden and task.conversation.parent_id == parent.id
        assert task.conversation.title == "sequence: job"
        events = list(task.conversation.events.values_list("seq", "type"))
        assert events == [(1, "message.user"), (2, "task.status")]
        assert task.conversation.events.get(seq=2).data == {
            "taskId": task.id,
            "to": "pending",
            "runId": task.run_id,
            "attempt": 1,
        }
        # The status change is mirrored into the parent conversation for its task card.
        assert parent.events.get().type == "task.status"

    def test_visible_conversation_without_parent(self, user):
        task = store.create_task(NewTask(owner=user, agent="worker", input="x" * 80))
        assert not task.conversation.hidden and task.conversation.title == ""
        assert task.label == "x" * 60
        assert task.conversation.metadata == {"source": "task", "taskId": task.id}

    def test_cap_refuses_and_creates_nothing(self, parent):
        spawn(parent, cap=2)
        spawn(parent, cap=2)
        before = Conversation.objects.count()
        with pytest.raises(TaskLimit) as raised:
            spawn(parent, cap=2)
        assert raised.value.limit == 2
        assert (
            str(raised.value)
            == "tasks: this conversation already has 2 tasks running; wait for one to finish"
        )
        assert Conversation.objects.count() == before and Task.objects.count() == 2

    def test_unknown_or_deleting_parent(self, parent):
        with pytest.raises(ConversationNotFound):
            store.create_task(
                NewTask(parent_conversation_id="conv_nope", agent="worker", input="x")
            )
        Conversation.objects.filter(pk=parent.pk).update(deleting_at=timezone.now())
        with pytest.raises(ConversationNotFound):
            spawn(parent)

    def test_task_id_must_be_non_empty_and_new(self, parent):
        task = spawn(parent)
        with pytest.raises(TaskError, match="tasks: Create requires an ID"):
            spawn(parent, task_id="")
        with pytest.raises(TaskError, match=f"tasks: duplicate task id {task.id}"):
            spawn(parent, task_id=task.id)

    def test_discard_spawn_closes_the_card_in_the_parent_log(self, parent):
        task = spawn(parent)
        store.discard_spawn(task.id, "could not start: queue down")
        closing = parent.events.order_by("-seq").first()
        assert (closing.type, closing.task_id) == ("task.status", task.id)
        assert (
            closing.data["to"] == "failed"
            and closing.data["error"] == "could not start: queue down"
        )
        assert closing.data["reason"] == "launch failed"

    def test_discard_spawn_removes_everything_and_is_idempotent(self, parent):
        task = spawn(parent)
        store.discard_spawn(task.id)
        store.discard_spawn(task.id)
        assert not Task.objects.exists() and not Run.objects.filter(task_id=task.id).exists()
        assert not Conversation.objects.filter(pk=task.conversation_id).exists()
        with pytest.raises(TaskNotFound):
            Task.objects.read(task.id)


# --- retry_claim / release_retry_claim -------------------------------------------------------


class TestRetryClaim:
    def test_reopens_exactly_one_failed_attempt(self, parent):
        # 7.7.3
        working = spawn(parent)
        assert store.retry_claim(working.id, ids.new_run_id(), 3, None) is None
        task = failed(parent, reason="rate limited")
        new_run = ids.new_run_id()
        assert store.retry_claim(task.id, new_run, 3, None)
        task = reload(task)
        assert (task.status, task.run_id, task.attempt) == ("pending", new_run, 2)
        assert (task.summary, task.result, task.error) == ("", "", "")
        assert (task.started_at, task.finished_at) == (None, None)  # the new attempt has not run
        assert task.run.trigger == "retry" and "rate limited" in task.run.input
        assert task.run.input.startswith("A previous attempt at this task failed: rate limited. ")
        assert Wakeup.objects.get().state == "dropped"
        message = task.conversation.events.filter(type="message.user").order_by("-seq").first()
        assert message.data["origin"] == "retry"
        with pytest.raises(TaskNotFound):
            store.retry_claim("task_nope", ids.new_run_id(), 3, None)

    def test_enforces_the_attempt_ceiling(self, parent):
        # 7.7.4
        task = failed(parent)
        for expected in (2, 3):
            assert store.retry_claim(task.id, ids.new_run_id(), 3, None)
            task = reload(task)
            assert task.attempt == expected
            store.claim(task.run_id)
            store.finalize(task.id, task.run_id, "failed", result="again")
        assert store.retry_claim(task.id, ids.new_run_id(), 3, None) is None
        assert reload(task).attempt == 3

    def test_attempt_zero_reads_as_the_first(self, parent):
        # 7.7.5
        task = TaskFactory(status=TaskStatus.FAILED, attempt=0, parent_conversation=parent)
        assert store.retry_claim(task.id, ids.new_run_id(), 3, None)
        assert reload(task).attempt == 2

    def test_takes_a_slot_under_the_cap(self, parent):
        task = failed(parent)
        spawn(parent)
        spawn(parent)
        assert store.retry_claim(task.id, ids.new_run_id(), 3, 2) is None
        assert reload(task).status == "failed" and Run.objects.filter(task=task).count() == 1

    def test_refuses_a_dying_parent(self, parent):
        # 7.8.7
        task = failed(parent)
        Conversation.objects.filter(pk=parent.pk).update(deleting_at=timezone.now())
        assert store.retry_claim(task.id, ids.new_run_id(), 3, None) is None

    def test_release_rolls_the_attempt_back(self, parent):
        # 7.7.7
        task = failed(parent)
        run_id = ids.new_run_id()
        assert store.retry_claim(task.id, run_id, 3, None)
        assert store.release_retry_claim(task.id, "run_foreign", "s", "r") is None
        assert store.release_retry_claim(
            task.id, run_id, "retry could not start", "retry could not start: x"
        )
        task = reload(task)
        assert (task.status, task.attempt, task.summary) == ("failed", 1, "retry could not start")
        assert task.run.status == "failed"
        assert Wakeup.objects.filter(state="pending").count() == 1
        assert store.release_retry_claim(task.id, run_id, "s", "r") is None
        with pytest.raises(TaskNotFound):
            store.release_retry_claim("task_nope", run_id, "s", "r")


# --- advance ---------------------------------------------------------------------------------


class TestAdvance:
    def test_is_run_bound_and_carries_state(self, parent):
        # 7.7.6
        task = started(parent, kind="sequence", state={"step": 1})
        assert store.advance(task.id, "run_other", ids.new_run_id(), input="next") is None
        next_run = ids.new_run_id()
        assert store.advance(task.id, task.run_id, next_run, input="next", state={"step": 2})
        task = reload(task)
        assert (task.run_id, task.status, task.state, task.attempt, task.continuations) == (
            next_run,
            "pending",
            {"step": 2},
            1,
            1,
        )
        assert task.run.trigger == "continuation" and task.run.input == "next"
        # The same id on both sides rewrites the state only.
        assert store.advance(task.id, next_run, next_run, state={"step": 3})
        task = reload(task)
        assert (task.run_id, task.state, task.continuations) == (next_run, {"step": 3}, 1)
        # None keeps the recorded state.
        third = ids.new_run_id()
        assert store.advance(task.id, next_run, third, input="more")
        assert reload(task).state == {"step": 3}
        with pytest.raises(TaskNotFound):
            store.advance("task_nope", "run_x", "run_y")

    def test_paused_and_terminal_rows_refuse(self, parent):
        paused = started(parent)
        store.pause(paused.id, paused.run_id, actions=[APPROVAL])
        assert store.advance(paused.id, paused.run_id, ids.new_run_id()) is None
        done = started(parent)
        store.finalize(done.id, done.run_id, "completed")
        assert store.advance(done.id, done.run_id, ids.new_run_id()) is None


# --- mark_input_required / reclaim_working ---------------------------------------------------


class TestPauseAndResume:
    def test_are_run_bound(self, parent):
        # 7.7.8
        task = started(parent)
        assert store.pause(task.id, "run_stale", actions=[APPROVAL]) is None
        assert reload(task).status == "running" and not PendingAction.objects.exists()
        assert store.pause(task.id, task.run_id, actions=[APPROVAL])
        task = reload(task)
        assert task.status == "waiting_for_input" and task.run.status == "paused"
        action = PendingAction.objects.get()
        assert action.run_id == task.run_id and action.status == "pending"
        assert store.answer(task.id, "run_stale", action.id, {"status": "approved"}) is None
        action.refresh_from_db()
        assert action.status == "cancelled"  # a stale answer closes the action

    def test_the_right_answer_resumes(self, parent):
        task = started(parent)
        store.pause(task.id, task.run_id, actions=[APPROVAL])
        action = PendingAction.objects.get()
        assert store.answer(task.id, task.run_id, action.id, {"status": "approved"})
        task = reload(task)
        assert task.status == "pending" and task.run.status == "queued"
        action.refresh_from_db()
        assert action.status == "approved" and action.decided_at is not None
        types = list(task.conversation.events.values_list("type", flat=True))
        assert types[-4:] == ["action.requested", "task.status", "action.resolved", "task.status"]

    def test_resumes_after_the_last_open_action(self, parent):
        task = started(parent)
        second = ActionRequest(
            kind="question",
            tool_name="ask_user",
            tool_call_id="call-2",
            questions=[{"id": "q1", "question": "Which?"}],
        )
        store.pause(task.id, task.run_id, actions=[APPROVAL, second])
        first, other = PendingAction.objects.order_by("tool_call_id")
        assert store.answer(task.id, task.run_id, first.id, {"status": "denied"})
        assert reload(task).status == "waiting_for_input"
        assert store.answer(
            task.id,
            task.run_id,
            other.id,
            {"status": "answered", "answers": {"q1": {"values": ["x"]}}},
        )
        assert reload(task).status == "pending"

    def test_a_terminal_task_beats_a_late_answer(self, parent):
        task = started(parent)
        store.pause(task.id, task.run_id, actions=[APPROVAL])
        action = PendingAction.objects.get()
        store.finalize(task.id, task.run_id, "cancelled")
        assert store.answer(task.id, task.run_id, action.id, {"status": "approved"}) is None
        assert reload(task).status == "cancelled"

    def test_legacy_clarification_ends_the_run(self, parent):
        task = started(parent)
        assert store.pause(task.id, task.run_id, clarification="Which format?")
        task = reload(task)
        assert task.status == "waiting_for_input" and task.run.status == "completed"
        comment = Comment.objects.get()
        assert (comment.role, comment.content, comment.metadata) == (
            "agent",
            "Which format?",
            {"waitingForInput": True},
        )
        assert task.task_result.partial and task.task_result.content == "Which format?"
        assert not Wakeup.objects.exists()

    def test_unknown_task(self, db):
        with pytest.raises(TaskNotFound):
            store.pause("task_nope", "run_x")
        with pytest.raises(TaskNotFound):
            store.answer("task_nope", "run_x", "act_x", {"status": "approved"})


# --- reopen ----------------------------------------------------------------------------------


class TestReopen:
    def test_reopens_a_finished_task(self, parent, user):
        # 7.9.3
        task = started(parent)
        store.finalize(
            task.id, task.run_id, "completed", summary="s", result="r", task_result={"content": "r"}
        )
        new_run = ids.new_run_id()
        won = store.reopen(task.id, new_run, "use prod", author=user)
        assert won and won.new_comment.content == "use prod"
        task = reload(task)
        assert (task.status, task.run_id, task.attempt, task.summary, task.result) == (
            "pending",
            new_run,
            1,
            "",
            "",
        )
        assert task.run.trigger == "comment" and task.run.input == "use prod"
        assert (task.started_at, task.finished_at) == (None, None)  # the new run has not started
        assert Wakeup.objects.get().state == "dropped"
        assert not TaskResult.objects.filter(task=task).exists()

    def test_refuses_live_and_paused_tasks(self, parent):
        task = spawn(parent)
        assert store.reopen(task.id, ids.new_run_id(), "x") is None
        paused = started(parent)
        store.pause(paused.id, paused.run_id, actions=[APPROVAL])
        assert store.reopen(paused.id, ids.new_run_id(), "x") is None

    def test_accepts_a_clarification_wait(self, parent):
        task = started(parent)
        store.pause(task.id, task.run_id, clarification="Which?")
        assert store.reopen(task.id, ids.new_run_id(), "PDF")
        with pytest.raises(TaskNotFound):
            store.reopen("task_nope", ids.new_run_id(), "x")

    def test_an_answer_bound_to_a_clarification_takes_only_that_one(self, parent):
        task = started(parent)
        store.pause(task.id, task.run_id, clarification="Which?")
        asked = task.run_id
        assert store.reopen(task.id, ids.new_run_id(), "x", answering="run_other") is None
        answered = store.reopen(task.id, ids.new_run_id(), "PDF", answering=asked)
        assert answered and answered.new_comment.content == "PDF"
        store.finalize(task.id, answered.run_id, "completed", summary="s", result="r")
        # Ended: the same answer again would re-open it; bound to its question, it is refused.
        assert store.reopen(task.id, ids.new_run_id(), "PDF", answering=asked) is None


# --- request_stop ----------------------------------------------------------------------------


class TestRequestStop:
    def test_outcomes(self, parent):
        queued = spawn(parent)
        assert (
            store.request_stop(queued.id, queued.run_id, graceful=False) is StopOutcome.UNKNOWN_RUN
        )
        live = started(parent)
        assert store.request_stop(live.id, "run_other", graceful=False) is StopOutcome.MOVED
        assert store.request_stop(live.id, live.run_id, graceful=True) is StopOutcome.AFTER_TURN
        assert reload(live).run.stop_request == "after_turn"
        assert store.request_stop(live.id, live.run_id, graceful=False) is StopOutcome.CANCELLED
        # Never downgraded from now to after_turn.
        assert store.request_stop(live.id, live.run_id, graceful=True) is StopOutcome.CANCELLED
        assert reload(live).run.stop_request == "now"
        ended = started(parent)
        store.record_run_end(ended.run_id, RunOutcome(ended.run_id, "completed"))
        assert (
            store.request_stop(ended.id, ended.run_id, graceful=False)
            is StopOutcome.ALREADY_FINISHED
        )
        with pytest.raises(TaskNotFound):
            store.request_stop("task_nope", "run_x", graceful=False)

    def test_an_expired_lease_is_an_unknown_run(self, parent):
        task = started(parent)
        Run.objects.filter(pk=task.run_id).update(heartbeat_at=timezone.now() - timedelta(hours=1))
        assert store.request_stop(task.id, task.run_id, graceful=True) is StopOutcome.UNKNOWN_RUN
        assert reload(task).run.stop_request == ""
