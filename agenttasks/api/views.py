"""The REST views (docs/rest.md): thin DRF views that validate, check, and call the lifecycle.

Every view answers in the app's own terms whatever the host configured: its authentication
(AGENTTASKS["AUTHENTICATION_CLASSES"] or DRF's default), its permission rule, its throttles, its
body reading, its JSON renderer and its error envelope. Checks run in the global order of docs/rest.md#errors:
identity, throttle, body syntax, the path's resources (404, then 403, outermost first), body and
query validation, the endpoint's own checks, then state conflicts. A rejected request writes
nothing.
"""

import math
import re
from typing import Any
from urllib.parse import quote

from django.core.handlers.asgi import ASGIRequest
from django.db import transaction
from django.db.models import Prefetch
from django.http import FileResponse
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse
from drf_spectacular.utils import extend_schema as spectacular_extend_schema
from rest_framework.negotiation import BaseContentNegotiation
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response
from rest_framework.views import APIView

from .. import callbacks, files, lifecycle, registry
from ..conf import app_settings
from ..exceptions import (
    ActionNotFound,
    AlreadyFinal,
    ConversationNotFound,
    RunNotFound,
    TaskNotFound,
)
from ..models import Comment, Conversation, Event, File, PendingAction, Run, Task, TaskResult
from ..runtime import delegation
from ..states import LIVE, RUN_ACTIVE, TERMINAL, ActionStatus, TaskKind, TaskStatus
from . import body, errors, slots, streams
from . import serializers as s
from .cursors import Keyset, keyset_page
from .cursors import page_body as cursor_page_body
from .cursors import params as cursor_params
from .idempotency import HEADER as IDEMPOTENCY_HEADER
from .idempotency import REPLAYED, idempotent
from .pagination import SQL_MAX, non_negative, page_params
from .permissions import IdentityRequired, authenticators, check_owner, owner_id, user_of
from .throttling import throttles_for

DELEGATE = TaskKind.DELEGATE
NUMBER = re.compile(r"[+]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?")
STATUSES = set(TaskStatus.values)
ACTION_FILTERS = {*ActionStatus.values, "all"}
MESSAGE_TYPES = list(s.MESSAGE_TYPES)


# --- the base view ---------------------------------------------------------------------------


class FirstRenderer(BaseContentNegotiation):
    """No content negotiation: the app always answers JSON, so never a 406."""

    def select_parser(self, request, parsers):
        return parsers[0] if parsers else None

    def select_renderer(self, request, renderers, format_suffix=None):
        return renderers[0], renderers[0].media_type


def extend_schema(**kwargs):
    """drf-spectacular's extend_schema on its own AutoSchema, whatever DEFAULT_SCHEMA_CLASS is."""

    kwargs.setdefault("description", kwargs.get("summary", ""))

    def decorate(method):
        method.schema = AutoSchema  # the base class extend_schema builds the operation's on
        return spectacular_extend_schema(**kwargs)(method)

    return decorate


def _errors(*statuses: int) -> dict:
    described = {
        400: "Invalid request",
        401: "No resolved user (identity_required)",
        403: "Not the owner",
        404: "Not found",
        405: "Method not allowed",
        409: "State conflict",
        415: "Unsupported media type",
        422: "Idempotency-Key reused with another request (idempotency_key_reused)",
        429: "Throttled (rate_limited)",
        500: "Server fault (INTERNAL_ERROR)",
    }
    return {
        code: OpenApiResponse(s.ErrorSerializer, description=described[code])
        for code in (*statuses, 401, 429, 500)
    }


def _query(name: str, description: str, type=OpenApiTypes.STR) -> OpenApiParameter:
    return OpenApiParameter(name, type, OpenApiParameter.QUERY, description=description)


def _response_header(name: str, description: str, codes: list[int]) -> OpenApiParameter:
    return OpenApiParameter(
        name, OpenApiTypes.STR, OpenApiParameter.HEADER, description=description, response=codes
    )


LOCATION = _response_header("Location", "The full path of the new resource.", [201])


def keyed(*success: int) -> list[OpenApiParameter]:
    """The Idempotency-Key request header, and the replay marker on the success answers."""
    return [
        OpenApiParameter(
            IDEMPOTENCY_HEADER,
            OpenApiTypes.STR,
            OpenApiParameter.HEADER,
            description="1-255 printable ASCII characters; a repeat replays the first answer.",
        ),
        _response_header(REPLAYED, "true when this answer is a replay.", list(success)),
    ]


