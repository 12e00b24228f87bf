"""Request validation and response shapes of the REST API (docs/rest.md).

Request serializers check a body in the exact order of its section and raise the first refusal
(`errors.ApiError`) with the spec's message; their declared fields document the body. Response
serializers build the camelCase shapes of docs/rest.md#data-shapes, leaving out every optional field that is unset;
their declared fields are the OpenAPI component schemas (Task, Run, Event, …).
"""

import json
from typing import Any

from rest_framework import serializers

from .. import callbacks, files, lifecycle
from ..answers import AnswerError, checked, unstorable
from ..conf import app_settings
from ..models import (
    RESERVED_METADATA,
    Comment,
    Conversation,
    Event,
    File,
    PendingAction,
    Run,
    Task,
    TaskResult,
)
from ..runtime import delegation
from ..states import RUN_ACTIVE, RUN_ENDED, TERMINAL, RunTrigger, StopRequest, TaskStatus
from ..text import iso
from . import errors

MESSAGE_TYPES = {
    "message.user": "user",
    "message.assistant": "assistant",
    "task.notification": "notification",
}
TRIGGER_NAMES: dict[str, str] = {RunTrigger.INITIAL: "create"}
TASK_STATUSES = list(TaskStatus.values)


# --- checks shared by the request bodies -----------------------------------------------------


def storable(value, path: str) -> None:
    """Refuse text the database cannot store, rather than failing with a 500 later."""
    bad = unstorable(value, path)
    if bad:
        raise errors.validation(
            f"{bad} must not contain NUL characters or unpaired surrogates", bad
        )


def blank(value) -> bool:
    return value is None or (isinstance(value, str) and not value.strip())


def metadata(value, path: str = "metadata") -> dict:
    """A JSON object within MAX_METADATA_BYTES, measured as compact UTF-8 JSON."""
    if not isinstance(value, dict):
        raise errors.validation(f"{path} must be a JSON object", path)
    storable(value, path)
    limit = int(app_settings.MAX_METADATA_BYTES)
    size = len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8"))
    if size > limit:
        raise errors.validation(f"{path} must be at most {limit} bytes", path)
    return value


def reserved_free(value: dict) -> None:
    """Refuse client metadata that names the server's own keys."""
    offending = [f"metadata.{k}" for k in RESERVED_METADATA if k in value]
    if offending:
        raise errors.validation("metadata.source and metadata.taskId are reserved", *offending)


def text(value, name: str, *, required_message: str, code: str = "VALIDATION_ERROR") -> str:
    """A required non-blank string of at most MAX_INPUT_CHARS characters."""
    if not isinstance(value, str) or not value.strip():
        if code == "VALIDATION_ERROR":
            raise errors.validation(required_message, name)
        raise errors.ApiError(400, code, required_message)
    limit = int(app_settings.MAX_INPUT_CHARS)
    if len(value) > limit:
        raise errors.validation(f"{name} must be at most {limit} characters", name)
    storable(value, name)
    return value


def uploads(value) -> list[files.Upload]:
    """Check FileInput entries (the structure of docs/rest.md#files) and decode them."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise errors.validation("files must be a list", "files")
    out = []
    for i, item in enumerate(value):
        at = f"files[{i}]"
        if not isinstance(item, dict):
            raise errors.validation(f"{at} must be an object", at)
        raw_name = item.get("name")
        name = files.clean_name(raw_name) if isinstance(raw_name, str) else ""
        if not name:
            raise errors.validation(f"{at}.name is required", f"{at}.name")
        if len(name) > files.MAX_NAME:
            raise errors.validation(
                f"{at}.name must be at most {files.MAX_NAME} characters", f"{at}.name"
            )
        storable(name, f"{at}.name")
        raw_type = item.get("mimeType")
        mime_type = files.clean_mime_type(raw_type) if isinstance(raw_type, str) else None
        if mime_type is None:
            raise errors.validation(f"{at}.mimeType must look like type/subtype", f"{at}.mimeType")
        content = item.get("content")
        data = files.decode(content) if isinstance(content, str) else None
        if data is None:
            raise errors.validation(f"{at}.content is not valid base64", f"{at}.content")
        out.append(files.Upload(index=i, name=name, mime_type=mime_type, content=data))
    return out


class Body(serializers.Serializer):
    """A request body: the fields document it; `check` validates it in the spec's order."""

    def to_internal_value(self, data):
        return self.check(data if isinstance(data, dict) else {})

    def check(self, data: dict) -> dict:  # pragma: no cover - every body defines it
        raise NotImplementedError

    @classmethod
    def validated(cls, data, **context) -> dict:
        """Check a body (its declared fields only document it: DRF's field machinery is skipped)."""
        return cls(context=context).check(data if isinstance(data, dict) else {})


