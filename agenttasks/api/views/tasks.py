"""The task endpoints (docs/rest.md#tasks): list, create, read, status, wait, result, runs,
comments, cancel and retry."""

import math
import re
from typing import Any

from drf_spectacular.types import OpenApiTypes
from rest_framework.response import Response

from ... import lifecycle
from ...conf import app_settings
from ...delivery import callbacks
from ...exceptions import TaskNotFound
from ...models import Comment, Conversation, Run, Task, TaskResult
from ...states import TERMINAL, MultitaskStrategy, TaskStatus
from ...toolkit import caps, errors
from ...toolkit.cursors import Keyset, keyset_page
from ...toolkit.cursors import page_body as cursor_page_body
from ...toolkit.cursors import params as cursor_params
from ...toolkit.identity import owner_id
from .. import serializers as s
from ..idempotency import idempotent
from .base import (
    LOCATION,
    PAGE_PARAMETERS,
    ApiView,
    exposed_agent,
    extend_schema,
    keyed,
    plain_id,
    query_param,
    refusals,
    task_rows,
)

NUMBER = re.compile(r"[+]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?")
STATUSES = set(TaskStatus.values)
TASK_ORDER = Keyset("tasks", ("created_at", "id"), descending=True)


def task_detail(task: Task) -> dict:
    """Return the body of GET /tasks/{id}: the task, its result and its pending actions."""
    out: dict[str, Any] = {"task": s.TaskSerializer.present(task)}
    result = getattr(task, "task_result", None)
    if result is not None:
        out["result"] = s.TaskResultSerializer.present(result)
    if task.status == TaskStatus.WAITING_FOR_INPUT:
        actions = s.pending_actions(task.conversation_id, run_id=task.run_id)
        if actions:
            out["pendingActions"] = actions
    return out


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
            query_param("agentId", "Exact agent id."),
            query_param("status", "One status or several, comma-separated."),
            query_param("conversationId", "Tasks whose own conversation is this one."),
            query_param("parentConversationId", "Tasks spawned from this conversation."),
            *PAGE_PARAMETERS,
        ],
        responses={200: s.TaskPageSerializer, **refusals(400)},
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
        rows = task_rows().visible().owned_by(owner_id(request))
        filters = {
            "agent": params.get("agentId"),
            "conversation_id": params.get("conversationId"),
            "parent_conversation_id": params.get("parentConversationId"),
        }
        empty = False
        for field, value in filters.items():
            if value is not None:
                empty = empty or not plain_id(value)
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
        responses={201: s.TaskEnvelopeSerializer, **refusals(400, 403, 404, 409, 415, 422)},
    )
    @idempotent
    def post(self, request):
        data = s.TaskCreateSerializer.validated(self.body)
        agent = exposed_agent(data["agent_id"])
        try:
            task = lifecycle.create(
                owner=self.principal(),
                agent_id=agent.id,
                input=data["input"],
                label=data["label"],
                callback_url=data["callback_url"] or None,
                metadata=data["metadata"],
                uploads=data["uploads"],
                priority=data["priority"],
                not_before=data["not_before"],
            )
        except callbacks.CallbackURLError as exc:
            raise errors.validation(str(exc), "callbackUrl") from None
        # The answer is built from what was written: no worker has moved it in our copy.
        return Response(
            {"task": s.TaskSerializer.present(task, files=data["uploads"])},
            status=201,
            headers={"Location": self.location(task.id)},
        )


class TaskView(ApiView):
    @extend_schema(
        operation_id="getTask",
        tags=["Tasks"],
        summary="Read a task, its result and its pending actions",
        responses={200: s.TaskDetailSerializer, **refusals(403, 404)},
    )
    def get(self, request, taskId):
        task = self.task(taskId, queryset=task_rows().select_related("task_result"))
        return Response(task_detail(task))