PAGE_PARAMETERS = [
    _query("limit", "Page size (clamped to the maximum).", OpenApiTypes.INT),
    _query("offset", "Items to skip (not with cursor).", OpenApiTypes.INT),
    _query("cursor", "The nextCursor of the previous page (not with offset)."),
]
TASK_ORDER = Keyset("tasks", ("created_at", "id"), descending=True)
CONVERSATION_ORDER = Keyset("conversations", ("updated_at", "id"), descending=True)
MESSAGE_ORDER = {
    "asc": Keyset("messages.asc", ("seq",), descending=False),
    "desc": Keyset("messages.desc", ("seq",), descending=True),
}


class ApiView(APIView):
    """The app's own policies, whatever the host's REST_FRAMEWORK defaults say."""

    anonymous_list = False
    parser_classes = [body.Unread]  # bodies are read by api.body, before any view logic
    renderer_classes = [JSONRenderer]
    content_negotiation_class = FirstRenderer
    metadata_class = None
    schema = AutoSchema()
    http_method_names = ["get", "post", "patch", "delete", "head"]

    def get_authenticators(self):
        return authenticators()

    def get_permissions(self):
        return [IdentityRequired()]

    def get_throttles(self):
        return throttles_for(self.request)

    def get_exception_handler(self):
        return errors.handle

    def initial(self, request, *args, **kwargs):
        super().initial(request, *args, **kwargs)
        self.body = None
        method = request.method.lower()
        if method in ("post", "patch", "put", "delete") and hasattr(self, method):
            self.body = body.parse(request)

    # --- lookups: 404 first, then 403 --------------------------------------------------------

    def task(self, task_id: str, *, queryset=None) -> Task:
        """The task named in the path, if it exists and the principal owns it."""
        if not _plain(task_id):
            raise errors.not_found(f"Task not found: {task_id}")
        rows = queryset if queryset is not None else task_rows()
        task = rows.filter(pk=task_id, conversation__deleting_at__isnull=True).first()
        if task is None:
            raise errors.not_found(f"Task not found: {task_id}")
        check_owner(self.request, task.owner_id, "task")
        return task

    def conversation(self, conversation_id: str, *, deleting: bool = False) -> Conversation:
        """The conversation named in the path, if the principal owns it (`deleting`: also one
        whose delete has begun)."""
        if not _plain(conversation_id):
            raise errors.not_found(f"Conversation not found: {conversation_id}")
        rows = Conversation.objects.all() if deleting else Conversation.objects.visible()
        conversation = rows.filter(pk=conversation_id).first()
        if conversation is None:
            raise errors.not_found(f"Conversation not found: {conversation_id}")
        check_owner(self.request, conversation.owner_id, "conversation")
        return conversation

    def principal(self):
        return user_of(self.request)

    def location(self, *parts: str) -> str:
        """The full path of a resource created under this request's path."""
        return "/".join([self.request.path.rstrip("/"), *parts])


def _plain(value: str) -> bool:
    """Whether an id can be looked up at all (a NUL is simply not found, never a 500)."""
    return "\x00" not in value


def task_rows():
    return Task.objects.select_related("run").prefetch_related(
        Prefetch("files", queryset=File.objects.order_by("created_at", "id"))
    )


def exposed_agent(agent_id: str):
    """The registered agent exposed over REST, or 404."""
    try:
        agent = registry.get(agent_id)
    except registry.UnknownAgent:
        agent = None
    if agent is None or not agent.expose:
        raise errors.not_found(f"Agent not found: {agent_id}")
    return agent


def check_files(agent, uploads, existing: int = 0) -> dict:
    rules = files.policy(agent)
    try:
        files.check(agent.id, rules, uploads, existing)
    except files.FileRefused as exc:
        raise errors.ApiError(exc.status, exc.code, exc.message, exc.details) from None
    return rules


def task_detail(task: Task) -> dict:
    out: dict[str, Any] = {"task": s.TaskSerializer.present(task)}
    result = getattr(task, "task_result", None)
    if result is not None:
        out["result"] = s.TaskResultSerializer.present(result)
    if task.status == TaskStatus.WAITING_FOR_INPUT:
        actions = s.pending_actions(task.conversation_id, run_id=task.run_id)
        if actions:
            out["pendingActions"] = actions
    return out


def reload_task(task_id: str) -> Task:
    return task_rows().get(pk=task_id)


def store_uploads(uploads, *, conversation_id, owner, rules, task_id=None, written=None):
    return files.save(
        uploads,
        conversation_id=conversation_id,
        owner=owner,
        rules=rules,
        task_id=task_id,
        written=written,
    )