# --- request bodies --------------------------------------------------------------------------


class FileInputSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=255)
    content = serializers.CharField(help_text="The bytes, standard base64.")
    mimeType = serializers.CharField(help_text="type/subtype")


class TaskCreateSerializer(Body):
    agentId = serializers.CharField(help_text="An agent exposed over REST.")
    input = serializers.CharField()
    label = serializers.CharField(required=False, min_length=1, max_length=200)  # type: ignore[assignment]  # the field is named by the contract
    files = FileInputSerializer(many=True, required=False)
    callbackUrl = serializers.CharField(required=False, max_length=2000)
    metadata = serializers.DictField(required=False)

    def check(self, data):
        missing = [f for f in ("agentId", "input") if blank(data.get(f))]
        if missing:
            raise errors.validation("agentId and input are required", *missing)
        for name in ("agentId", "input"):
            if not isinstance(data[name], str):
                raise errors.validation(f"{name} must be a string", name)
        value = text(data["input"], "input", required_message="agentId and input are required")
        storable(data["agentId"], "agentId")
        out = {"agent_id": data["agentId"], "input": value, "label": ""}
        label = data.get("label")
        if label is not None:
            if not isinstance(label, str) or not 1 <= len(label) <= 200:
                raise errors.validation("label must be a string of 1 to 200 characters", "label")
            storable(label, "label")
            out["label"] = label
        out["metadata"] = metadata(data["metadata"]) if data.get("metadata") is not None else {}
        out["uploads"] = uploads(data.get("files"))
        url = data.get("callbackUrl")
        if url is not None:
            try:
                callbacks.check_syntax(url)
            except callbacks.CallbackURLError as exc:
                raise errors.validation(str(exc), "callbackUrl") from None
            storable(url, "callbackUrl")
        out["callback_url"] = url or ""
        return out


class CommentCreateSerializer(Body):
    content = serializers.CharField()
    metadata = serializers.DictField(required=False)

    def check(self, data):
        content = text(
            data.get("content"),
            "content",
            required_message="content is required",
            code="INVALID_REQUEST",
        )
        meta = metadata(data["metadata"]) if data.get("metadata") is not None else None
        return {"content": content, "metadata": meta}


class CancelSerializer(Body):
    graceful = serializers.BooleanField(required=False, default=False)

    def check(self, data):
        graceful = data.get("graceful")
        if graceful is not None and not isinstance(graceful, bool):
            raise errors.validation("graceful must be a boolean", "graceful")
        return {"graceful": bool(graceful)}


class EmptySerializer(Body):
    """No fields: keys a client sends are ignored."""

    def check(self, data):
        return {}


def _title(value) -> str:
    if not isinstance(value, str) or not 1 <= len(value) <= 200:
        raise errors.validation("title must be a string of 1 to 200 characters", "title")
    storable(value, "title")
    return value


class ConversationCreateSerializer(Body):
    agentId = serializers.CharField()
    title = serializers.CharField(required=False, min_length=1, max_length=200)
    metadata = serializers.DictField(required=False)

    def check(self, data):
        agent_id = data.get("agentId")
        if blank(agent_id):
            raise errors.validation("agentId is required", "agentId")
        if not isinstance(agent_id, str):
            raise errors.validation("agentId must be a string", "agentId")
        storable(agent_id, "agentId")
        out = {"agent_id": agent_id, "title": "", "metadata": {}}
        if data.get("title") is not None:
            out["title"] = _title(data["title"])
        if data.get("metadata") is not None:
            out["metadata"] = metadata(data["metadata"])
            reserved_free(out["metadata"])
        return out


