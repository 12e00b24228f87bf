"""Response shapes of the REST API (docs/rest.md#data-shapes): each declared field is both a key of
the shape and of its OpenAPI component schema (Task, Run, Event, …).

A key's value is what the shape's `get_<key in snake_case>` method returns for the instance, else
the instance's attribute named by the field's `source` (or by the key itself); timestamps are
written as ISO-8601. An optional key (`required=False`) is left out when its value is unset.
"""

import re
from collections.abc import Callable
from operator import attrgetter
from typing import Any

from django.utils import timezone
from rest_framework import serializers

from ... import lifecycle
from ...conf import app_settings
from ...lifecycle import escalation
from ...models import Comment, Conversation, Event, PendingAction, Run, Task, TaskResult
from ...states import (
    RUN_ENDED,
    STOPPED_AS,
    TERMINAL,
    ActionStatus,
    RunStatus,
    StopRequest,
    TaskStatus,
    trigger_name,
)
from ...store import files
from ...text import iso

MESSAGE_TYPES = {
    "message.user": "user",
    "message.assistant": "assistant",
    "task.notification": "notification",
}
TASK_STATUSES = list(TaskStatus.values)
ACTION_STATUSES = list(ActionStatus.values)
RUN_TRIGGERS = ["create", "retry", "comment", "message", "continuation", "wakeup"]
RUN_STATUSES = list(RunStatus.values)
EVENT_TYPES = [
    "message.user",
    "message.assistant",
    "tool.call",
    "tool.result",
    "action.requested",
    "action.resolved",
    "task.status",
    "task.progress",
    "task.notification",
    "callback.delivered",
    "callback.failed",
    "run.started",
    "run.finished",
]
BUDGET_NAMES = {
    "max_turns": "maxTurns",
    "max_tokens": "maxTokens",
    "max_tool_calls": "maxToolCalls",
    "max_wall_seconds": "maxWallSeconds",
}
UNSET: tuple[Any, ...] = (None, "", [], ())
Reader = Callable[[Any, Any], Any]


