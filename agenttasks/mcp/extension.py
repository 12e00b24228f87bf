"""MCP's tasks extension, `io.modelcontextprotocol/tasks` (SEP-2663; docs/mcp.md#the-tasks-extension).

On 2026-07-28, a `tools/call` of an agent's tool from a client that declares the extension on
that request (`_meta` → client capabilities → `extensions`) is answered with a
`CreateTaskResult` naming the agenttasks task, created before the answer is sent. The client
follows it with `tasks/get`, answers its questions and approvals with `tasks/update`, and stops
it with `tasks/cancel`. The task is the same one REST, A2A, the admin and `task_status` show.

- `tasks/get` maps the task: pending and running are `working`; waiting on an approval or a
  question is `input_required` with `inputRequests` (the form elicitations of its pending
  actions, keyed by action id; a legacy clarification's one free answer, keyed by its run, which
  `tasks/update` posts as a comment); an ending is `completed` with the tool's result (a failed agent's
  result has `isError`, as fastmcp-tasks ends a tool error), or `cancelled`.
- `tasks/update` applies the responses it carries before it is acknowledged, with REST's checks;
  a key that is unknown or already answered is ignored.
- `subscriptions/listen` with `notifications.taskIds` opens a stream of `notifications/tasks`,
  each the full task, sent on every status change of a listened task (read from the caller's
  conversation's log, where its tasks' `task.status` events are mirrored: a `Follower`).
- Another principal's task, like an unknown id, is INVALID_PARAMS; a `tasks/*` request from a
  client that did not declare the extension is MISSING_REQUIRED_CLIENT_CAPABILITY.
"""

import logging
from typing import Any

from mcp_types import ElicitResult
from mcp_types.jsonrpc import MISSING_REQUIRED_CLIENT_CAPABILITY
from pydantic import ValidationError

from .. import lifecycle
from ..conf import app_settings
from ..exceptions import AlreadyFinal, TaskError, TaskNotFound
from ..models import Conversation, PendingAction, Task
from ..runtime.base import release_connection
from ..states import TaskStatus
from ..toolkit.streams import Follower
from . import elicitation, protocol, tools
from .calls import Exchange, apply, outcome
from .sessions import Session
from .tools import TaskTools

logger = logging.getLogger(__name__)

EXTENSION = protocol.TASKS_EXTENSION
METHODS = ("tasks/get", "tasks/update", "tasks/cancel")
POLL_MS = 1000  # what a client is asked to wait between two tasks/get


class TaskCreated(dict):
    """A `tools/call` answered with a task: sent as it is (the version's wire types have no
    shape for it)."""


def missing() -> protocol.McpError:
    return protocol.McpError(
        MISSING_REQUIRED_CLIENT_CAPABILITY,
        f"This request targets the tasks extension ({EXTENSION}); the client did not declare "
        "it for this request.",
        {"requiredCapabilities": {"extensions": {EXTENSION: {}}}},
    )


def created(task: Task) -> TaskCreated:
    """The `CreateTaskResult` of an agent's call run as a task."""
    return TaskCreated({"resultType": "task", **fields(task)})


def fields(task: Task) -> dict[str, Any]:
    """The flat task fields every tasks-extension result carries."""
    info = lifecycle.info(task)
    out: dict[str, Any] = {
        "taskId": task.id,
        "status": status(task),
        "createdAt": task.created_at.isoformat(),
        "lastUpdatedAt": task.updated_at.isoformat(),
        # How long a finished task stays readable (the retention of finished conversations).
        "ttlMs": int(float(app_settings.RETENTION["finished_days"]) * 86_400_000),
        "pollIntervalMs": POLL_MS,
    }
    if info.progress:
        out["statusMessage"] = info.progress
    return out


def status(task: Task) -> str:
    if task.status == TaskStatus.WAITING_FOR_INPUT:
        return "input_required"
    if task.status == TaskStatus.CANCELLED:
        return "cancelled"
    if task.status in (TaskStatus.COMPLETED, TaskStatus.FAILED):
        return "completed"  # a failed agent's result is an error result, as a tool error is
    return "working"


def waiting(task: Task) -> list[PendingAction]:
    return list(
        PendingAction.objects.filter(pk__in=lifecycle.waiting_on(task)).order_by("created_at", "id")
    )


def input_requests(task: Task) -> dict:
    """The elicitations a waiting task asks for: one per pending action, by its id; or, for a
    legacy clarification (no actions: the agent's reply is its question), one free answer keyed
    by the run that asked (a new question is a new run, so keys stay unique)."""
    actions = waiting(task)
    if actions:
        return elicitation.input_requests(actions)
    schema = {
        "type": "object",
        "properties": {"answer": {"type": "string", "title": "Answer"}},
        "required": ["answer"],
    }
    params = {"mode": "form", "message": tools.question(task), "requestedSchema": schema}
    return {task.run_id: {"method": "elicitation/create", "params": params}}