class ConversationUpdateSerializer(Body):
    title = serializers.CharField(
        required=False, allow_null=True, min_length=1, max_length=200, help_text="null removes it"
    )
    metadata = serializers.DictField(required=False)

    def check(self, data):
        out = {}
        if "title" in data:
            out["title"] = "" if data["title"] is None else _title(data["title"])
        if "metadata" in data:
            out["metadata"] = metadata(data["metadata"])
            reserved_free(out["metadata"])
        return out


class MessageCreateSerializer(Body):
    message = serializers.CharField()
    files = FileInputSerializer(many=True, required=False)
    metadata = serializers.DictField(required=False)

    def check(self, data):
        message = text(data.get("message"), "message", required_message="message is required")
        stream = data.get("stream")
        if stream is not None and stream is not False:
            raise errors.validation(
                "stream is not supported; follow GET /conversations/{id}/events/stream", "stream"
            )
        meta = metadata(data["metadata"]) if data.get("metadata") is not None else None
        return {"message": message, "metadata": meta, "uploads": uploads(data.get("files"))}


class ActionAnswerSerializer(Body):
    """An approval (`approved`, `comment`) or the answers to a question (`answers`)."""

    approved = serializers.BooleanField(required=False, help_text="Approvals: required.")
    comment = serializers.CharField(required=False, max_length=2000)
    answers = serializers.DictField(
        required=False, help_text="Questions: by question id, a value, values or an object."
    )

    def check(self, data):
        try:
            return checked(self.context["action"], data)
        except AnswerError as exc:
            raise errors.validation(exc.message, *([exc.field] if exc.field else [])) from None


# --- response shapes -------------------------------------------------------------------------


def _put(out: dict, key: str, value) -> None:
    """Set an optional field only when it has a value."""
    if value not in (None, "", [], ()):
        out[key] = value


class Shape(serializers.Serializer):
    """A response shape: the fields are its schema; `present` builds it from a row."""

    def to_representation(self, instance):
        return self.present(instance)

    @staticmethod
    def present(instance) -> dict:  # pragma: no cover - every shape defines it
        raise NotImplementedError


class UsageSerializer(serializers.Serializer):
    inputTokens = serializers.IntegerField()
    outputTokens = serializers.IntegerField()
    totalTokens = serializers.IntegerField()


def usage(value) -> dict | None:
    if not isinstance(value, dict):
        return None
    return {
        "inputTokens": int(value.get("inputTokens") or 0),
        "outputTokens": int(value.get("outputTokens") or 0),
        "totalTokens": int(value.get("totalTokens") or 0),
    }


class FileRefSerializer(serializers.Serializer):
    id = serializers.CharField()
    name = serializers.CharField()
    mimeType = serializers.CharField()
    size = serializers.IntegerField()


class TaskSerializer(Shape):
    id = serializers.CharField()
    agentId = serializers.CharField()
    userId = serializers.CharField(required=False)
    status = serializers.ChoiceField(choices=TASK_STATUSES)
    input = serializers.CharField()
    label = serializers.CharField()  # type: ignore[assignment]  # the field is named by the contract
    kind = serializers.CharField(required=False)
    conversationId = serializers.CharField()
    parentConversationId = serializers.CharField(required=False)
    runId = serializers.CharField()
    attempt = serializers.IntegerField(min_value=1)
    progress = serializers.CharField(required=False)
    summary = serializers.CharField(required=False)
    error = serializers.CharField(required=False)
    stopRequested = serializers.ChoiceField(choices=["after_turn"], required=False)
    callbackUrl = serializers.CharField(required=False)
    files = FileRefSerializer(many=True, required=False)
    metadata = serializers.DictField()
    createdAt = serializers.DateTimeField()
    updatedAt = serializers.DateTimeField()
    startedAt = serializers.DateTimeField(required=False)
    completedAt = serializers.DateTimeField(required=False)

    @staticmethod
    def present(task: Task, files=None) -> dict:
        """The task's REST shape; `files` are its File rows when the caller already has them."""
        out: dict[str, Any] = {"id": task.id, "agentId": task.agent}
        if task.owner_id is not None:
            out["userId"] = str(task.owner_id)
        out.update({"status": task.status, "input": task.input, "label": task.label})
        _put(out, "kind", task.kind)
        out["conversationId"] = task.conversation_id
        _put(out, "parentConversationId", task.parent_conversation_id)
        out.update({"runId": task.run_id, "attempt": task.attempt_no()})
        _put(out, "progress", lifecycle.progress_line(task))
        _put(out, "summary", task.summary)
        if task.status == TaskStatus.FAILED:
            _put(out, "error", task.error)
        if (
            task.status in (TaskStatus.PENDING, TaskStatus.RUNNING)
            and task.run.stop_request == StopRequest.AFTER_TURN
        ):
            out["stopRequested"] = StopRequest.AFTER_TURN.value
        _put(out, "callbackUrl", task.callback_url)
        _put(out, "files", [f.ref() for f in (task.files.all() if files is None else files)])
        out["metadata"] = task.metadata or {}
        out["createdAt"] = iso(task.created_at)
        out["updatedAt"] = iso(task.updated_at)
        _put(out, "startedAt", iso(task.started_at))
        if task.status in TERMINAL:
            _put(out, "completedAt", iso(task.finished_at))
        return out