def _snake(key: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", key).lower()


class Shape(serializers.Serializer):
    """A response shape (see the module's docstring)."""

    @classmethod
    def present(cls, instance, **context) -> dict:
        """Build the shape of `instance`; `context` reaches the get_ methods as `self.context`."""
        shape = cls(context=context)
        out = {}
        for key, read, optional in cls._readers():
            value = read(shape, instance)
            if not optional or value not in UNSET:
                out[key] = value
        return out

    def to_representation(self, instance):
        return self.present(instance, **self.context)

    @classmethod
    def _readers(cls) -> list[tuple[str, Reader, bool]]:
        """The shape's keys, how each is read and whether it is optional (worked out once)."""
        readers = cls.__dict__.get("_key_readers")
        if readers is None:
            fields: dict[str, Any] = cls._declared_fields
            readers = [(k, cls._reader(k, f), not f.required) for k, f in fields.items()]
            cls._key_readers = readers  # type: ignore[attr-defined]
        return readers

    @classmethod
    def _reader(cls, key: str, field: Any) -> Reader:
        name = "get_" + _snake(key)
        for klass in cls.__mro__:
            if klass is Shape:
                break
            if name in klass.__dict__:
                method = klass.__dict__[name]
                return lambda shape, instance: method(shape, instance)
        get = attrgetter(field.source or key)
        if isinstance(field, serializers.DateTimeField):
            return lambda shape, instance: iso(get(instance))
        return lambda shape, instance: get(instance)


def usage(value) -> dict | None:
    """Token counts as the Usage shape, or None when there are none."""
    if not isinstance(value, dict):
        return None
    return {
        "inputTokens": int(value.get("inputTokens") or 0),
        "outputTokens": int(value.get("outputTokens") or 0),
        "totalTokens": int(value.get("totalTokens") or 0),
    }


class UsageSerializer(serializers.Serializer):
    inputTokens = serializers.IntegerField()
    outputTokens = serializers.IntegerField()
    totalTokens = serializers.IntegerField()


class FileRefSerializer(serializers.Serializer):
    """The reference to a file embedded in tasks, results and messages."""

    id = serializers.CharField()
    name = serializers.CharField()
    mimeType = serializers.CharField()
    size = serializers.IntegerField()


# --- tasks -----------------------------------------------------------------------------------


class TaskValues(Shape):
    """Values the task shape and the status body share."""

    def get_attempt(self, task: Task) -> int:
        return task.attempt_no()

    def get_progress(self, task: Task) -> str:
        return lifecycle.progress_line(task)

    def get_error(self, task: Task) -> str | None:
        return task.error if task.status == TaskStatus.FAILED else None

    def get_completed_at(self, task: Task) -> str | None:
        return iso(task.finished_at) if task.status in TERMINAL else None


class TaskSerializer(TaskValues):
    """A task."""

    # present(task, files=[...]) takes the task's files when the caller has them (File rows, or
    # the uploads just stored: anything with ref()), saving a query.

    id = serializers.CharField()
    agentId = serializers.CharField(source="agent")
    userId = serializers.CharField(required=False)
    status = serializers.ChoiceField(choices=TASK_STATUSES)
    input = serializers.CharField()
    label = serializers.CharField()  # type: ignore[assignment]  # the field is named by the contract
    kind = serializers.CharField(required=False)
    conversationId = serializers.CharField(source="conversation_id")
    parentConversationId = serializers.CharField(source="parent_conversation_id", required=False)
    runId = serializers.CharField(source="run_id")
    attempt = serializers.IntegerField(min_value=1)
    progress = serializers.CharField(required=False)
    summary = serializers.CharField(required=False)
    error = serializers.CharField(required=False)
    stopRequested = serializers.ChoiceField(choices=["after_turn"], required=False)
    callbackUrl = serializers.CharField(source="callback_url", required=False)
    files = FileRefSerializer(many=True, required=False)
    metadata = serializers.DictField()
    priority = serializers.IntegerField()
    notBefore = serializers.DateTimeField(
        required=False, help_text="While its run waits for a delayed start: when it starts."
    )
    scheduleId = serializers.CharField(
        source="schedule_id", required=False, help_text="The schedule whose tick created it."
    )
    createdAt = serializers.DateTimeField(source="created_at")
    updatedAt = serializers.DateTimeField(source="updated_at")
    startedAt = serializers.DateTimeField(source="started_at", required=False)
    completedAt = serializers.DateTimeField(required=False)

    def get_user_id(self, task: Task) -> str | None:
        return None if task.owner_id is None else str(task.owner_id)

    def get_stop_requested(self, task: Task) -> str | None:
        live = task.status in (TaskStatus.PENDING, TaskStatus.RUNNING)
        if live and task.run.stop_request == StopRequest.AFTER_TURN:
            return StopRequest.AFTER_TURN.value
        return None

    def get_not_before(self, task: Task) -> str | None:
        run = task.run
        if run.status == RunStatus.QUEUED and run.not_before and run.not_before > timezone.now():
            return iso(run.not_before)
        return None

    def get_files(self, task: Task) -> list[dict]:
        rows = self.context.get("files")
        return [f.ref() for f in (task.files.all() if rows is None else rows)]

    def get_metadata(self, task: Task) -> dict:
        return task.metadata or {}


class TaskStatusSerializer(TaskValues):
    """The status body of /status and /wait."""

    # present(task, result=r) takes the task's TaskResult, when it has one.

    taskId = serializers.CharField(source="id")
    status = serializers.ChoiceField(choices=TASK_STATUSES)
    conversationId = serializers.CharField(source="conversation_id")
    attempt = serializers.IntegerField(min_value=1)
    progress = serializers.CharField(required=False)
    summary = serializers.CharField(required=False)
    createdAt = serializers.DateTimeField(source="created_at")
    updatedAt = serializers.DateTimeField(source="updated_at")
    startedAt = serializers.DateTimeField(source="started_at", required=False)
    completedAt = serializers.DateTimeField(required=False)
    error = serializers.CharField(required=False)

    def get_summary(self, task: Task) -> str:
        # A partial result (a pause) writes no summary of its own: its start is the summary.
        result = self.context.get("result")
        fallback = result.content[: app_settings.SUMMARY_LIMIT] if result is not None else ""
        return task.summary or fallback


class TaskResultSerializer(Shape):
    id = serializers.CharField()
    taskId = serializers.CharField(source="task_id")
    runId = serializers.CharField(source="run_id")
    content = serializers.CharField(allow_blank=True)
    partial = serializers.BooleanField()  # type: ignore[assignment]  # the field is named by the contract
    files = FileRefSerializer(many=True, required=False)
    metadata = serializers.DictField()
    usage = UsageSerializer(required=False)
    createdAt = serializers.DateTimeField(source="created_at")

    def get_files(self, result: TaskResult) -> list[dict]:
        return [f for f in result.files or [] if isinstance(f, dict)]

    def get_metadata(self, result: TaskResult) -> dict:
        return result.metadata or {}

    def get_usage(self, result: TaskResult) -> dict | None:
        return usage(result.usage)


class TaskWaitSerializer(TaskStatusSerializer):
    """The status body of /wait, with the TaskResult when `include=result` asks for it."""

    # present(task, result=r, include=True) carries the result.

    result = TaskResultSerializer(required=False)

    def get_result(self, task: Task) -> dict | None:
        result = self.context.get("result")
        if result is None or not self.context.get("include"):
            return None
        return TaskResultSerializer.present(result)


# --- actions ---------------------------------------------------------------------------------


class QuestionOptionSerializer(serializers.Serializer):
    label = serializers.CharField()  # type: ignore[assignment]  # the field is named by the contract
    value = serializers.CharField()
    description = serializers.CharField(required=False)


class QuestionSerializer(serializers.Serializer):
    id = serializers.CharField()
    question = serializers.CharField()
    header = serializers.CharField(required=False)
    options = QuestionOptionSerializer(many=True, required=False)
    multiSelect = serializers.BooleanField()
    required = serializers.BooleanField()  # type: ignore[assignment]  # the field is named by the contract
    allowFreeText = serializers.BooleanField()


class PendingActionSerializer(Shape):
    """An approval or a question waiting for a person."""

    # Its value is the payload its action.requested event carries (PendingAction.as_payload), so
    # that clients can compare them; pending_actions adds the keys of escalated actions.

    id = serializers.CharField()
    kind = serializers.ChoiceField(choices=["approval", "question"])
    runId = serializers.CharField()
    toolName = serializers.CharField()
    toolCallId = serializers.CharField()
    args = serializers.DictField(required=False)
    questions = QuestionSerializer(many=True, required=False)
    prompt = serializers.CharField(required=False, help_text="What the person is asked.")
    status = serializers.ChoiceField(choices=ACTION_STATUSES)
    createdAt = serializers.DateTimeField()
    expiresAt = serializers.DateTimeField(help_text="Every action lapses (DEFAULT_HITL).")
    decidedBy = serializers.CharField(required=False)
    decidedAt = serializers.DateTimeField(required=False)
    conversationId = serializers.CharField(
        required=False, help_text="Escalated actions: the delegate conversation that asked."
    )
    path = serializers.ListField(
        child=serializers.CharField(),
        required=False,
        help_text="Escalated actions: the conversations from the top caller down to the asker; "
        "the action can be answered through any of them.",
    )

    @classmethod
    def present(cls, instance: PendingAction, **context) -> dict:
        return instance.as_payload()


def pending_actions(conversation_id: str, *, run_id: str | None = None) -> list[dict]:
    """Return a conversation's pending actions (of `run_id` when given) and those escalated to it.

    Escalated actions (asked in a delegate descendant's conversation) carry `conversationId`
    and `path` (docs/delegation.md#escalation).
    """
    out = []
    for action, path in escalation.pending_actions(conversation_id):
        if action.conversation_id != conversation_id:
            body = PendingActionSerializer.present(action)
            out.append({**body, "conversationId": action.conversation_id, "path": path})
        elif run_id is None or action.run_id == run_id:
            out.append(PendingActionSerializer.present(action))
    return out


class CommentSerializer(Shape):
    id = serializers.CharField()
    taskId = serializers.CharField(source="task_id")
    role = serializers.ChoiceField(choices=["user", "agent"])
    content = serializers.CharField(allow_blank=True)
    metadata = serializers.DictField(required=False)
    runId = serializers.CharField(source="run_id")
    createdAt = serializers.DateTimeField(source="created_at")

    def get_metadata(self, comment: Comment) -> dict | None:
        # An empty object a client sent is shown; no metadata at all is left out.
        return comment.metadata


# --- conversations ---------------------------------------------------------------------------


class ConversationSerializer(Shape):
    id = serializers.CharField()
    agentId = serializers.CharField(source="agent")
    userId = serializers.CharField(required=False)
    title = serializers.CharField(required=False)
    metadata = serializers.DictField()
    hidden = serializers.BooleanField()
    parentConversationId = serializers.CharField(required=False)
    activeRunId = serializers.CharField(required=False)
    lastSeq = serializers.IntegerField(source="last_seq", min_value=0)
    createdAt = serializers.DateTimeField(source="created_at")
    updatedAt = serializers.DateTimeField(source="updated_at")

    def get_user_id(self, conversation: Conversation) -> str | None:
        return None if conversation.owner_id is None else str(conversation.owner_id)

    def get_metadata(self, conversation: Conversation) -> dict:
        return conversation.metadata or {}

    def get_parent_conversation_id(self, conversation: Conversation) -> str | None:
        return conversation.parent_id if conversation.hidden else None

    def get_active_run_id(self, conversation: Conversation) -> str | None:
        return active_run_id(conversation)


def active_run_id(conversation: Conversation) -> str | None:
    """Return the conversation's queued, running or paused run (prefetched as `active_runs` in
    lists)."""
    runs = getattr(conversation, "active_runs", None)
    if runs is None:
        runs = list(
            Run.objects.active()
            .filter(conversation_id=conversation.id)
            .order_by("-created_at", "-id")[:1]
        )
    return runs[0].id if runs else None


class MessageSerializer(Shape):
    """A message of a conversation: one of its message events, as a chat client shows it."""

    id = serializers.CharField()
    conversationId = serializers.CharField(source="conversation_id")
    seq = serializers.IntegerField(min_value=1)
    role = serializers.ChoiceField(choices=["user", "assistant", "notification"])
    content = serializers.CharField(allow_blank=True)
    origin = serializers.ChoiceField(
        choices=["input", "comment", "message", "retry", "continuation", "steer"], required=False
    )
    files = FileRefSerializer(many=True, required=False)
    runId = serializers.CharField(source="run_id", required=False)
    commentId = serializers.CharField(required=False)
    usage = UsageSerializer(required=False)
    metadata = serializers.DictField(required=False)
    interrupted = serializers.BooleanField(
        required=False, help_text="A reply a newer message interrupted: what it had written."
    )
    createdAt = serializers.DateTimeField(source="created_at")

    def get_role(self, event: Event) -> str:
        return MESSAGE_TYPES.get(event.type, "user")

    def get_content(self, event: Event) -> str:
        return (event.data or {}).get("content") or ""

    def get_origin(self, event: Event) -> str | None:
        user = event.type in ("message.user", "message.steer")
        return (event.data or {}).get("origin") if user else None

    def get_files(self, event: Event) -> list | None:
        return (event.data or {}).get("files")

    def get_comment_id(self, event: Event) -> str | None:
        return (event.data or {}).get("commentId")

    def get_usage(self, event: Event) -> dict | None:
        return usage((event.data or {}).get("usage"))

    def get_metadata(self, event: Event) -> dict | None:
        value = (event.data or {}).get("metadata")
        return value if isinstance(value, dict) else None

    def get_interrupted(self, event: Event) -> bool | None:
        return True if (event.data or {}).get("interrupted") is True else None


class EventSerializer(Shape):
    id = serializers.CharField()
    conversationId = serializers.CharField(source="conversation_id")
    seq = serializers.IntegerField(min_value=1)
    type = serializers.CharField(help_text="One of: " + ", ".join(EVENT_TYPES))
    runId = serializers.CharField(source="run_id", required=False)
    taskId = serializers.CharField(source="task_id", required=False)
    data = serializers.DictField()  # type: ignore[assignment]  # the field is named by the contract
    createdAt = serializers.DateTimeField(source="created_at")

    def get_data(self, event: Event) -> dict:
        return event.data or {}


class RunSerializer(Shape):
    id = serializers.CharField()
    conversationId = serializers.CharField(source="conversation_id")
    taskId = serializers.CharField(source="task_id", required=False)
    agentId = serializers.CharField(source="agent")
    trigger = serializers.ChoiceField(choices=RUN_TRIGGERS)
    status = serializers.ChoiceField(choices=RUN_STATUSES)
    attempt = serializers.IntegerField(required=False, min_value=1)
    stopRequested = serializers.ChoiceField(
        source="stop_request", choices=["now", "after_turn"], required=False
    )
    error = serializers.CharField(required=False)
    usage = UsageSerializer(required=False)
    createdAt = serializers.DateTimeField(source="created_at")
    startedAt = serializers.DateTimeField(source="started_at", required=False)
    finishedAt = serializers.DateTimeField(required=False)

    def get_trigger(self, run: Run) -> str:
        return trigger_name(run.trigger)

    def get_attempt(self, run: Run) -> int | None:
        return max(run.attempt, 1) if run.task_id else None

    def get_stop_requested(self, run: Run) -> str | None:
        # A stop for a newer message (interrupt, rollback) is a stop now, as a client sees it.
        if run.stop_request in STOPPED_AS:
            return StopRequest.NOW.value
        return run.stop_request or None

    def get_error(self, run: Run) -> str | None:
        return run.error if run.status == RunStatus.FAILED else None

    def get_finished_at(self, run: Run) -> str | None:
        return iso(run.ended_at) if run.status in RUN_ENDED else None


# --- files and agents ------------------------------------------------------------------------


class FileSerializer(Shape):
    id = serializers.CharField()
    name = serializers.CharField()
    mimeType = serializers.CharField(source="mime_type")
    size = serializers.IntegerField(min_value=0)
    sha256 = serializers.CharField()
    conversationId = serializers.CharField(source="conversation_id")
    taskId = serializers.CharField(source="task_id", required=False)
    createdAt = serializers.DateTimeField(source="created_at")
    expiresAt = serializers.DateTimeField(source="expires_at", required=False)


class FilePolicySerializer(serializers.Serializer):
    enabled = serializers.BooleanField()
    allowedTypes = serializers.ListField(child=serializers.CharField())
    maxSize = serializers.IntegerField()
    maxCount = serializers.IntegerField()
    retentionDays = serializers.IntegerField()


class HitlSerializer(serializers.Serializer):
    timeoutMinutes = serializers.FloatField()
    onTimeout = serializers.ChoiceField(choices=["deny", "cancel"])


class BudgetSerializer(serializers.Serializer):
    maxTurns = serializers.IntegerField(required=False)
    maxTokens = serializers.IntegerField(required=False)
    maxToolCalls = serializers.IntegerField(required=False)
    maxWallSeconds = serializers.FloatField(required=False)


class AgentSerializer(Shape):
    """An agent of the registry, as its REST index shows it."""

    id = serializers.CharField()
    name = serializers.CharField()
    description = serializers.CharField(source="does", required=False)
    runtime = serializers.ChoiceField(choices=["callable", "chat"])
    team = serializers.ListField(child=serializers.CharField(), required=False)
    tools = serializers.ListField(child=serializers.CharField(), required=False)
    files = FilePolicySerializer()
    hitl = HitlSerializer()
    budget = BudgetSerializer(required=False)
    metadata = serializers.DictField()

    def get_team(self, agent) -> list[str]:
        return list(agent.team)

    def get_tools(self, agent) -> list[str]:
        return [t.name for t in agent.tools]

    def get_files(self, agent) -> dict:
        return files_policy(agent)

    def get_hitl(self, agent) -> dict:
        hitl = {**app_settings.DEFAULT_HITL, **(agent.hitl or {})}
        return {
            "timeoutMinutes": hitl["timeout_minutes"],
            "onTimeout": hitl.get("on_timeout") or "deny",
        }

    def get_budget(self, agent) -> dict | None:
        budget = {**app_settings.DEFAULT_BUDGET, **(agent.budget or {})}
        if agent.runtime == "callable":
            # A callable run is bound only by its wall time (docs/delegation.md#the-callable-runtime).
            budget = {"max_wall_seconds": budget.get("max_wall_seconds")}
        return {BUDGET_NAMES[k]: v for k, v in budget.items() if k in BUDGET_NAMES and v} or None

    def get_metadata(self, agent) -> dict:
        return dict(agent.metadata or {})


def files_policy(agent) -> dict:
    """Return an agent's file policy as the FilePolicy shape."""
    rules = files.policy(agent)
    return {
        "enabled": bool(rules.get("enabled", True)),
        "allowedTypes": [str(t) for t in rules.get("allowedTypes") or []],
        "maxSize": int(rules.get("maxSize") or 0),
        "maxCount": int(rules.get("maxCount") or 0),
        "retentionDays": int(rules.get("retentionDays") or 0),
    }
