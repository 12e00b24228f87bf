"""factory-boy factories for every model; TaskFactory builds the task, its conversation and run."""

import factory
from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from agenttasks import ids
from agenttasks.models import (
    Comment,
    Conversation,
    Event,
    File,
    PendingAction,
    Run,
    Task,
    TaskResult,
    Wakeup,
)
from agenttasks.states import RunStatus, TaskStatus
from agenttasks.types import default_label


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = get_user_model()
        django_get_or_create = ("username",)

    username = factory.Sequence(lambda n: f"user{n}")


class ConversationFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Conversation

    owner = factory.SubFactory(UserFactory)
    agent = "default"


class EventFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Event

    conversation = factory.SubFactory(ConversationFactory)
    seq = factory.LazyAttribute(lambda o: o.conversation.last_seq + 1)
    type = "message.user"
    data = factory.LazyAttribute(lambda o: {"content": "hello", "origin": "message"})


class RunFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Run

    conversation = factory.SubFactory(ConversationFactory)
    owner = factory.SelfAttribute("conversation.owner")
    agent = "default"
    trigger = "message"
    status = RunStatus.QUEUED


# Run statuses that go with a task status when a test asks only for the task's.
_RUN_STATUS_FOR = {
    TaskStatus.PENDING: RunStatus.QUEUED,
    TaskStatus.RUNNING: RunStatus.RUNNING,
    TaskStatus.WAITING_FOR_INPUT: RunStatus.PAUSED,
    TaskStatus.COMPLETED: RunStatus.COMPLETED,
    TaskStatus.FAILED: RunStatus.FAILED,
    TaskStatus.CANCELLED: RunStatus.CANCELLED,
}


class TaskFactory(factory.django.DjangoModelFactory):
    """A task in any status; `run_status`, `heartbeat_at` and `parent_conversation` are options."""

    class Meta:
        model = Task

    owner = factory.SubFactory(UserFactory)
    agent = "worker"
    input = "do it"
    label = factory.LazyAttribute(lambda o: default_label(o.input))
    status = TaskStatus.PENDING

    @classmethod
    def _create(cls, model_class, *args, **kwargs):
        run_status = kwargs.pop("run_status", None) or _RUN_STATUS_FOR[kwargs["status"]]
        heartbeat_at = kwargs.pop("heartbeat_at", None)
        now = timezone.now()
        if run_status == RunStatus.RUNNING and heartbeat_at is None:
            heartbeat_at = now
        task_id = kwargs.pop("id", None) or ids.new_task_id()
        parent = kwargs.get("parent_conversation")
        with transaction.atomic():
            conversation = kwargs.pop("conversation", None) or Conversation.objects.create(
                owner=kwargs.get("owner"),
                agent=kwargs.get("agent", "worker"),
                hidden=parent is not None,
                parent=parent,
                metadata={"source": "task", "taskId": task_id},
            )
            run = Run(
                conversation=conversation,
                task_id=task_id,
                agent=kwargs.get("agent", "worker"),
                trigger="initial",
                input=kwargs.get("input", ""),
                status=run_status,
                heartbeat_at=heartbeat_at,
                started_at=heartbeat_at,
                ended_at=now if run_status in ("completed", "failed", "cancelled") else None,
            )
            task = model_class(id=task_id, conversation=conversation, run=run, **kwargs)
            task.save(force_insert=True)
            run.save(force_insert=True)
        return task


class TaskResultFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = TaskResult

    task = factory.SubFactory(TaskFactory, status=TaskStatus.COMPLETED)
    run_id = factory.LazyAttribute(lambda o: o.task.run_id)
    content = "done"


class CommentFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Comment

    task = factory.SubFactory(TaskFactory)
    role = Comment.Role.USER
    content = "a comment"
    run_id = factory.LazyAttribute(lambda o: o.task.run_id)


class PendingActionFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = PendingAction

    task = factory.SubFactory(TaskFactory, status=TaskStatus.WAITING_FOR_INPUT)
    conversation = factory.LazyAttribute(lambda o: o.task.conversation)
    run = factory.LazyAttribute(lambda o: o.task.run)
    kind = "approval"
    tool_name = "deploy"
    tool_call_id = factory.Sequence(lambda n: f"call-{n}")
    args = factory.LazyAttribute(lambda o: {"env": "prod"})


class WakeupFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Wakeup

    conversation = factory.SubFactory(ConversationFactory)
    task = factory.SubFactory(
        TaskFactory,
        status=TaskStatus.COMPLETED,
        parent_conversation=factory.SelfAttribute("..conversation"),
    )
    run_id = factory.LazyAttribute(lambda o: o.task.run_id)
    status = "completed"
    label = factory.LazyAttribute(lambda o: o.task.label)
    summary = "done"


class FileFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = File

    conversation = factory.SubFactory(ConversationFactory)
    owner = factory.LazyAttribute(lambda o: o.conversation.owner)
    name = "notes.txt"
    mime_type = "text/plain"
    size = 11
    sha256 = "b94d27b9934d3e08a52e52d7da7dabfac484efe37a5380ee9088f7ace2efcde9"
    storage_name = factory.LazyAttribute(lambda o: f"agenttasks/{o.name}")
