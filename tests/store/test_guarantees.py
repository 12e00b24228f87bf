"""Listings, round trips and the database-level guarantees: scenarios 7.7–7.8 of
docs/lifecycle.md."""

from datetime import timedelta

import pytest
from django.test.utils import override_settings
from django.utils import timezone

from agenttasks import store
from agenttasks.exceptions import ConversationNotFound, TaskNotFound
from agenttasks.models import Conversation, Event, Run, Task, Wakeup
from agenttasks.states import LIVE, TERMINAL, TaskStatus
from agenttasks.types import NewTask

from ..factories import ConversationFactory, TaskFactory
from .support import reload, spawn, started

pytestmark = pytest.mark.django_db


# --- listings, round trips, database-level guarantees (7.7.1, 7.7.10, 7.8) -------------------


class TestListingsAndRoundTrips:
    def test_create_and_read_back(self, parent):
        # 7.7.1
        task = spawn(parent, kind="sequence", state={"a": [1, 2.5, None, "é"], "b": {"c": True}})
        read = Task.objects.read(task.id)
        assert read.kind == "sequence" and read.state == {
            "a": [1, 2.5, None, "é"],
            "b": {"c": True},
        }
        with pytest.raises(TaskNotFound):
            Task.objects.read("task_nope")
        assert Task.objects.get(conversation=task.conversation).id == task.id

    def test_every_field_round_trips(self, parent, parent_run):
        # 7.8.1
        task = spawn(
            parent,
            kind="k",
            state={"s": 1},
            inherit={"id": "worker", "tools": ["t"]},
            depth=2,
            parent_run_id=parent_run.pk,
            tool_call_id="call-1",
            callback_url="https://example.com/cb",
            metadata={"m": 1},
        )
        read = Task.objects.read(task.id)
        for field in (
            "agent",
            "input",
            "label",
            "kind",
            "state",
            "inherit",
            "depth",
            "parent_run_id",
            "tool_call_id",
            "callback_url",
            "metadata",
            "owner_id",
            "parent_conversation_id",
            "conversation_id",
            "run_id",
            "attempt",
            "status",
        ):
            assert getattr(read, field) == getattr(task, field), field

    def test_listings_and_discard(self, parent):
        # 7.7.10 and 7.8.4
        first = spawn(parent)
        second = started(parent)
        third = spawn(parent)
        store.finalize(second.id, second.run_id, "completed")
        assert {t.id for t in Task.objects.spawned_from(parent.id).live()} == {first.id, third.id}
        assert [t.id for t in Task.objects.spawned_from(parent.id).newest_first()] == [
            third.id,
            second.id,
            first.id,
        ]
        store.discard_spawn(third.id)
        with pytest.raises(TaskNotFound):
            Task.objects.read(third.id)

    def test_live_listing_matches_terminal(self, parent):
        # 7.8.5
        made = {
            status: TaskFactory(status=status, parent_conversation=parent)
            for status in TaskStatus.values
        }
        live = {t.id for t in Task.objects.spawned_from(parent.id).live()}
        for status, task in made.items():
            assert (task.id in live) == (status not in TERMINAL)
        assert LIVE | TERMINAL == set(TaskStatus.values) and not LIVE & TERMINAL

    def test_wakeup_bookkeeping_does_not_move_the_task(self, parent):
        # 7.8.3 (adapted)
        tasks = [started(parent) for _ in range(3)]
        for task in tasks:
            store.finalize(task.id, task.run_id, "completed", result="r")
        stamps = {t.id: reload(t).updated_at for t in tasks}
        assert store.consume_wakeup(tasks[0].id, tasks[0].run_id)
        delivery = Run.objects.create(conversation=parent, agent="default", trigger="wakeup")
        assert store.mark_delivered([Wakeup.objects.get(task=tasks[1])], delivery.id) == 1
        Wakeup.objects.filter(task=tasks[2]).update(state="dropped")
        assert {t.id: reload(t).updated_at for t in tasks} == stamps

    def test_task_without_parent_conversation(self, user):
        # 7.8.9 (adapted; the model tools' side is covered with them)
        task = store.create_task(NewTask(owner=user, agent="worker", input="x"))
        assert Task.objects.get(conversation=task.conversation).id == task.id
        assert task.parent_conversation_id is None
        store.claim(task.run_id)
        assert store.finalize(task.id, task.run_id, "completed", result="r")
        assert not Wakeup.objects.exists()