def answer(session: Session, message: protocol.Message, name_header: str | None) -> dict:
    """Answer a `tasks/*` request: its result, shaped by hand (the version's wire types do not
    have these methods)."""
    if not session.modern:
        raise protocol.method_not_found(message.method)
    if not session.tasks:
        raise missing()
    task_id = message.params.get("taskId")
    if not isinstance(task_id, str) or not task_id:
        raise protocol.invalid_params("Invalid params: taskId must be a non-empty string")
    if name_header is not None and protocol.decode_header(name_header) != task_id:
        raise protocol.McpError(
            protocol.HEADER_MISMATCH,
            f"{protocol.NAME_HEADER} header does not match the request body's 'taskId' parameter",
        )
    try:
        task = TaskTools(session, message.id).owned(task_id)
    except TaskNotFound:
        raise protocol.invalid_params(f"Task not found: {task_id}") from None
    if message.method == "tasks/update":
        update(session, task, message.params.get("inputResponses"))
    elif message.method == "tasks/cancel":
        try:
            lifecycle.stop(task.id)
        except (AlreadyFinal, TaskError):
            pass  # cooperative: an ended task stays as it ended
    if message.method != "tasks/get":
        return {"resultType": "complete"}
    return get(session, Task.objects.select_related("run").get(pk=task.id))


def get(session: Session, task: Task) -> dict:
    """The `GetTaskResult` of a task: its fields, and its result, error or input requests."""
    out: dict[str, Any] = {"resultType": "complete", **fields(task)}
    if out["status"] == "input_required":
        out["inputRequests"] = input_requests(task)
    elif out["status"] == "completed":
        out["result"] = outcome(task, session.caller.mount_url)
    return out


def update(session: Session, task: Task, responses: Any) -> None:
    """Apply the responses of a `tasks/update`: each key an action the task waits on; a key
    that is unknown or answered already is ignored."""
    if not isinstance(responses, dict):
        raise protocol.invalid_params("Invalid params: inputResponses must be an object")
    if task.status == TaskStatus.WAITING_FOR_INPUT and task.run_id in responses:
        answer_clarification(session, task, responses[task.run_id])
    open_actions = {a.id: a for a in waiting(task)}
    replies = [
        (open_actions[key], elicitation.read_result(open_actions[key], response))
        for key, response in responses.items()
        if key in open_actions
    ]
    for action, reply in replies:
        if reply.body is not None:
            apply(action, reply.body, session)


def answer_clarification(session: Session, task: Task, response: Any) -> None:
    """Answer a legacy clarification with a comment, as REST does; a stale key is ignored."""
    try:
        parsed = ElicitResult.model_validate(response)
    except ValidationError:
        raise protocol.invalid_params(f"Not an elicitation result for {task.run_id}") from None
    text = (parsed.content or {}).get("answer")
    if parsed.action != elicitation.ACCEPT or not isinstance(text, str) or not text.strip():
        return  # declined or empty: the question stays open
    try:
        lifecycle.comment(task.id, text, author=session.caller.user, answering=task.run_id)
    except TaskError as exc:
        logger.info("mcp.clarification_refused task=%s: %s", task.id, exc)  # answered meanwhile


# --- notifications/tasks ---------------------------------------------------------------------


def listen(exchange: Exchange) -> "TaskListener":
    """Open a `subscriptions/listen` stream of the listened tasks' `notifications/tasks` (the
    ids the caller owns; others are left out of the acknowledgement, as unknown ones are)."""
    session, message = exchange.session, exchange.message
    wanted = (message.params.get("notifications") or {}).get("taskIds")
    if not session.tasks:
        raise missing()
    if not exchange.streaming:
        raise protocol.invalid_request("subscriptions/listen needs a stream (text/event-stream)")
    if not isinstance(wanted, list) or not all(isinstance(i, str) for i in wanted):
        raise protocol.invalid_params("Invalid params: notifications.taskIds must be a list of ids")
    owned = TaskTools(session, message.id)
    ids = []
    for task_id in wanted:
        try:
            ids.append(owned.owned(task_id).id)
        except TaskNotFound:
            continue
    return TaskListener(exchange, ids)


class TaskListener(Follower):
    """Send the full task on every status change of the tasks listened to."""

    def __init__(self, exchange: Exchange, task_ids: list[str]):
        super().__init__(exchange.held, exchange.client_fd)
        self.exchange, self.task_ids = exchange, task_ids
        self.conversation_id = exchange.session.conversation_id

    def opening(self) -> list[str]:
        self.last = (
            Conversation.objects.filter(pk=self.conversation_id)
            .values_list("last_seq", flat=True)
            .first()
            or 0
        )
        ack = {"notifications": {"taskIds": self.task_ids}}
        out = [self.notify("notifications/subscriptions/acknowledged", ack)]
        out += [self.task_frame(task_id) for task_id in self.task_ids]
        release_connection()
        return out

    def poll(self) -> str:
        try:
            changed = []
            for event in self.next_events(("task.status",)):
                self.last = event.seq
                if event.task_id in self.task_ids and event.task_id not in changed:
                    changed.append(event.task_id)
            return "".join(self.task_frame(task_id) for task_id in changed)
        finally:
            release_connection()

    def task_frame(self, task_id: str) -> str:
        task = Task.objects.select_related("run").get(pk=task_id)
        return self.notify("notifications/tasks", get(self.exchange.session, task))

    def notify(self, method: str, params: dict) -> str:
        return self.exchange.frame(protocol.notification(method, params))

    def failed(self, exc: Exception) -> str:
        logger.error("mcp.listen_failed conversation=%s", self.conversation_id, exc_info=exc)
        self.done = True
        return ""
