"""The A2A operations, whichever binding carried them (docs/a2a.md#operations).

Each takes a `Call` (the DRF request, its agent and where the app is mounted) and an SDK request
message, goes through the lifecycle and the REST read paths, and returns an SDK message or
raises one of the SDK's A2A errors. Nothing here writes a status: the lifecycle does.
"""

import logging
from dataclasses import dataclass
from datetime import datetime
from datetime import timezone as dt_timezone
from typing import Any

from a2a.types import a2a_pb2 as pb
from a2a.utils.constants import DEFAULT_LIST_TASKS_PAGE_SIZE, MAX_LIST_TASKS_PAGE_SIZE
from a2a.utils.errors import (
    ContentTypeNotSupportedError,
    InvalidParamsError,
    TaskNotCancelableError,
    TaskNotFoundError,
    UnsupportedOperationError,
)
from django.db import transaction
from django.db.models import Q

from .. import ids, lifecycle, tracing
from ..conf import app_settings
from ..delivery import callbacks
from ..exceptions import AlreadyFinal, TaskError, TaskNotFound
from ..models import A2AContext, A2APushConfig, Conversation, PendingAction, Task
from ..states import TERMINAL, TaskStatus
from ..store import files
from ..toolkit import caps, checks, errors
from ..toolkit.cursors import Keyset
from ..toolkit.identity import owner_id, user_of
from . import mapping, push

logger = logging.getLogger(__name__)

SETTLED = TERMINAL | {TaskStatus.WAITING_FOR_INPUT}
# ListTasks' historyLength per task, at most: a page holds up to 100 tasks.
MAX_LIST_HISTORY_LENGTH = 10
# ListTasks' order; its signed cursors, as REST signs its own, are the page tokens.
TASKS_ORDER = Keyset("a2a.tasks", ("created_at", "id"), descending=True)
YES = {"yes", "y", "approve", "approved", "ok", "true"}
NO = {"no", "n", "deny", "denied", "reject", "false"}
# The metadata keys a client sets a task's priority and delayed start with (docs/a2a.md).
PRIORITY_KEY, NOT_BEFORE_KEY = "agenttasks.priority", "agenttasks.notBefore"
STRATEGY_KEY = "agenttasks.multitaskStrategy"


@dataclass
class Call:
    """One A2A request: who asks, of which agent, and the app's absolute mount URL."""

    request: Any
    agent: Any
    mount_url: str

    @property
    def user(self):
        return user_of(self.request)

    @property
    def owner_id(self):
        return owner_id(self.request)

    def present(self, task: Task, history_length=None, with_artifacts=True) -> pb.Task:
        contexts = mapping.contexts_of([task])
        history = mapping.histories([task], contexts, self.mount_url, history_length)
        return mapping.task_message(
            task,
            contexts[task.id],
            base_url=self.mount_url,
            history=history[task.id],
            with_artifacts=with_artifacts,
        )


def invalid(exc: errors.ApiError) -> InvalidParamsError:
    return InvalidParamsError(exc.message)


def find_task(call: Call, task_id: str) -> Task:
    """Return the caller's task of this agent; another user's task is not found either."""
    task = Task.objects.select_related("run").filter(agent=call.agent.id).named(task_id)
    if task is None or task.owner_id != call.owner_id:
        raise TaskNotFoundError(errors.refusal(TaskNotFound(task_id)).message)
    return task


def reload(task_id: str) -> Task:
    return Task.objects.select_related("run").get(pk=task_id)


# --- SendMessage -----------------------------------------------------------------------------


@dataclass
class SendRequest:
    """A SendMessageRequest: as protobuf reads it (`proto`), and as its JSON came (`params`),
    from which its metadata, data parts and file bytes are read (`mapping.read`)."""

    proto: pb.SendMessageRequest
    params: dict

    @property
    def message_json(self) -> dict:
        message = self.params.get("message")
        return message if isinstance(message, dict) else {}


@dataclass
class Sent:
    """A task as a SendMessage left it (`task` None: rejected), and the log position a stream
    of it follows from (so that nothing the worker wrote meanwhile is missed)."""

    message: pb.Task
    task: Task | None
    after: int = 0