# --- tasks -----------------------------------------------------------------------------------


class TaskListView(ApiView):
    anonymous_list = True

    def get_permissions(self):
        # Listing honours ALLOW_ANONYMOUS_LIST; creating does not.
        self.anonymous_list = self.request.method in ("GET", "HEAD")
        return super().get_permissions()

    @extend_schema(
        operation_id="listTasks",
        tags=["Tasks"],
        summary="List the principal's tasks",
        parameters=[
            _query("agentId", "Exact agent id."),
            _query("status", "One status or several, comma-separated."),
            _query("conversationId", "Tasks whose own conversation is this one."),
            _query("parentConversationId", "Tasks spawned from this conversation."),
            *PAGE_PARAMETERS,
        ],
        responses={200: s.TaskPageSerializer, **_errors(400)},
    )
    def get(self, request):
        limit, offset, position = cursor_params(request, TASK_ORDER, 20, 100)
        params = request.query_params
        statuses = None
        if params.get("status") is not None:
            statuses = [v.strip() for v in params["status"].split(",")]
            for value in statuses:
                if value not in STATUSES:
                    raise errors.validation(f"Unknown status: {value}", "status")
        rows = task_rows().filter(
            owner_id=owner_id(request), conversation__deleting_at__isnull=True
        )
        filters = {
            "agent": params.get("agentId"),
            "conversation_id": params.get("conversationId"),
            "parent_conversation_id": params.get("parentConversationId"),
        }
        empty = False
        for field, value in filters.items():
            if value is not None:
                empty = empty or not _plain(value)
                rows = rows.filter(**{field: value})
        if statuses is not None:
            rows = rows.filter(status__in=statuses)
        items, total, offset, after = (
            ([], 0, offset, None)
            if empty
            else keyset_page(rows, TASK_ORDER, limit, offset, position)
        )
        tasks = [s.TaskSerializer.present(t) for t in items]
        return Response(cursor_page_body("tasks", tasks, total, limit, offset, after))

    @extend_schema(
        operation_id="createTask",
        tags=["Tasks"],
        summary="Create a task",
        request=s.TaskCreateSerializer,
        parameters=[LOCATION, *keyed(201)],
        responses={201: s.TaskEnvelopeSerializer, **_errors(400, 403, 404, 409, 415, 422)},
    )
    @idempotent
    def post(self, request):
        data = s.TaskCreateSerializer.validated(self.body)
        agent = exposed_agent(data["agent_id"])
        uploads = data["uploads"]
        rules = check_files(agent, uploads)
        if data["callback_url"]:
            _check_callback_address(data["callback_url"])
        owner = self.principal()

        stored = []

        def keep_files(task):
            stored.extend(
                store_uploads(
                    uploads,
                    conversation_id=task.conversation_id,
                    owner=owner,
                    rules=rules,
                    task_id=task.id,
                    written=written,
                )
            )

        with files.kept_only_on_success() as written:
            try:
                task = lifecycle.create(
                    owner=owner,
                    agent_id=agent.id,
                    input=data["input"],
                    label=data["label"],
                    callback_url=data["callback_url"] or None,
                    metadata=data["metadata"],
                    files=[u.ref() for u in uploads],
                    before_commit=keep_files if uploads else None,
                )
            except callbacks.CallbackURLError as exc:
                raise errors.validation(str(exc), "callbackUrl") from None
        # The answer is built from what was written: no worker has moved it in our copy.
        return Response(
            {"task": s.TaskSerializer.present(task, files=stored)},
            status=201,
            headers={"Location": self.location(task.id)},
        )


def _check_callback_address(url: str) -> None:
    try:
        callbacks.check_address(url)
    except callbacks.CallbackURLError as exc:
        raise errors.validation(str(exc), "callbackUrl") from None


class TaskView(ApiView):
    @extend_schema(
        operation_id="getTask",
        tags=["Tasks"],
        summary="Read a task, its result and its pending actions",
        responses={200: s.TaskDetailSerializer, **_errors(403, 404)},
    )
    def get(self, request, taskId):
        task = self.task(taskId, queryset=task_rows().select_related("task_result"))
        return Response(task_detail(task))


class TaskStatusView(ApiView):
    @extend_schema(
        operation_id="getTaskStatus",
        tags=["Tasks"],
        summary="Read a task's status body",
        responses={200: s.TaskStatusSerializer, **_errors(403, 404)},
    )
    def get(self, request, taskId):
        task = self.task(taskId, queryset=Task.objects.select_related("run", "task_result"))
        result = getattr(task, "task_result", None)
        return Response(s.TaskStatusSerializer.present(task, result=result))


