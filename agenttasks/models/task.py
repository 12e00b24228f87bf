from collections.abc import Iterable, Iterator

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone

from .. import ids, tracing
from ..exceptions import TaskNotFound
from ..states import LIVE, TaskKind, TaskStatus


class TaskQuerySet(models.QuerySet["Task"]):
    """Tasks by the named states every reader asks for."""

    def visible(self) -> "TaskQuerySet":
        """Return tasks whose conversation tree is not being deleted."""
        return self.filter(conversation__deleting_at__isnull=True)

    def owned_by(self, owner_id: int | None) -> "TaskQuerySet":
        """Return a principal's tasks (None: the anonymous principal's), the lookup every surface
        uses."""
        return self.filter(owner_id=owner_id)

    def named(self, task_id: str) -> "Task | None":
        """Return the visible task with this id, or None (an id with a NUL names nothing).

        The lookup of every surface; each then applies its own owner rule (REST answers 403,
        A2A and MCP not found).
        """
        if "\x00" in task_id:
            return None
        return self.visible().filter(pk=task_id).first()

    def live(self) -> "TaskQuerySet":
        """Return tasks that are pending, running or waiting for input."""
        return self.filter(status__in=LIVE)

    def spawned_from(self, conversation_id: str) -> "TaskQuerySet":
        """Return tasks a conversation spawned, delegates (which their caller drives) excluded."""
        return self.filter(parent_conversation_id=conversation_id).exclude(kind=TaskKind.DELEGATE)

    def tree_edges(self) -> "TaskQuerySet":
        """Return the tasks that are edges of a conversation tree: a hidden conversation whose
        parent is the conversation that spawned it (what a delete takes with it)."""
        return self.filter(
            conversation__hidden=True, conversation__parent_id=models.F("parent_conversation_id")
        )

    def levels_below(self, roots: Iterable[str]) -> Iterator[list["Task"]]:
        """Yield the tasks of this queryset spawned below `roots`, one level at a time.

        A level is the tasks spawned from the previous level's conversations; the walk follows
        only the tasks this queryset holds, and reaches each conversation once.
        """
        frontier = list(roots)
        seen = set(frontier)
        while frontier:
            level: list[Task] = []
            for task in self.filter(parent_conversation_id__in=frontier):
                if task.conversation_id not in seen:
                    seen.add(task.conversation_id)
                    level.append(task)
            if not level:
                return
            yield level
            frontier = [task.conversation_id for task in level]

    def newest_first(self) -> "TaskQuerySet":
        return self.order_by("-created_at", "-id")

    def read(self, task_id: str) -> "Task":
        """Read a task with its conversation and current run, or raise TaskNotFound."""
        task = self.select_related("conversation", "run").filter(pk=task_id).first()
        if task is None:
            raise TaskNotFound(task_id)
        return task