def send(call: Call, req: SendRequest) -> Sent:
    """Create a task, or answer the one named by `taskId`; return it as written (no wait)."""
    message = req.proto.message
    if not message.parts:
        raise InvalidParamsError("message.parts is required")
    incoming = mapping.read(message, req.message_json["parts"])
    if message.task_id:
        task = find_task(call, message.task_id)
        after = (
            Conversation.objects.filter(pk=task.conversation_id)
            .values_list("last_seq", flat=True)
            .first()
        )
        strategy = _metadata(req).get(STRATEGY_KEY)
        if strategy is None:
            answered = answer(call, task, incoming)
        else:
            answered = comment_under(call, task, incoming, strategy)
        return Sent(call.present(answered), answered, after or 0)
    task_message, created = create(call, req, incoming)
    if created is not None:
        traced = tracing.current()
        traced.set("a2a.task.id", created.id)
        traced.set("a2a.context.id", created.conversation_id)
    return Sent(task_message, created, 0)  # a new conversation: follow it from its start


def send_message(call: Call, req: SendRequest) -> pb.SendMessageResponse:
    """SendMessage: blocking until a terminal or interrupted state unless returnImmediately.

    A blocking one takes its wait place first: refused it (429), it has written nothing, so a
    retry cannot do the work twice.
    """
    configuration = req.proto.configuration
    held = None if configuration.return_immediately else wait_place(call)
    try:
        sent = send(call, req)
        if held is None or sent.task is None:
            return pb.SendMessageResponse(task=sent.message)
        task = wait(call, sent.task.id)
        return pb.SendMessageResponse(task=call.present(task, _history_length(configuration)))
    finally:
        if held is not None:
            held.release()


def _history_length(configuration) -> int | None:
    return configuration.history_length if configuration.HasField("history_length") else None


def wait_place(call: Call) -> caps.Held:
    """Take one of the user's MAX_WAITS_PER_USER places, as /wait does (429 when all are held)."""
    return caps.take(
        call.request,
        caps.WAIT,
        app_settings.MAX_WAITS_PER_USER,
        float(app_settings.MAX_STATUS_WAIT) + app_settings.SLOT_LEASE_SECONDS,
    )


def wait(call: Call, task_id: str) -> Task:
    """Wait for a terminal or input-required state, at most MAX_STATUS_WAIT (place held)."""
    client = caps.client_socket(getattr(call.request, "_request", call.request))
    try:
        return lifecycle.wait_for(
            task_id,
            wait=float(app_settings.MAX_STATUS_WAIT),
            settled=SETTLED,
            stop_check=lambda: caps.gone(client),
        )
    except TaskNotFound:
        raise TaskNotFoundError(errors.refusal(TaskNotFound(task_id)).message) from None


def _metadata(req: SendRequest) -> dict:
    """Check the message's metadata and the request's over it, as sent, as REST checks it."""
    sent = [
        ("message.metadata", req.message_json.get("metadata")),
        ("metadata", req.params.get("metadata")),
    ]
    merged: dict = {}
    try:
        for path, value in sent:
            if value is not None:
                merged.update(checks.metadata(value, path))
        return checks.metadata(merged)
    except errors.ApiError as exc:
        raise invalid(exc) from None


def _start_options(metadata: dict) -> tuple[int, datetime | None]:
    """Read the task's priority and delayed start from its metadata (`agenttasks.priority`,
    `agenttasks.notBefore`: docs/a2a.md#creating-a-task), checked as REST checks them."""
    try:
        priority = checks.priority(metadata.get(PRIORITY_KEY, 0), PRIORITY_KEY)
        moment = metadata.get(NOT_BEFORE_KEY)
        return priority, None if moment is None else checks.moment(moment, NOT_BEFORE_KEY)
    except errors.ApiError as exc:
        raise invalid(exc) from None


def _push_config(req: pb.SendMessageRequest):
    if not req.configuration.HasField("task_push_notification_config"):
        return None
    config = req.configuration.task_push_notification_config
    push.check_url(config.url)
    push.check_fields(config)
    return config


def create(call: Call, req: SendRequest, incoming) -> tuple[pb.Task, Task | None]:
    """Create a new task, under the agent's file policy and the REST limits; a refusal of the
    lifecycle (the active-task limit) is a REJECTED task."""
    text = mapping.input_text(incoming)
    if not text.strip():
        raise InvalidParamsError("The message needs a text or data part: the task's input")
    try:
        text = checks.text(text, "input", required_message="input is required")
    except errors.ApiError as exc:
        raise invalid(exc) from None
    agent = call.agent
    metadata = _metadata(req)
    priority, not_before = _start_options(metadata)
    push_config = _push_config(req.proto)
    context_id = req.proto.message.context_id
    if len(context_id) > 200 or "\x00" in context_id:
        raise InvalidParamsError("contextId must be at most 200 characters, without NUL")

    def before_commit(task):
        A2AContext.objects.create(task=task, context_id=context_id or task.conversation_id)
        if push_config is not None:
            push.store_config(task, push_config)

    try:
        task = lifecycle.create(
            owner=call.user,
            agent_id=agent.id,
            input=text,
            metadata=metadata,
            uploads=incoming.uploads,
            before_commit=before_commit,
            priority=priority,
            not_before=not_before,
        )
    except files.FileRefused as exc:
        if exc.code in ("unsupported_media_type", "attachments_disabled"):
            raise ContentTypeNotSupportedError(exc.message) from None
        raise InvalidParamsError(exc.message) from None
    except TaskError as exc:
        if exc.status_code >= 500:
            raise
        reason = errors.refusal(exc).message
        context = context_id or ids.new_id("ctx_")  # nothing written: a context of its own
        return mapping.rejected(reason, context, req.proto.message), None
    except callbacks.CallbackURLError as exc:
        raise InvalidParamsError(str(exc)) from None
    return call.present(reload(task.id)), task