class TaskWaitView(ApiView):
    @extend_schema(
        operation_id="waitForTask",
        tags=["Tasks"],
        summary="Wait until the task settles (or the timeout passes)",
        parameters=[
            _query(
                "timeout",
                "Seconds to wait (default 30, clamped to MAX_STATUS_WAIT).",
                OpenApiTypes.NUMBER,
            ),
            _query("include", "result: also carry the task's result when it has one."),
        ],
        responses={200: s.TaskWaitSerializer, **_errors(400, 403, 404)},
    )
    def get(self, request, taskId):
        task = self.task(taskId, queryset=Task.objects.select_related("run"))
        timeout = min(seconds(request.query_params.get("timeout")), app_settings.MAX_STATUS_WAIT)
        include = request.query_params.get("include")
        if include is not None and include != "result":
            raise errors.validation("include must be result", "include")
        # The wait's place lapses on its own shortly after the wait would have returned.
        held = slots.take(
            request,
            slots.WAIT,
            app_settings.MAX_WAITS_PER_USER,
            timeout + app_settings.SLOT_LEASE_SECONDS,
        )
        client = slots.client_socket(request._request)
        try:
            task = lifecycle.wait_for(
                task.id,
                wait=timeout,
                settled=TERMINAL | {TaskStatus.WAITING_FOR_INPUT},
                stop_check=lambda: slots.gone(client),
            )
        except TaskNotFound:
            raise errors.not_found(f"Task not found: {taskId}") from None
        finally:
            held.release()
        if Conversation.objects.filter(pk=task.conversation_id, deleting_at__isnull=False).exists():
            raise errors.not_found(f"Task not found: {taskId}")
        result = None
        if include or (not task.summary and task.status == TaskStatus.WAITING_FOR_INPUT):
            result = TaskResult.objects.filter(task_id=task.id).first()
        return Response(s.TaskWaitSerializer.present(task, result=result, include=bool(include)))


def seconds(raw: str | None, default: float = 30.0) -> float:
    """A non-negative number of seconds (decimals and exponents allowed)."""
    if raw is None:
        return default
    try:
        value = float(raw) if NUMBER.fullmatch(raw.strip()) else math.nan
    except ValueError:
        value = math.nan
    if math.isnan(value) or value < 0:  # a huge literal reads as inf: clamped by the caller
        raise errors.validation("timeout must be a non-negative number of seconds", "timeout")
    return value


class TaskResultView(ApiView):
    @extend_schema(
        operation_id="getTaskResult",
        tags=["Tasks"],
        summary="Read a task's result",
        responses={200: s.ResultEnvelopeSerializer, **_errors(403, 404)},
    )
    def get(self, request, taskId):
        task = self.task(taskId, queryset=Task.objects.select_related("task_result"))
        result = getattr(task, "task_result", None)
        if result is None:
            raise errors.not_found(f"Task result not found: {taskId}")
        return Response({"result": s.TaskResultSerializer.present(result)})


class TaskRunsView(ApiView):
    @extend_schema(
        operation_id="listTaskRuns",
        tags=["Tasks"],
        summary="List every run of a task, oldest first",
        responses={200: s.RunListSerializer, **_errors(403, 404)},
    )
    def get(self, request, taskId):
        task = self.task(taskId, queryset=Task.objects.all())
        runs = Run.objects.filter(task_id=task.id).order_by("created_at", "id")
        items = [s.RunSerializer.present(r) for r in runs]
        return Response({"runs": items, "total": len(items)})


class TaskCommentsView(ApiView):
    @extend_schema(
        operation_id="getTaskComments",
        tags=["Tasks"],
        summary="List a task's comments, oldest first",
        responses={200: s.CommentListSerializer, **_errors(403, 404)},
    )
    def get(self, request, taskId):
        task = self.task(taskId, queryset=Task.objects.all())
        comments = Comment.objects.filter(task_id=task.id).order_by("created_at", "id")
        items = [s.CommentSerializer.present(c) for c in comments]
        return Response({"comments": items, "total": len(items)})

    @extend_schema(
        operation_id="addTaskComment",
        tags=["Tasks"],
        summary="Comment on a task, re-opening it",
        request=s.CommentCreateSerializer,
        parameters=[LOCATION, *keyed(201)],
        responses={201: s.CommentCreatedSerializer, **_errors(400, 403, 404, 409, 415, 422)},
    )
    @idempotent
    def post(self, request, taskId):
        task = self.task(taskId)
        data = s.CommentCreateSerializer.validated(self.body)
        comment = lifecycle.comment(
            task.id, data["content"], author=self.principal(), metadata=data["metadata"]
        )
        return Response(
            {
                "comment": s.CommentSerializer.present(comment),
                # The task as the comment left it (a worker may already be running it again).
                "task": s.TaskSerializer.present(comment.task),
            },
            status=201,
            headers={"Location": self.location()},
        )