class TestDeleteTree:
    def test_rows_do_not_outlive_their_conversation(self, parent):
        # 7.8.8
        task = started(parent)
        Run.objects.filter(pk=task.run_id).update(heartbeat_at=timezone.now() - timedelta(hours=1))
        store.mark_deleting(parent.id)
        store.delete_tree(parent.id)
        assert not Task.objects.filter(pk=task.id).exists()
        fresh = ConversationFactory()
        assert not Task.objects.spawned_from(fresh.id).exists()
        assert store.fail_orphans() == []

    @override_settings(AGENTTASKS={"MAX_DEPTH": 2})
    def test_deleting_removes_the_task_tree(self, parent):
        # 7.8.10
        child = started(parent)
        grandchild = started(child.conversation, depth=2)
        store.finalize(grandchild.id, grandchild.run_id, "completed", result="r")
        store.finalize(child.id, child.run_id, "completed", result="r")
        unrelated = ConversationFactory()
        store.append_events(unrelated.id, [("message.user", {"content": "hi"}, "", "")])
        tree = store.mark_deleting(parent.id)
        assert set(tree) == {parent.id, child.conversation_id, grandchild.conversation_id}
        store.delete_tree(parent.id)
        assert not Conversation.objects.filter(pk__in=tree).exists()
        assert not Task.objects.exists() and not Wakeup.objects.exists()
        assert not Run.objects.filter(conversation_id__in=tree).exists()
        assert not Event.objects.filter(conversation_id__in=tree).exists()
        assert Event.objects.filter(conversation=unrelated).count() == 1

    def test_the_cascade_follows_live_edges_only(self, parent):
        # 7.8.11: task rows that name the root as parent, but whose own conversation is visible
        # or hangs under another conversation, do not drag those conversations along.
        other = ConversationFactory(owner=parent.owner)
        visible = TaskFactory(
            status=TaskStatus.COMPLETED,
            parent_conversation=parent,
            conversation=ConversationFactory(owner=parent.owner),
        )
        foreign = TaskFactory(
            status=TaskStatus.COMPLETED,
            parent_conversation=parent,
            conversation=ConversationFactory(owner=parent.owner, hidden=True, parent=other),
        )
        store.append_events(
            visible.conversation_id, [("message.user", {"content": "keep"}, "", "")]
        )
        store.delete_tree(parent.id)
        assert Conversation.objects.filter(pk=visible.conversation_id).exists()
        assert Conversation.objects.filter(pk=foreign.conversation_id).exists()
        assert Event.objects.filter(conversation_id=visible.conversation_id).count() == 1
        assert not Task.objects.filter(pk__in=[visible.id, foreign.id]).exists()

    def test_unknown_conversation(self, db):
        with pytest.raises(ConversationNotFound):
            store.mark_deleting("conv_nope")


class TestEventLog:
    def test_seq_has_no_gaps_and_moves_the_conversation(self, parent):
        before = Conversation.objects.get(pk=parent.pk).updated_at
        store.append_events(
            parent.id, [("message.user", {"content": str(i)}, "", "") for i in range(3)]
        )
        store.append_events(parent.id, [("message.assistant", {"content": "ok"}, "", "")])
        assert list(parent.events.values_list("seq", flat=True)) == [1, 2, 3, 4]
        parent.refresh_from_db()
        assert parent.last_seq == 4 and parent.updated_at >= before