class TaskStatusSerializer(Shape):
    """The status body of /status and /wait."""

    taskId = serializers.CharField()
    status = serializers.ChoiceField(choices=TASK_STATUSES)
    conversationId = serializers.CharField()
    attempt = serializers.IntegerField(min_value=1)
    progress = serializers.CharField(required=False)
    summary = serializers.CharField(required=False)
    createdAt = serializers.DateTimeField()
    updatedAt = serializers.DateTimeField()
    startedAt = serializers.DateTimeField(required=False)
    completedAt = serializers.DateTimeField(required=False)
    error = serializers.CharField(required=False)

    @staticmethod
    def present(task: Task, result: TaskResult | None = None) -> dict:
        """The status body; `result` is the task's TaskResult, when it has one."""
        out = {
            "taskId": task.id,
            "status": task.status,
            "conversationId": task.conversation_id,
            "attempt": task.attempt_no(),
        }
        _put(out, "progress", lifecycle.progress_line(task))
        # A partial result (a pause) writes no summary of its own: its start is the summary.
        fallback = result.content[: app_settings.SUMMARY_LIMIT] if result is not None else ""
        _put(out, "summary", task.summary or fallback)
        out["createdAt"] = iso(task.created_at)
        out["updatedAt"] = iso(task.updated_at)
        _put(out, "startedAt", iso(task.started_at))
        if task.status in TERMINAL:
            _put(out, "completedAt", iso(task.finished_at))
        if task.status == TaskStatus.FAILED:
            _put(out, "error", task.error)
        return out


class TaskResultSerializer(Shape):
    id = serializers.CharField()
    taskId = serializers.CharField()
    runId = serializers.CharField()
    content = serializers.CharField(allow_blank=True)
    partial = serializers.BooleanField()  # type: ignore[assignment]  # the field is named by the contract
    files = FileRefSerializer(many=True, required=False)
    metadata = serializers.DictField()
    usage = UsageSerializer(required=False)
    createdAt = serializers.DateTimeField()

    @staticmethod
    def present(result: TaskResult) -> dict:
        out = {
            "id": result.id,
            "taskId": result.task_id,
            "runId": result.run_id,
            "content": result.content,
            "partial": result.partial,
        }
        _put(out, "files", [f for f in result.files or [] if isinstance(f, dict)])
        out["metadata"] = result.metadata or {}
        _put(out, "usage", usage(result.usage))
        out["createdAt"] = iso(result.created_at)
        return out


class TaskWaitSerializer(TaskStatusSerializer):
    """The status body of /wait, with the TaskResult when `include=result` asks for it."""

    result = TaskResultSerializer(required=False)


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


ACTION_STATUSES = ["pending", "approved", "denied", "answered", "expired", "cancelled"]


class PendingActionSerializer(Shape):
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

    @staticmethod
    def present(action: PendingAction) -> dict:
        # The same payload the action.requested event carries, so clients can compare them.
        return action.as_payload()