class TaskCancelView(ApiView):
    @extend_schema(
        operation_id="cancelTask",
        tags=["Tasks"],
        summary="Cancel a task (graceful: after the current turn)",
        request=s.CancelSerializer,
        parameters=[*keyed(200, 202)],
        responses={
            200: s.TaskEnvelopeSerializer,
            202: s.TaskEnvelopeSerializer,
            **_errors(400, 403, 404, 409, 415, 422),
        },
    )
    @idempotent
    def post(self, request, taskId):
        task = self.task(taskId)
        data = s.CancelSerializer.validated(self.body)
        if task.status in LIVE:
            try:
                lifecycle.stop(task.id, graceful=data["graceful"])
            except AlreadyFinal:
                pass  # it ended meanwhile: answered below as it is now
            except TaskNotFound:
                raise errors.not_found(f"Task not found: {taskId}") from None
            task = reload_task(task.id)
        if task.status in (TaskStatus.COMPLETED, TaskStatus.FAILED):
            # Cancelling a cancelled task changes nothing; an ended one cannot be cancelled.
            raise AlreadyFinal(task.status, task_id=task.id)
        winding_down = task.status == TaskStatus.RUNNING and task.run.stop_request == "after_turn"
        return Response(
            {"task": s.TaskSerializer.present(task)}, status=202 if winding_down else 200
        )


class TaskRetryView(ApiView):
    @extend_schema(
        operation_id="retryTask",
        tags=["Tasks"],
        summary="Retry a failed task as a new attempt",
        request=s.EmptySerializer,
        parameters=[*keyed(202)],
        responses={202: s.TaskEnvelopeSerializer, **_errors(400, 403, 404, 409, 415, 422)},
    )
    @idempotent
    def post(self, request, taskId):
        task = self.task(taskId)
        s.EmptySerializer.validated(self.body)
        task = lifecycle.retry_task(task.id)  # as the retry wrote it, before a worker moves it
        return Response({"task": s.TaskSerializer.present(task)}, status=202)


# --- conversations ---------------------------------------------------------------------------


def conversation_rows():
    return Conversation.objects.prefetch_related(
        Prefetch(
            "runs",
            queryset=Run.objects.filter(status__in=RUN_ACTIVE).order_by("-created_at", "-id"),
            to_attr="active_runs",
        )
    )


class ConversationListView(ApiView):
    @extend_schema(
        operation_id="listConversations",
        tags=["Conversations"],
        summary="List the principal's visible conversations",
        parameters=[_query("agentId", "Exact agent id."), *PAGE_PARAMETERS],
        responses={200: s.ConversationPageSerializer, **_errors(400)},
    )
    def get(self, request):
        limit, offset, position = cursor_params(request, CONVERSATION_ORDER, 20, 100)
        rows = conversation_rows().filter(
            owner_id=owner_id(request), hidden=False, deleting_at__isnull=True
        )
        agent_id = request.query_params.get("agentId")
        if agent_id is not None and not _plain(agent_id):
            items, total, after = [], 0, None
        else:
            if agent_id is not None:
                rows = rows.filter(agent=agent_id)
            items, total, offset, after = keyset_page(
                rows, CONVERSATION_ORDER, limit, offset, position
            )
        body = [s.ConversationSerializer.present(c) for c in items]
        return Response(cursor_page_body("conversations", body, total, limit, offset, after))

    @extend_schema(
        operation_id="createConversation",
        tags=["Conversations"],
        summary="Create a conversation",
        request=s.ConversationCreateSerializer,
        parameters=[LOCATION, *keyed(201)],
        responses={201: s.ConversationEnvelopeSerializer, **_errors(400, 404, 409, 415, 422)},
    )
    @idempotent
    def post(self, request):
        data = s.ConversationCreateSerializer.validated(self.body)
        agent = exposed_agent(data["agent_id"])
        conversation = lifecycle.create_conversation(
            owner=self.principal(),
            agent_id=agent.id,
            title=data["title"],
            metadata=data["metadata"],
        )
        conversation = conversation_rows().get(pk=conversation.pk)
        return Response(
            {"conversation": s.ConversationSerializer.present(conversation)},
            status=201,
            headers={"Location": self.location(conversation.id)},
        )