def answer(call: Call, task: Task, incoming) -> Task:
    """Answer a task waiting for input with a message: the answer to its pending actions (data
    parts, or plain text for a single question or approval), or a comment for a clarification."""
    if task.status != TaskStatus.WAITING_FOR_INPUT:
        raise UnsupportedOperationError(
            f"Task {task.id} is {task.status}: only a task waiting for input takes a message"
        )
    if incoming.uploads:
        raise InvalidParamsError("An answer carries no files")
    action_ids = lifecycle.waiting_on(task)
    if not action_ids:
        if not incoming.text.strip():
            raise InvalidParamsError("The answer to a clarification is a text part")
        try:
            text = checks.text(incoming.text, "content", required_message="content is required")
            lifecycle.comment(task.id, text, author=call.user)
        except errors.ApiError as exc:
            raise invalid(exc) from None
        return reload(task.id)
    actions = {a.id: a for a in PendingAction.objects.filter(pk__in=action_ids)}
    answers = _answers(incoming, list(actions.values()))
    for body in answers:
        action_id = body.get("actionId") if isinstance(body, dict) else None
        if action_id is None and len(actions) == 1:
            action_id = next(iter(actions))
        action = actions.get(str(action_id))
        if action is None:
            raise InvalidParamsError(
                "Name the action you answer (actionId): one of " + ", ".join(sorted(actions))
            )
        try:
            resolution = checks.answer(action, body)
        except errors.ApiError as exc:
            raise invalid(exc) from None
        lifecycle.resolve_as_person(action.id, {**resolution, "decided_by": call.user})
    return reload(task.id)


def comment_under(call: Call, task: Task, incoming, strategy: Any) -> Task:
    """Comment on a task under a multitask strategy (`agenttasks.multitaskStrategy`): it
    re-opens a finished task, and a busy one follows the strategy (docs/a2a.md#busy-tasks)."""
    if incoming.uploads:
        raise InvalidParamsError("A comment carries no files")
    try:
        text = checks.text(incoming.text, "content", required_message="content is required")
        lifecycle.send_to_task(task.id, text, strategy=str(strategy), author=call.user)
    except errors.ApiError as exc:
        raise invalid(exc) from None
    except TaskError as exc:
        if exc.status_code >= 500:
            raise
        refusal = errors.refusal(exc).message
        if exc.status_code == 400:
            raise InvalidParamsError(refusal) from None
        raise UnsupportedOperationError(refusal) from None
    return reload(task.id)


def _answers(incoming, actions: list[PendingAction]) -> list[dict]:
    """The answer objects a message carries (`{"actionId"?, "approved"?, "comment"?, "answers"?}`)."""
    out: list[dict] = []
    for data in incoming.data:
        listed = isinstance(data, dict) and isinstance(data.get("actions"), list)
        items = data["actions"] if listed else [data]
        out.extend(i if isinstance(i, dict) else {} for i in items)
    if out:
        return out
    text = incoming.text.strip()
    if len(actions) == 1 and text:
        action = actions[0]
        if action.kind == "approval" and text.lower() in YES | NO:
            return [{"approved": text.lower() in YES}]
        questions = action.questions or []
        if action.kind == "question" and len(questions) == 1:
            return [{"answers": {questions[0]["id"]: text}}]
    raise InvalidParamsError(
        "Answer with a data part: {actionId, approved, comment} or {actionId, answers}"
    )


# --- GetTask, ListTasks, CancelTask ----------------------------------------------------------


def get_task(call: Call, req: pb.GetTaskRequest) -> pb.Task:
    task = find_task(call, req.id)
    length = req.history_length if req.HasField("history_length") else None
    if length is not None and length < 0:
        raise InvalidParamsError("historyLength must not be negative")
    return call.present(task, length)