def pending_actions(conversation_id: str, *, run_id: str | None = None) -> list[dict]:
    """A conversation's pending actions (of `run_id` when given) and those escalated to it.

    Escalated actions (asked in a delegate descendant's conversation) carry `conversationId`
    and `path` (docs/delegation.md#escalation).
    """
    out = []
    for action, path in delegation.pending_actions(conversation_id):
        if action.conversation_id != conversation_id:
            body = PendingActionSerializer.present(action)
            out.append({**body, "conversationId": action.conversation_id, "path": path})
        elif run_id is None or action.run_id == run_id:
            out.append(PendingActionSerializer.present(action))
    return out


class CommentSerializer(Shape):
    id = serializers.CharField()
    taskId = serializers.CharField()
    role = serializers.ChoiceField(choices=["user", "agent"])
    content = serializers.CharField(allow_blank=True)
    metadata = serializers.DictField(required=False)
    runId = serializers.CharField()
    createdAt = serializers.DateTimeField()

    @staticmethod
    def present(comment: Comment) -> dict:
        out: dict[str, Any] = {
            "id": comment.id,
            "taskId": comment.task_id,
            "role": comment.role,
            "content": comment.content,
        }
        if comment.metadata is not None:
            out["metadata"] = comment.metadata
        out["runId"] = comment.run_id
        out["createdAt"] = iso(comment.created_at)
        return out


class ConversationSerializer(Shape):
    id = serializers.CharField()
    agentId = serializers.CharField()
    userId = serializers.CharField(required=False)
    title = serializers.CharField(required=False)
    metadata = serializers.DictField()
    hidden = serializers.BooleanField()
    parentConversationId = serializers.CharField(required=False)
    activeRunId = serializers.CharField(required=False)
    lastSeq = serializers.IntegerField(min_value=0)
    createdAt = serializers.DateTimeField()
    updatedAt = serializers.DateTimeField()

    @staticmethod
    def present(conversation: Conversation) -> dict:
        out: dict[str, Any] = {"id": conversation.id, "agentId": conversation.agent}
        if conversation.owner_id is not None:
            out["userId"] = str(conversation.owner_id)
        _put(out, "title", conversation.title)
        out["metadata"] = conversation.metadata or {}
        out["hidden"] = conversation.hidden
        if conversation.hidden:
            _put(out, "parentConversationId", conversation.parent_id)
        _put(out, "activeRunId", active_run_id(conversation))
        out["lastSeq"] = conversation.last_seq
        out["createdAt"] = iso(conversation.created_at)
        out["updatedAt"] = iso(conversation.updated_at)
        return out


def active_run_id(conversation: Conversation) -> str | None:
    """The conversation's queued, running or paused run (prefetched as `active_runs` in lists)."""
    runs = getattr(conversation, "active_runs", None)
    if runs is None:
        runs = list(
            Run.objects.filter(conversation_id=conversation.id, status__in=RUN_ACTIVE).order_by(
                "-created_at", "-id"
            )[:1]
        )
    return runs[0].id if runs else None


class MessageSerializer(Shape):
    id = serializers.CharField()
    conversationId = serializers.CharField()
    seq = serializers.IntegerField(min_value=1)
    role = serializers.ChoiceField(choices=["user", "assistant", "notification"])
    content = serializers.CharField(allow_blank=True)
    origin = serializers.ChoiceField(
        choices=["input", "comment", "message", "retry", "continuation"], required=False
    )
    files = FileRefSerializer(many=True, required=False)
    runId = serializers.CharField(required=False)
    commentId = serializers.CharField(required=False)
    usage = UsageSerializer(required=False)
    metadata = serializers.DictField(required=False)
    createdAt = serializers.DateTimeField()

    @staticmethod
    def present(event: Event) -> dict:
        data = event.data or {}
        out = {
            "id": event.id,
            "conversationId": event.conversation_id,
            "seq": event.seq,
            "role": MESSAGE_TYPES.get(event.type, "user"),
            "content": data.get("content") or "",
        }
        if event.type == "message.user":
            _put(out, "origin", data.get("origin"))
        _put(out, "files", data.get("files"))
        _put(out, "runId", event.run_id)
        _put(out, "commentId", data.get("commentId"))
        _put(out, "usage", usage(data.get("usage")))
        if isinstance(data.get("metadata"), dict):
            out["metadata"] = data["metadata"]
        out["createdAt"] = iso(event.created_at)
        return out


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


