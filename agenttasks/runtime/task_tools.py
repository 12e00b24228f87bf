"""The four model tools: spawn_task, task_status, task_retry and task_stop.

Usable by any agent loop: `task_tools(conversation, run)` returns ToolSpecs with `name`,
`description`, `parameters` (an OpenAI function schema, strict), `schema()` and
`call(arguments, tool_call_id) -> ToolResult`. The conversation and the spawning run are bound
here, never taken from the model; a task id from another conversation reads as nonexistent.
"""

import dataclasses
import logging

from .. import lifecycle
from ..conf import app_settings
from ..exceptions import AlreadyFinal, NotRetryable, TaskBusy, TaskError, TaskNotFound
from ..lifecycle import priorities
from ..models import Task
from ..states import TERMINAL, TaskKind, model_status
from ..tools import ToolResult, ToolSpec
from ..types import TaskInfo

logger = logging.getLogger(__name__)

SPAWN_DESCRIPTION = (
    "Start a background task: another agent works on the input while you continue. Returns a "
    "task_id immediately. When the task finishes you are notified automatically in a later turn — "
    "after spawning, finish your reply and END YOUR TURN instead of polling. Only reach for "
    "task_status when the user explicitly asks for progress (use its wait_seconds rather than a "
    "polling loop); task_stop cancels."
)
STATUS_DESCRIPTION = (
    "Check a background task started with spawn_task. Statuses: working, input_required (waiting "
    "for a human approval), completed, failed, cancelled. For finished tasks the result field "
    "carries the FULL final output — the wake-up notification only shows a truncated summary. Set "
    "wait_seconds for one bounded wait instead of calling this in a loop. With no task_id it lists "
    "this conversation's tasks — the way back to an id you no longer have."
)
RETRY_DESCRIPTION = (
    "Resume a FAILED background task from where it stopped: same conversation, same progress, a "
    "new attempt. Prefer this over spawning a fresh task after a transient failure (a rate limit, "
    "a dropped connection) — a new task starts from nothing and pays again for everything this one "
    "already did. Only a failed task can be resumed, and only a limited number of times; when the "
    "failure is one a rerun cannot fix, spawn a new task instead."
)
STOP_DESCRIPTION = "Stop a background task started with spawn_task."


def _schema(properties: dict) -> dict:
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
    }


SPAWN_PARAMETERS = _schema(
    {
        "agent_name": {
            "type": "string",
            "description": "Agent to run the task with; empty uses the current agent",
        },
        "input": {"type": "string", "description": "The task prompt for the agent"},
        "label": {
            "type": "string",
            "description": "Short human-readable task label shown in the UI",
        },
    }
)
STATUS_PARAMETERS = _schema(
    {
        "task_id": {
            "type": "string",
            "description": "The id returned by spawn_task; empty lists every task of this conversation "
            "instead (newest first, summaries only)",
        },
        "wait_seconds": {
            "type": "integer",
            "description": "Block up to this many seconds for the task to finish before returning "
            "(0 = return immediately). Prefer one wait over repeated polling",
        },
    }
)
RETRY_PARAMETERS = _schema(
    {"task_id": {"type": "string", "description": "The id of the failed task to resume"}}
)
STOP_PARAMETERS = _schema(
    {
        "task_id": {"type": "string", "description": "The id returned by spawn_task"},
        "graceful": {
            "type": "boolean",
            "description": "Finish the current turn before stopping instead of aborting immediately",
        },
    }
)


def model_text(exc: BaseException) -> str:
    """Return what a refusal says to a model: its text with the model-facing status word."""
    if isinstance(exc, (NotRetryable, AlreadyFinal, TaskBusy)):
        return exc.text(model_status(exc.status))
    return str(exc)


def tool_error(exc_or_text) -> ToolResult:
    """Return a tool error: the refusal's model text verbatim, nothing else."""
    text = model_text(exc_or_text) if isinstance(exc_or_text, BaseException) else exc_or_text
    return ToolResult(str(text), is_error=True)


def describe(info: TaskInfo, progress: str | None = None) -> str:
    """Render the status card's text (no escaping)."""
    progress = info.progress if progress is None else progress
    lines = [f"task_id: {info.task_id}", f"status: {model_status(info.status)}"]
    if info.attempt > 1:
        lines.append(f"attempt: {info.attempt}")
    if info.label:
        lines.append(f"label: {info.label}")
    if info.kind:
        lines.append(f"kind: {info.kind}")
    if info.agent:
        lines.append(f"agent: {info.agent}")
    if progress:
        lines.append(f"progress: {progress}")
    result = info.result or info.summary
    if result:
        lines.append(f"result: {result}")
    return "\n".join(lines)


def unnamed(info: TaskInfo) -> TaskInfo:
    """Return the task without its agent: only a spawn result's card names the agent."""
    return dataclasses.replace(info, agent="")


def tool_result(info: TaskInfo, progress: str | None = None) -> ToolResult:
    """Return the status card of a task."""
    return ToolResult(
        describe(info, progress),
        display="task",
        details={
            "task_id": info.task_id,
            "task_label": info.label,
            "task_status": model_status(info.status),
            "task_agent": info.agent,
            "task_attempt": info.attempt,
            "task_result": info.result or info.summary,
        },
    )