class ConversationView(ApiView):
    @extend_schema(
        operation_id="getConversation",
        tags=["Conversations"],
        summary="Read a conversation",
        responses={200: s.ConversationEnvelopeSerializer, **_errors(403, 404)},
    )
    def get(self, request, conversationId):
        conversation = self.conversation(conversationId)
        return Response({"conversation": s.ConversationSerializer.present(conversation)})

    @extend_schema(
        operation_id="updateConversation",
        tags=["Conversations"],
        summary="Change a conversation's title or metadata",
        request=s.ConversationUpdateSerializer,
        responses={200: s.ConversationEnvelopeSerializer, **_errors(400, 403, 404, 415)},
    )
    def patch(self, request, conversationId):
        conversation = self.conversation(conversationId)
        changes = s.ConversationUpdateSerializer.validated(self.body)
        if changes:
            try:
                conversation = lifecycle.update_conversation(conversation.id, **changes)
            except ConversationNotFound:
                raise errors.not_found(f"Conversation not found: {conversationId}") from None
        return Response({"conversation": s.ConversationSerializer.present(conversation)})

    @extend_schema(
        operation_id="deleteConversation",
        tags=["Conversations"],
        summary="Stop and delete a conversation with its whole tree",
        request=None,
        responses={204: OpenApiResponse(description="Deleted"), **_errors(400, 403, 404, 415)},
    )
    def delete(self, request, conversationId):
        # A delete that died halfway left the tree marked: deleting it again finishes it.
        conversation = self.conversation(conversationId, deleting=True)
        try:
            lifecycle.delete_conversation(conversation.id)
        except ConversationNotFound:
            raise errors.not_found(f"Conversation not found: {conversationId}") from None
        return Response(status=204)


class MessagesView(ApiView):
    @extend_schema(
        operation_id="listMessages",
        tags=["Conversations"],
        summary="List a conversation's messages",
        parameters=[*PAGE_PARAMETERS, _query("order", "asc (default) or desc.")],
        responses={200: s.MessagePageSerializer, **_errors(400, 403, 404)},
    )
    def get(self, request, conversationId):
        conversation = self.conversation(conversationId)
        order = request.query_params.get("order", "asc")
        if order not in ("asc", "desc"):
            raise errors.validation("order must be asc or desc", "order")
        limit, offset, position = cursor_params(request, MESSAGE_ORDER[order], 100, 500)
        rows = Event.objects.filter(conversation_id=conversation.id, type__in=MESSAGE_TYPES)
        # A turn that only called tools is logged with null content for the transcript; it is
        # not a message anyone wrote (docs/rest.md#messages).
        rows = rows.exclude(type="message.assistant", data__content=None)
        items, total, offset, after = keyset_page(
            rows, MESSAGE_ORDER[order], limit, offset, position
        )
        body = [s.MessageSerializer.present(e) for e in items]
        return Response(cursor_page_body("messages", body, total, limit, offset, after))

    @extend_schema(
        operation_id="postMessage",
        tags=["Conversations"],
        summary="Send a user message; it starts a run of the conversation's agent",
        request=s.MessageCreateSerializer,
        parameters=[*keyed(202)],
        responses={202: s.MessageAcceptedSerializer, **_errors(400, 403, 404, 409, 415, 422)},
    )
    @idempotent
    def post(self, request, conversationId):
        conversation = self.conversation(conversationId)
        data = s.MessageCreateSerializer.validated(self.body)
        agent = exposed_agent(conversation.agent)
        uploads = data["uploads"]
        existing = File.objects.filter(conversation_id=conversation.id).count() if uploads else 0
        rules = check_files(agent, uploads, existing)
        own_task = Task.objects.filter(conversation_id=conversation.id).first()
        owner = conversation.owner
        refs = [u.ref() for u in uploads] or None
        with files.kept_only_on_success() as written, transaction.atomic():
            if own_task is None:
                try:
                    run, event = lifecycle.post_message(
                        conversation.id, data["message"], metadata=data["metadata"], files=refs
                    )
                except ConversationNotFound:
                    raise errors.not_found(f"Conversation not found: {conversationId}") from None
            else:
                comment = lifecycle.comment(
                    own_task.id,
                    data["message"],
                    author=self.principal(),
                    metadata=data["metadata"],
                    origin="message",
                    files=refs,
                )
                run = Run.objects.get(pk=comment.run_id)
                event = Event.objects.get(
                    conversation_id=conversation.id,
                    type="message.user",
                    data__commentId=comment.id,
                )
            if uploads:
                store_uploads(
                    uploads,
                    conversation_id=conversation.id,
                    owner=owner,
                    rules=rules,
                    written=written,
                )
        return Response(
            {"message": s.MessageSerializer.present(event), "run": s.RunSerializer.present(run)},
            status=202,
        )


