"""Factories build every model; database constraints hold the invariants they name."""

import pytest
from django.db import IntegrityError, transaction

from agenttasks.models import Conversation, Event, Wakeup

from . import factories

pytestmark = pytest.mark.django_db

ALL_FACTORIES = [
    factories.UserFactory,
    factories.ConversationFactory,
    factories.EventFactory,
    factories.RunFactory,
    factories.TaskFactory,
    factories.TaskResultFactory,
    factories.CommentFactory,
    factories.PendingActionFactory,
    factories.WakeupFactory,
    factories.FileFactory,
]


@pytest.mark.parametrize("factory", ALL_FACTORIES, ids=lambda f: f.__name__)
def test_factory_builds_a_saved_row(factory):
    obj = factory()
    assert obj.pk is not None
    assert type(obj).objects.filter(pk=obj.pk).exists()


@pytest.mark.parametrize(
    "status", ["pending", "running", "waiting_for_input", "completed", "failed", "cancelled"]
)
def test_task_factory_keeps_the_run_consistent(status):
    task = factories.TaskFactory(status=status)
    assert task.run.task_id == task.id and task.run.conversation_id == task.conversation_id


def test_seq_is_unique_per_conversation():
    event = factories.EventFactory()
    with pytest.raises(IntegrityError), transaction.atomic():
        Event.objects.create(conversation=event.conversation, seq=event.seq, type="x")


def test_one_pending_wakeup_per_task():
    wakeup = factories.WakeupFactory()
    with pytest.raises(IntegrityError), transaction.atomic():
        Wakeup.objects.create(
            conversation=wakeup.conversation,
            task=wakeup.task,
            run_id="run_other",
            status="completed",
        )


def test_one_wakeup_per_task_and_run():
    wakeup = factories.WakeupFactory(state="delivered")
    with pytest.raises(IntegrityError), transaction.atomic():
        Wakeup.objects.create(
            conversation=wakeup.conversation,
            task=wakeup.task,
            run_id=wakeup.run_id,
            status="completed",
            state="dropped",
        )


def test_one_result_per_task():
    result = factories.TaskResultFactory()
    with pytest.raises(IntegrityError), transaction.atomic():
        factories.TaskResultFactory(task=result.task)


def test_one_delegate_child_per_key():
    parent = factories.ConversationFactory()
    factories.TaskFactory(kind="delegate", delegation_key="k", parent_conversation=parent)
    with pytest.raises(IntegrityError), transaction.atomic():
        factories.TaskFactory(kind="delegate", delegation_key="k", parent_conversation=parent)
    factories.TaskFactory(kind="", delegation_key="k", parent_conversation=parent)  # not a delegate


def test_event_insert_moves_the_conversation_counter():
    conversation = factories.ConversationFactory()
    factories.EventFactory(conversation=conversation, seq=1)
    factories.EventFactory(conversation=conversation, seq=2)
    assert Conversation.objects.get(pk=conversation.pk).last_seq == 2