def listing(infos: list[TaskInfo]) -> str:
    """Render a conversation's tasks, newest first, with summaries only."""
    if not infos:
        return "no tasks in this conversation"
    limit = app_settings.SUMMARY_LIMIT
    parts = [f"{len(infos)} task(s), newest first (task_status with the id fetches a full result):"]
    for info in infos:
        line = f"\n- {info.task_id}: {model_status(info.status)}"
        if info.kind:
            line += f" · {info.kind}"
        if info.label:
            line += f" · {info.label}"
        if info.attempt > 1:
            line += f" · attempt {info.attempt}"
        if info.progress:
            line += f" · {info.progress}"
        if info.summary:
            line += f" — {info.summary[:limit]}"
        if info.status not in TERMINAL:
            line += " (still working — do not redo its work; you will be told when it finishes)"
        parts.append(line)
    return "".join(parts)


class _Session:
    """The conversation and the run the four tools are bound to, and the tools' bodies."""

    def __init__(
        self, conversation_id: str | None, run=None, stop_check=None, priority: int | None = None
    ):
        self.conversation_id = conversation_id
        self.run = run
        self.stop_check = stop_check
        self.priority = priority

    def owned(self, task_id: str) -> Task:
        """Return the task when the bound conversation spawned it; otherwise it does not exist."""
        if not self.conversation_id:
            raise TaskError("task tools: no session in the run context")
        task = (
            Task.objects.filter(pk=task_id, parent_conversation_id=self.conversation_id)
            .exclude(kind=TaskKind.DELEGATE)
            .first()
        )
        if task is None:
            raise TaskNotFound(task_id)
        return task

    def spawn(self, ctx, args: dict) -> ToolResult:
        if not self.conversation_id:
            return tool_error("spawn_task: no session in the run context")
        try:
            info = lifecycle.spawn(
                self.conversation_id,
                args["agent_name"],
                args["input"],
                label=args["label"],
                tool_call_id=ctx.tool_call_id,
                parent_run=self.run,
                priority=self.priority,
            )
        except Exception as exc:
            return tool_error(exc)
        lifecycle.model_has_result(info)
        return tool_result(info)

    def status(self, ctx, args: dict) -> ToolResult:
        if not args["task_id"]:
            if not self.conversation_id:
                return tool_error("task_status: no session in the run context")
            return ToolResult(listing(lifecycle.list_tasks(self.conversation_id)))
        try:
            task = self.owned(args["task_id"])
            # The model waits for the task to finish (docs/lifecycle.md#task_status).
            info = lifecycle.status(
                task.id,
                wait=max(args["wait_seconds"], 0),
                stop_check=self.stop_check,
                settled=TERMINAL,
            )
        except Exception as exc:
            return tool_error(exc)
        lifecycle.model_has_result(info)
        return tool_result(unnamed(info))

    def retry(self, ctx, args: dict) -> ToolResult:
        try:
            task = self.owned(args["task_id"])
            info = lifecycle.retry(task.id)
        except Exception as exc:
            refused = getattr(exc, "info", None)
            if refused is None:
                return tool_error(exc)
            lifecycle.model_has_result(refused)
            card = tool_result(unnamed(refused))
            card.text = f"{model_text(exc)}\n{describe(unnamed(refused))}"
            card.is_error = True
            return card
        lifecycle.model_has_result(info)
        return tool_result(unnamed(info))

    def stop(self, ctx, args: dict) -> ToolResult:
        try:
            task = self.owned(args["task_id"])
            info = lifecycle.stop(task.id, graceful=args["graceful"])
        except AlreadyFinal as exc:
            card = tool_result(unnamed(exc.info))
            card.is_error = True  # news, not a failure to retry
            return card
        except Exception as exc:
            return tool_error(exc)
        return tool_result(unnamed(info))


def task_tools(
    conversation, run=None, *, stop_check=None, priority: int | None = None
) -> list[ToolSpec]:
    """Return spawn_task, task_status, task_retry and task_stop bound to a conversation and run.

    `priority` is the priority of the tasks spawn_task starts (by default the spawning task's,
    docs/lifecycle.md#when-a-task-starts).
    """
    if priority is not None:
        priorities.checked(priority)
    conversation_id = None if conversation is None else lifecycle.conversation_id_of(conversation)
    session = _Session(conversation_id, run, stop_check, priority)
    return [
        ToolSpec(name, description, parameters, body, strict=True)
        for name, description, parameters, body in (
            ("spawn_task", SPAWN_DESCRIPTION, SPAWN_PARAMETERS, session.spawn),
            ("task_status", STATUS_DESCRIPTION, STATUS_PARAMETERS, session.status),
            ("task_retry", RETRY_DESCRIPTION, RETRY_PARAMETERS, session.retry),
            ("task_stop", STOP_DESCRIPTION, STOP_PARAMETERS, session.stop),
        )
    ]


def spawn_tool(conversation, run=None, *, stop_check=None, priority: int | None = None) -> ToolSpec:
    """Return only spawn_task (`priority` as task_tools takes it)."""
    return task_tools(conversation, run, stop_check=stop_check, priority=priority)[0]


def control_tools(conversation, run=None, *, stop_check=None) -> list[ToolSpec]:
    """Return task_status, task_retry and task_stop, for a site that brings its own spawn tool."""
    return task_tools(conversation, run, stop_check=stop_check)[1:]


def attachable(conversation, task=None) -> bool:
    """Say whether a run on this conversation gets the tools: not a task's, or one below MAX_DEPTH.

    `task`, when the caller has it, is the task whose own conversation this is (no lookup).
    """
    if task is not None:
        return task.depth < app_settings.MAX_DEPTH
    try:
        meta = lifecycle.meta_for(conversation)
    except Exception:
        logger.warning(
            "task_tools.withheld conversation=%s",
            getattr(conversation, "pk", conversation),
            exc_info=True,
        )
        return False
    return meta is None or meta.depth < app_settings.MAX_DEPTH