class EventSerializer(Shape):
    id = serializers.CharField()
    conversationId = serializers.CharField()
    seq = serializers.IntegerField(min_value=1)
    type = serializers.CharField(help_text="One of: " + ", ".join(EVENT_TYPES))
    runId = serializers.CharField(required=False)
    taskId = serializers.CharField(required=False)
    data = serializers.DictField()  # type: ignore[assignment]  # the field is named by the contract
    createdAt = serializers.DateTimeField()

    @staticmethod
    def present(event: Event) -> dict:
        out = {
            "id": event.id,
            "conversationId": event.conversation_id,
            "seq": event.seq,
            "type": event.type,
        }
        _put(out, "runId", event.run_id)
        _put(out, "taskId", event.task_id)
        out["data"] = event.data or {}
        out["createdAt"] = iso(event.created_at)
        return out


RUN_TRIGGERS = ["create", "retry", "comment", "message", "continuation", "wakeup"]
RUN_STATUSES = ["queued", "running", "paused", "completed", "failed", "cancelled"]


class RunSerializer(Shape):
    id = serializers.CharField()
    conversationId = serializers.CharField()
    taskId = serializers.CharField(required=False)
    agentId = serializers.CharField()
    trigger = serializers.ChoiceField(choices=RUN_TRIGGERS)
    status = serializers.ChoiceField(choices=RUN_STATUSES)
    attempt = serializers.IntegerField(required=False, min_value=1)
    stopRequested = serializers.ChoiceField(choices=["now", "after_turn"], required=False)
    error = serializers.CharField(required=False)
    usage = UsageSerializer(required=False)
    createdAt = serializers.DateTimeField()
    startedAt = serializers.DateTimeField(required=False)
    finishedAt = serializers.DateTimeField(required=False)

    @staticmethod
    def present(run: Run) -> dict:
        out: dict[str, Any] = {"id": run.id, "conversationId": run.conversation_id}
        _put(out, "taskId", run.task_id)
        out.update(
            {
                "agentId": run.agent,
                "trigger": TRIGGER_NAMES.get(run.trigger, run.trigger),
                "status": run.status,
            }
        )
        if run.task_id:
            out["attempt"] = max(run.attempt, 1)
        _put(out, "stopRequested", run.stop_request)
        if run.status == "failed":
            _put(out, "error", run.error)
        _put(out, "usage", run.usage)
        out["createdAt"] = iso(run.created_at)
        _put(out, "startedAt", iso(run.started_at))
        if run.status in RUN_ENDED:
            _put(out, "finishedAt", iso(run.ended_at))
        return out


class FileSerializer(Shape):
    id = serializers.CharField()
    name = serializers.CharField()
    mimeType = serializers.CharField()
    size = serializers.IntegerField(min_value=0)
    sha256 = serializers.CharField()
    conversationId = serializers.CharField()
    taskId = serializers.CharField(required=False)
    createdAt = serializers.DateTimeField()
    expiresAt = serializers.DateTimeField(required=False)

    @staticmethod
    def present(file: File) -> dict:
        out = {
            "id": file.id,
            "name": file.name,
            "mimeType": file.mime_type,
            "size": file.size,
            "sha256": file.sha256,
            "conversationId": file.conversation_id,
        }
        _put(out, "taskId", file.task_id)
        out["createdAt"] = iso(file.created_at)
        _put(out, "expiresAt", iso(file.expires_at))
        return out


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


BUDGET_NAMES = {
    "max_turns": "maxTurns",
    "max_tokens": "maxTokens",
    "max_tool_calls": "maxToolCalls",
    "max_wall_seconds": "maxWallSeconds",
}