class Task(models.Model):
    """The durable entity: a sub-agent's job that outlives the turn that started it."""

    id = models.CharField(
        primary_key=True, max_length=ids.MAX_ID_LENGTH, default=ids.new_task_id, editable=False
    )
    # The current run. Replaced only by the store's advance, retry_claim and reopen.
    run = models.ForeignKey(
        "agenttasks.Run",
        on_delete=models.DO_NOTHING,
        related_name="+",
        verbose_name="current run",
    )
    attempt = models.IntegerField("attempt", default=1)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="agenttasks_tasks",
        verbose_name="owner",
        db_index=False,  # agenttasks_task_owner_idx leads with it
    )
    agent = models.CharField("agent", max_length=64)
    input = models.TextField("input")
    label = models.CharField("label", max_length=200, blank=True)
    kind = models.CharField("kind", max_length=64, blank=True)
    priority = models.SmallIntegerField(
        "priority",
        default=0,
        db_default=0,
        help_text="Higher first: claims take a higher priority first, within each owner's share.",
    )
    # The schedule whose tick created it (docs/lifecycle.md#schedules).
    schedule = models.ForeignKey(
        "agenttasks.Schedule",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="tasks",
        verbose_name="schedule",
        db_index=False,  # agenttasks_task_schedule_idx, for the tasks that have one
    )
    state = models.JSONField("state", null=True, blank=True)
    inherit = models.JSONField("agent snapshot", default=dict, blank=True)
    depth = models.PositiveIntegerField("depth", default=1)
    conversation = models.OneToOneField(
        "agenttasks.Conversation",
        on_delete=models.CASCADE,
        related_name="task",
        verbose_name="conversation",
    )
    parent_conversation = models.ForeignKey(
        "agenttasks.Conversation",
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="spawned_tasks",
        verbose_name="parent conversation",
        db_index=False,  # agenttasks_task_parent_idx leads with it
    )
    parent_run = models.ForeignKey(
        "agenttasks.Run",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="spawned_tasks",
        verbose_name="spawning run",
        db_index=False,  # agenttasks_task_parent_run_idx, for the tasks that have one
    )
    tool_call_id = models.CharField("tool call id", max_length=200, blank=True)
    delegation_key = models.CharField("delegation key", max_length=64, blank=True)
    status = models.CharField(
        "status", max_length=32, choices=TaskStatus.choices, default=TaskStatus.PENDING
    )
    stop_reason = models.CharField("stop reason", max_length=64, blank=True)
    continuations = models.PositiveIntegerField("continuations", default=0)
    summary = models.TextField("summary", blank=True)
    result = models.TextField("result", blank=True)
    error = models.TextField("error", blank=True)
    callback_url = models.CharField("callback URL", max_length=2000, blank=True)
    # Every store write increments `version`; a callback job that delivered an ending moves
    # `callback_version` up to it (its `Delivery` row is the claim: delivery/outbox.py).
    version = models.PositiveIntegerField("version", default=0)
    callback_version = models.PositiveIntegerField("callback version", default=0)
    metadata = models.JSONField("metadata", default=dict, blank=True)
    # The W3C trace context current when it was written (docs/operating.md#traces): "" while
    # tracing is off.
    traceparent = models.CharField(
        "trace context", max_length=55, blank=True, default=tracing.current_traceparent
    )
    created_at = models.DateTimeField("created", default=timezone.now)
    updated_at = models.DateTimeField("updated", default=timezone.now)
    started_at = models.DateTimeField("started", null=True, blank=True)
    finished_at = models.DateTimeField("finished", null=True, blank=True)

    objects = TaskQuerySet.as_manager()

    # Set by the store's reopen on the task it returns: the comment that re-opened it.
    new_comment: "Comment | None"
    # Set by an ending on PostgreSQL on the task it settles in a notified status, as read under
    # the task's row lock (agenttasks_end_v3); None where nothing read them: whether messages
    # wait to re-open it, and the ids of its A2A push configs.
    messages_wait_at_end: bool | None = None
    push_configs_at_end: list[int] | None = None

    class Meta:
        verbose_name = "task"
        verbose_name_plural = "tasks"
        ordering = ["-created_at", "-id"]
        permissions = [
            ("cancel_task", "Can cancel tasks"),
            ("retry_task", "Can retry tasks"),
        ]
        indexes = [
            # A user's tasks, newest first, optionally by status.
            models.Index(fields=["owner", "-created_at", "-id"], name="agenttasks_task_owner_idx"),
            models.Index(
                fields=["owner", "status", "-created_at", "-id"],
                name="agenttasks_task_owner_st_idx",
            ),
            # The tasks of a parent conversation (cap counts, listings, tree walks).
            models.Index(
                fields=["parent_conversation", "status"],
                condition=Q(parent_conversation__isnull=False),
                name="agenttasks_task_parent_idx",
            ),
            models.Index(fields=["status", "updated_at"], name="agenttasks_task_status_idx"),
            # Partial: most tasks have no parent run and no schedule, and each write of a task
            # (its status changes) adds an entry to every index whose condition it meets.
            models.Index(
                fields=["parent_run"],
                condition=Q(parent_run__isnull=False),
                name="agenttasks_task_parent_run_idx",
            ),
            models.Index(
                fields=["schedule"],
                condition=Q(schedule__isnull=False),
                name="agenttasks_task_schedule_idx",
            ),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["parent_conversation", "delegation_key"],
                condition=Q(kind=TaskKind.DELEGATE),
                name="agenttasks_task_delegation_uniq",
            ),
            models.CheckConstraint(
                condition=Q(status__in=TaskStatus.values), name="agenttasks_task_status_valid"
            ),
        ]

    def __str__(self) -> str:
        return self.id

    def attempt_no(self) -> int:
        """Return the attempt number, reading 0 or less as the first attempt."""
        return self.attempt if self.attempt > 0 else 1


class TaskResult(models.Model):
    """The result of a task: the final one, or the partial one written when it paused."""

    id = models.CharField(
        primary_key=True, max_length=ids.MAX_ID_LENGTH, default=ids.new_result_id, editable=False
    )
    task = models.OneToOneField(
        Task, on_delete=models.CASCADE, related_name="task_result", verbose_name="task"
    )
    run_id = models.CharField("run", max_length=ids.MAX_ID_LENGTH)
    content = models.TextField("content", blank=True)
    partial = models.BooleanField("partial", default=False)
    files = models.JSONField("files", default=list, blank=True)
    metadata = models.JSONField("metadata", default=dict, blank=True)
    usage = models.JSONField("usage", null=True, blank=True)
    created_at = models.DateTimeField("created", auto_now_add=True)

    class Meta:
        verbose_name = "task result"
        verbose_name_plural = "task results"

    def __str__(self) -> str:
        return self.id


class Comment(models.Model):
    """A comment on a task: a user's (re-opening it) or the agent's legacy clarification."""

    class Role(models.TextChoices):
        USER = "user", "user"
        AGENT = "agent", "agent"

    id = models.CharField(
        primary_key=True, max_length=ids.MAX_ID_LENGTH, default=ids.new_comment_id, editable=False
    )
    task = models.ForeignKey(
        Task, on_delete=models.CASCADE, related_name="comments", verbose_name="task"
    )
    role = models.CharField("role", max_length=8, choices=Role.choices)
    content = models.TextField("content")
    metadata = models.JSONField("metadata", null=True, blank=True)
    run_id = models.CharField("run", max_length=ids.MAX_ID_LENGTH)
    author = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        verbose_name="author",
    )
    created_at = models.DateTimeField("created", auto_now_add=True)

    class Meta:
        verbose_name = "comment"
        verbose_name_plural = "comments"
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return self.id