# --- events ----------------------------------------------------------------------------------


class EventsView(ApiView):
    @extend_schema(
        operation_id="listEvents",
        tags=["Events"],
        summary="Read a conversation's event log after a seq",
        parameters=[
            _query("after", "Return events with seq > after (default 0).", OpenApiTypes.INT),
            _query("limit", "Page size (default 100, max 500).", OpenApiTypes.INT),
        ],
        responses={200: s.EventPageSerializer, **_errors(400, 403, 404)},
    )
    def get(self, request, conversationId):
        conversation = self.conversation(conversationId)
        after = non_negative(
            request.query_params.get("after"), "after", "after must be a non-negative integer"
        )
        limit, _ = page_params(request, 100, 500)
        rows = list(
            Event.objects.filter(conversation_id=conversation.id, seq__gt=after).order_by("seq")[
                : limit + 1
            ]
        )
        events = rows[:limit]
        last_seq = max(conversation.last_seq, rows[-1].seq if rows else 0)
        return Response(
            {
                "events": [s.EventSerializer.present(e) for e in events],
                "after": after,
                "limit": limit,
                "lastSeq": last_seq,
                "hasMore": len(rows) > limit,
            }
        )


class EventStreamView(ApiView):
    http_method_names = ["get"]

    @extend_schema(
        operation_id="streamEvents",
        tags=["Events"],
        summary="Follow a conversation live (Server-Sent Events)",
        parameters=[
            _query("after", "Resume point when no Last-Event-ID is sent.", OpenApiTypes.INT),
            _query("until", "terminal: close after the task's terminal status."),
            OpenApiParameter(
                "Last-Event-ID",
                OpenApiTypes.STR,
                OpenApiParameter.HEADER,
                description="Resume point (a seq); takes precedence over after.",
            ),
        ],
        responses={
            (200, "text/event-stream"): OpenApiResponse(
                OpenApiTypes.STR,
                description="snapshot, then id/event/data frames; transient message.delta "
                "frames (no id) while a reply is written",
            ),
            **_errors(400, 403, 404),
        },
    )
    def get(self, request, conversationId):
        conversation = self.conversation(conversationId)
        after = request.query_params.get("after")
        resume = None
        if after is not None:
            resume = non_negative(after, "after", "after must be a non-negative integer")
        until = request.query_params.get("until")
        own_task = None
        if until is not None:
            if until != "terminal":
                raise errors.validation("until must be terminal", "until")
            own_task = Task.objects.filter(conversation_id=conversation.id).first()
            if own_task is None:
                raise errors.validation("until=terminal needs a task's conversation", "until")
        header = (request.META.get("HTTP_LAST_EVENT_ID") or "").strip()
        if header.isascii() and header.isdigit():
            resume = min(int(header), SQL_MAX) if len(header) <= 18 else SQL_MAX
        if own_task is None:
            own_task = Task.objects.filter(conversation_id=conversation.id).only("id").first()
        held = slots.take(
            request,
            slots.STREAM,
            app_settings.MAX_STREAMS_PER_USER,
            app_settings.SLOT_LEASE_SECONDS,
        )
        asgi = isinstance(request._request, ASGIRequest)
        stream = streams.EventStream(
            conversation.id,
            own_task.id if own_task else None,
            resume,
            until is not None,
            held=held,
            client_fd=None if asgi else slots.client_socket(request._request),
        )
        content = streams.async_stream(stream) if asgi else streams.sync_stream(stream)
        return streams.StreamResponse(content, stream)


# --- actions ---------------------------------------------------------------------------------


class ActionsView(ApiView):
    @extend_schema(
        operation_id="listActions",
        tags=["Actions"],
        summary="List a conversation's approvals and questions",
        parameters=[_query("status", "pending (default), approved, …, or all.")],
        responses={200: s.ActionListSerializer, **_errors(400, 403, 404)},
    )
    def get(self, request, conversationId):
        conversation = self.conversation(conversationId)
        wanted = request.query_params.get("status", "pending")
        if wanted not in ACTION_FILTERS:
            raise errors.validation(f"Unknown status: {wanted}", "status")
        rows = PendingAction.objects.filter(conversation_id=conversation.id)
        if wanted != "all":
            rows = rows.filter(status=wanted)
        items = [s.PendingActionSerializer.present(a) for a in rows.order_by("created_at", "id")]
        if wanted in ("pending", "all"):
            # Actions escalated from delegate descendants are answerable here too.
            escalated = [a for a in s.pending_actions(conversation.id) if "path" in a]
            items = sorted(items + escalated, key=lambda a: (a["createdAt"], a["id"]))
        return Response({"actions": items, "total": len(items)})