class TaskStatusView(ApiView):
    @extend_schema(
        operation_id="getTaskStatus",
        tags=["Tasks"],
        summary="Read a task's status body",
        responses={200: s.TaskStatusSerializer, **refusals(403, 404)},
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
            query_param(
                "timeout",
                "Seconds to wait (default 30, clamped to MAX_STATUS_WAIT).",
                OpenApiTypes.NUMBER,
            ),
            query_param("include", "result: also carry the task's result when it has one."),
        ],
        responses={200: s.TaskWaitSerializer, **refusals(400, 403, 404)},
    )
    def get(self, request, taskId):
        task = self.task(taskId, queryset=Task.objects.select_related("run"))
        timeout = min(seconds(request.query_params.get("timeout")), app_settings.MAX_STATUS_WAIT)
        include = request.query_params.get("include")
        if include is not None and include != "result":
            raise errors.validation("include must be result", "include")
        # The wait's place lapses on its own shortly after the wait would have returned.
        held = caps.take(
            request,
            caps.WAIT,
            app_settings.MAX_WAITS_PER_USER,
            timeout + app_settings.SLOT_LEASE_SECONDS,
        )
        client = caps.client_socket(request._request)
        try:
            task = lifecycle.wait_for(
                task.id,
                wait=timeout,
                settled=TERMINAL | {TaskStatus.WAITING_FOR_INPUT},
                stop_check=lambda: caps.gone(client),
            )
        finally:
            held.release()
        if Conversation.objects.being_deleted().filter(pk=task.conversation_id).exists():
            raise errors.refusal(TaskNotFound(taskId))
        result = None
        if include or (not task.summary and task.status == TaskStatus.WAITING_FOR_INPUT):
            result = TaskResult.objects.filter(task_id=task.id).first()
        return Response(s.TaskWaitSerializer.present(task, result=result, include=bool(include)))


def seconds(raw: str | None, default: float = 30.0) -> float:
    """Parse a non-negative number of seconds (decimals and exponents allowed)."""
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
        responses={200: s.ResultEnvelopeSerializer, **refusals(403, 404)},
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
        responses={200: s.RunListSerializer, **refusals(403, 404)},
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
        responses={200: s.CommentListSerializer, **refusals(403, 404)},
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
        parameters=[LOCATION, *keyed(201, 202)],
        responses={
            201: s.CommentCreatedSerializer,
            202: s.CommentAcceptedSerializer,
            **refusals(400, 403, 404, 409, 415, 422),
        },
    )
    @idempotent
    def post(self, request, taskId):
        task = self.task(taskId)
        data = s.CommentCreateSerializer.validated(self.body)
        sent = lifecycle.send_to_task(
            task.id,
            data["content"],
            strategy=data["strategy"] or MultitaskStrategy.REJECT,
            author=self.principal(),
            metadata=data["metadata"],
        )
        if sent.comment is None:
            # Waiting its turn, or steered to the run that is going (docs/rest.md#busy-tasks).
            body = {
                "task": s.TaskSerializer.present(sent.task),
                "run": s.RunSerializer.present(sent.run),
            }
            if sent.event is not None:
                body["message"] = s.MessageSerializer.present(sent.event)
            return Response(body, status=202)
        return Response(
            {
                "comment": s.CommentSerializer.present(sent.comment),
                # The task as the comment left it (a worker may already be running it again).
                "task": s.TaskSerializer.present(sent.task),
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
            **refusals(400, 403, 404, 409, 415, 422),
        },
    )
    @idempotent
    def post(self, request, taskId):
        task = self.task(taskId)
        data = s.CancelSerializer.validated(self.body)
        task = lifecycle.cancel(task.id, graceful=data["graceful"])
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
        responses={202: s.TaskEnvelopeSerializer, **refusals(400, 403, 404, 409, 415, 422)},
    )
    @idempotent
    def post(self, request, taskId):
        task = self.task(taskId)
        s.EmptySerializer.validated(self.body)
        task = lifecycle.retry_task(task.id)  # as the retry wrote it, before a worker moves it
        return Response({"task": s.TaskSerializer.present(task)}, status=202)