class AgentSerializer(Shape):
    id = serializers.CharField()
    name = serializers.CharField()
    description = serializers.CharField(required=False)
    runtime = serializers.ChoiceField(choices=["callable", "chat"])
    team = serializers.ListField(child=serializers.CharField(), required=False)
    tools = serializers.ListField(child=serializers.CharField(), required=False)
    files = FilePolicySerializer()
    hitl = HitlSerializer()
    budget = BudgetSerializer(required=False)
    metadata = serializers.DictField()

    @staticmethod
    def present(agent) -> dict:
        out = {"id": agent.id, "name": agent.name}
        _put(out, "description", agent.does)
        out["runtime"] = agent.runtime
        _put(out, "team", list(agent.team))
        _put(out, "tools", [t.name for t in agent.tools])
        out["files"] = files_policy(agent)
        hitl = {**app_settings.DEFAULT_HITL, **(agent.hitl or {})}
        out["hitl"] = {
            "timeoutMinutes": hitl["timeout_minutes"],
            "onTimeout": hitl.get("on_timeout") or "deny",
        }
        budget = {**app_settings.DEFAULT_BUDGET, **(agent.budget or {})}
        if agent.runtime == "callable":
            # A callable run is bound only by its wall time (docs/delegation.md#the-callable-runtime).
            budget = {"max_wall_seconds": budget.get("max_wall_seconds")}
        shown = {BUDGET_NAMES[k]: v for k, v in budget.items() if k in BUDGET_NAMES and v}
        _put(out, "budget", shown or None)
        out["metadata"] = dict(agent.metadata or {})
        return out


def files_policy(agent) -> dict:
    rules = files.policy(agent)
    return {
        "enabled": bool(rules.get("enabled", True)),
        "allowedTypes": [str(t) for t in rules.get("allowedTypes") or []],
        "maxSize": int(rules.get("maxSize") or 0),
        "maxCount": int(rules.get("maxCount") or 0),
        "retentionDays": int(rules.get("retentionDays") or 0),
    }


# --- envelopes -------------------------------------------------------------------------------


class ErrorBodySerializer(serializers.Serializer):
    code = serializers.CharField()
    message = serializers.CharField()
    details = serializers.DictField(required=False)


class ErrorSerializer(serializers.Serializer):
    """The uniform error envelope."""

    error = ErrorBodySerializer()


class PageFields(serializers.Serializer):
    total = serializers.IntegerField(min_value=0)
    limit = serializers.IntegerField(min_value=1)
    offset = serializers.IntegerField(min_value=0)
    hasMore = serializers.BooleanField()
    nextCursor = serializers.CharField(
        allow_null=True, help_text="The cursor of the next page; null on the last page."
    )


class TaskEnvelopeSerializer(serializers.Serializer):
    task = TaskSerializer()


class TaskDetailSerializer(serializers.Serializer):
    task = TaskSerializer()
    result = TaskResultSerializer(required=False)
    pendingActions = PendingActionSerializer(many=True, required=False)


class TaskPageSerializer(PageFields):
    tasks = TaskSerializer(many=True)


class ResultEnvelopeSerializer(serializers.Serializer):
    result = TaskResultSerializer()


class RunListSerializer(serializers.Serializer):
    runs = RunSerializer(many=True)
    total = serializers.IntegerField(min_value=0)


class CommentCreatedSerializer(serializers.Serializer):
    comment = CommentSerializer()
    task = TaskSerializer()


class CommentListSerializer(serializers.Serializer):
    comments = CommentSerializer(many=True)
    total = serializers.IntegerField(min_value=0)


class ConversationEnvelopeSerializer(serializers.Serializer):
    conversation = ConversationSerializer()


class ConversationPageSerializer(PageFields):
    conversations = ConversationSerializer(many=True)


class MessagePageSerializer(PageFields):
    messages = MessageSerializer(many=True)


class MessageAcceptedSerializer(serializers.Serializer):
    message = MessageSerializer()
    run = RunSerializer()


class EventPageSerializer(serializers.Serializer):
    events = EventSerializer(many=True)
    after = serializers.IntegerField(min_value=0)
    limit = serializers.IntegerField(min_value=1)
    lastSeq = serializers.IntegerField(min_value=0)
    hasMore = serializers.BooleanField()


class ActionListSerializer(serializers.Serializer):
    actions = PendingActionSerializer(many=True)
    total = serializers.IntegerField(min_value=0)


class ActionResolvedSerializer(serializers.Serializer):
    action = PendingActionSerializer()
    task = TaskSerializer(required=False)


class FileEnvelopeSerializer(serializers.Serializer):
    file = FileSerializer()


class AgentListSerializer(serializers.Serializer):
    agents = AgentSerializer(many=True)


class AgentEnvelopeSerializer(serializers.Serializer):
    agent = AgentSerializer()