class ActionView(ApiView):
    @extend_schema(
        operation_id="resolveAction",
        tags=["Actions"],
        summary="Answer an approval or a question",
        request=s.ActionAnswerSerializer,
        parameters=[*keyed(200)],
        responses={200: s.ActionResolvedSerializer, **_errors(400, 403, 404, 409, 415, 422)},
    )
    @idempotent
    def post(self, request, conversationId, actionId):
        conversation = self.conversation(conversationId)
        action = PendingAction.objects.filter(pk=actionId).first() if _plain(actionId) else None
        if action is not None and action.conversation_id != conversation.id:
            # An escalated action is answerable through any conversation on its path.
            if conversation.id not in delegation.path_of(action.conversation_id):
                action = None
        if action is None:
            raise errors.not_found(f"Action not found: {actionId}")
        answer = s.ActionAnswerSerializer.validated(self.body, action=action)
        resolution = {**answer, "decided_by": self.principal()}
        try:
            task = lifecycle.answer(action.id, resolution)
        except (ActionNotFound, TaskNotFound, RunNotFound):
            raise errors.not_found(f"Action not found: {actionId}") from None
        action.refresh_from_db()
        out = {"action": s.PendingActionSerializer.present(action)}
        if task is not None:
            # The task as this answer left it (a worker may already be running it again).
            out["task"] = s.TaskSerializer.present(task)
        return Response(out)


# --- files -----------------------------------------------------------------------------------


def readable_file(request, file_id: str) -> File:
    """The file the caller may read (404 for an unknown id, 403 for another owner's file)."""
    row = None
    if _plain(file_id):
        row = File.objects.filter(pk=file_id, conversation__deleting_at__isnull=True).first()
    if row is None:
        raise errors.not_found(f"File not found: {file_id}")
    check_owner(request, row.owner_id, "file")
    return row


class FileView(ApiView):
    @extend_schema(
        operation_id="getFile",
        tags=["Files"],
        summary="Read a file's metadata",
        responses={200: s.FileEnvelopeSerializer, **_errors(403, 404)},
    )
    def get(self, request, fileId):
        return Response({"file": s.FileSerializer.present(readable_file(request, fileId))})


class FileContentView(ApiView):
    @extend_schema(
        operation_id="getFileContent",
        tags=["Files"],
        summary="Download a file's bytes",
        responses={
            (200, "*/*"): OpenApiResponse(OpenApiTypes.BINARY, description="The stored bytes"),
            **_errors(403, 404),
        },
    )
    def get(self, request, fileId):
        row = readable_file(request, fileId)
        try:
            handle = files.open_bytes(row)
        except FileNotFoundError:
            raise errors.not_found(f"File not found: {fileId}") from None
        response = FileResponse(handle, content_type=row.mime_type)
        response["Content-Length"] = str(row.size)
        response["Content-Disposition"] = content_disposition(row.name)
        response["X-Content-Type-Options"] = "nosniff"
        response["Cache-Control"] = "private"
        return response


def content_disposition(name: str) -> str:
    """`attachment` with an ASCII fallback and the RFC 5987 UTF-8 name."""
    fallback = "".join(c if 32 <= ord(c) < 127 and c not in '"\\' else "_" for c in name)
    return f"attachment; filename=\"{fallback}\"; filename*=UTF-8''{quote(name, safe='')}"


# --- agents ----------------------------------------------------------------------------------


class AgentListView(ApiView):
    @extend_schema(
        operation_id="listAgents",
        tags=["Agents"],
        summary="List the agents exposed over REST",
        responses={200: s.AgentListSerializer, **_errors()},
    )
    def get(self, request):
        agents = [a for a in registry.agents() if a.expose]
        return Response({"agents": [s.AgentSerializer.present(a) for a in agents]})


class AgentView(ApiView):
    @extend_schema(
        operation_id="getAgent",
        tags=["Agents"],
        summary="Read one agent",
        responses={200: s.AgentEnvelopeSerializer, **_errors(404)},
    )
    def get(self, request, agentId):
        agent = exposed_agent(agentId)
        return Response({"agent": s.AgentSerializer.present(agent)})
