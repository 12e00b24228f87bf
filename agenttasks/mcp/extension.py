"""MCP's tasks extension, `io.modelcontextprotocol/tasks` (SEP-2663; docs/mcp.md#the-tasks-extension).

On 2026-07-28, a `tools/call` of an agent's tool from a client that declares the extension on
that request (`_meta` → client capabilities → `extensions`) is answered with a
`CreateTaskResult` naming the agenttasks task, created before the answer is sent. The client
follows it with `tasks/get`, answers its questions and approvals with `tasks/update`, and stops
it with `tasks/cancel`. The task is the same one REST, A2A, the admin and `task_status` show.

- `tasks/get` maps the task: pending and running are `working`; waiting on an approval or a
  question is `input_required` with `inputRequests` (the form elicitations of its pending
  actions, keyed by action id); an ending is `completed` with the tool's result (a failed agent's
  result has `isError`, as fastmcp-tasks ends a tool error), or `cancelled`.
- `tasks/update` applies the responses it carries before it is acknowledged, with REST's checks;
  a key that is unknown or already answered is ignored.
- Another principal's task, like an unknown id, is INVALID_PARAMS; a `tasks/*` request from a
  client that did not declare the extension is MISSING_REQUIRED_CLIENT_CAPABILITY.
"""

from typing import Any

from mcp_types.jsonrpc import MISSING_REQUIRED_CLIENT_CAPABILITY

from .. import lifecycle
from ..conf import app_settings
from ..exceptions import AlreadyFinal, TaskError, TaskNotFound
from ..models import PendingAction, Task
from ..states import TaskStatus
from . import elicitation, protocol
from .calls import apply, outcome
from .sessions import Session
from .tools import TaskTools

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
    if task.status == TaskStatus.WAITING_FOR_INPUT and waiting(task):
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
        out["inputRequests"] = elicitation.input_requests(waiting(task))
    elif out["status"] == "completed":
        out["result"] = outcome(task, session.caller.mount_url)
    return out


def update(session: Session, task: Task, responses: Any) -> None:
    """Apply the responses of a `tasks/update`: each key an action the task waits on; a key
    that is unknown or answered already is ignored."""
    if not isinstance(responses, dict):
        raise protocol.invalid_params("Invalid params: inputResponses must be an object")
    open_actions = {a.id: a for a in waiting(task)}
    replies = [
        (open_actions[key], elicitation.read_result(open_actions[key], response))
        for key, response in responses.items()
        if key in open_actions
    ]
    for action, reply in replies:
        if reply.body is not None:
            apply(action, reply.body, session)