def list_tasks(call: Call, req: pb.ListTasksRequest) -> pb.ListTasksResponse:
    """Return the caller's tasks of this agent, newest first, by pages (a page token is a cursor)."""
    size = req.page_size if req.HasField("page_size") else DEFAULT_LIST_TASKS_PAGE_SIZE
    if size < 1:
        raise InvalidParamsError("pageSize must be at least 1")
    size = min(size, MAX_LIST_TASKS_PAGE_SIZE)
    length = req.history_length if req.HasField("history_length") else 0
    if length < 0:
        raise InvalidParamsError("historyLength must not be negative")
    length = min(length, MAX_LIST_HISTORY_LENGTH)
    if "\x00" in req.context_id:
        raise InvalidParamsError("contextId must not contain NUL")
    order = TASKS_ORDER.of(call.agent.id)  # a token of another agent's list is refused
    rows = (
        Task.objects.select_related("run")
        .visible()
        .owned_by(call.owner_id)
        .filter(agent=call.agent.id)
    )
    if req.context_id:
        rows = rows.filter(
            Q(a2a_context__context_id=req.context_id)
            | Q(a2a_context__isnull=True, conversation_id=req.context_id)
        )
    if req.status:
        rows = rows.filter(status__in=mapping.STATUSES_OF.get(req.status, []))
    if req.HasField("status_timestamp_after"):
        rows = rows.filter(
            updated_at__gt=req.status_timestamp_after.ToDatetime(tzinfo=dt_timezone.utc)
        )
    total = rows.count()
    if req.page_token:
        try:
            rows = rows.filter(order.after(order.position(req.page_token)))
        except errors.ApiError:
            raise InvalidParamsError("pageToken is not one this server gave") from None
    page = list(rows.order_by(*order.ordering)[: size + 1])
    more = len(page) > size
    page = page[:size]
    contexts = mapping.contexts_of(page)
    histories = mapping.histories(page, contexts, call.mount_url, length)
    tasks = [
        mapping.task_message(
            t,
            contexts[t.id],
            base_url=call.mount_url,
            history=histories[t.id],
            with_artifacts=req.include_artifacts,
        )
        for t in page
    ]
    return pb.ListTasksResponse(
        tasks=tasks,
        next_page_token=order.cursor(page[-1]) if more else "",
        page_size=size,
        total_size=total,
    )


def cancel_task(call: Call, req: pb.CancelTaskRequest) -> pb.Task:
    """Cancel now. Only the cancel whose stop ended the task succeeds: a task that has ended,
    cancelled by another cancel included (one running at the same time too), is not
    cancelable."""
    task = find_task(call, req.id)
    if task.status in TERMINAL:
        raise TaskNotCancelableError(f"Task {task.id} is already {task.status}")
    try:
        cancelled = lifecycle.cancel(task.id, sole=True)
    except AlreadyFinal as exc:
        raise TaskNotCancelableError(f"Task {task.id} is already {exc.status}") from None
    except TaskNotFound:
        raise TaskNotFoundError(errors.refusal(TaskNotFound(req.id)).message) from None
    return call.present(cancelled)


# --- push notification configs ---------------------------------------------------------------


def create_push_config(
    call: Call, req: pb.TaskPushNotificationConfig
) -> pb.TaskPushNotificationConfig:
    task = find_task(call, req.task_id)
    push.check_url(req.url)
    push.check_fields(req)
    with transaction.atomic():
        row = push.store_config(task, req)
    return push.present(row)


def _config(call: Call, task_id: str, config_id: str) -> A2APushConfig:
    task = find_task(call, task_id)
    row = None
    if "\x00" not in config_id:  # no config has one, and the database cannot compare it
        row = A2APushConfig.objects.filter(task_id=task.id, config_id=config_id).first()
    if row is None:
        raise TaskNotFoundError(f"Push notification config not found: {config_id}")
    return row


def get_push_config(
    call: Call, req: pb.GetTaskPushNotificationConfigRequest
) -> pb.TaskPushNotificationConfig:
    return push.present(_config(call, req.task_id, req.id))


def list_push_configs(
    call: Call, req: pb.ListTaskPushNotificationConfigsRequest
) -> pb.ListTaskPushNotificationConfigsResponse:
    task = find_task(call, req.task_id)
    rows = A2APushConfig.objects.filter(task_id=task.id).order_by("created_at", "id")
    return pb.ListTaskPushNotificationConfigsResponse(configs=[push.present(r) for r in rows])


def delete_push_config(call: Call, req: pb.DeleteTaskPushNotificationConfigRequest) -> None:
    _config(call, req.task_id, req.id).delete()
