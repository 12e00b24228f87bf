"""What every part of the lifecycle reads: a task's Python view, its progress line, refusals."""

import logging

from .. import registry
from ..conf import app_settings
from ..exceptions import TaskError
from ..models import Run, Task
from ..states import TaskKind
from ..types import ConversationRef, TaskInfo
from . import progress

logger = logging.getLogger(__name__)

DELEGATE = TaskKind.DELEGATE


def progress_line(task: Task, run: Run | None = None) -> str:
    """Render the progress of a task with its kind's DESCRIBE_STATE hook, or the default line."""
    try:
        hook = app_settings.hook("DESCRIBE_STATE", task.kind)  # "" is a plain task's kind
        run = run if run is not None else task.run
        state = run.progress if run is not None and run.progress is not None else task.state
        if state is None:
            return ""
        return str(hook(state) or "") if hook is not None else progress.default_line(state)
    except Exception:
        logger.exception("lifecycle.describe_failed task=%s", task.id)
        return ""


def info(task: Task, *, agent: str = "") -> TaskInfo:
    """Return the Python view of a task (stored status; `agent` defaults to its display name)."""
    return TaskInfo(
        task_id=task.id,
        run_id=task.run_id,
        label=task.label,
        kind=task.kind,
        agent=agent or agent_name(task.agent),
        status=task.status,
        attempt=task.attempt_no(),
        summary=task.summary,
        result=task.result,
        state=task.state,
        progress=progress_line(task),
    )


def conversation_id_of(conversation: ConversationRef) -> str:
    """Return the id of a conversation given as a row or as its id."""
    return conversation if isinstance(conversation, str) else conversation.pk


def agent_name(agent_id: str) -> str:
    """Return the registered agent's display name, or its id when it is no longer registered."""
    try:
        return registry.get(agent_id).name or agent_id
    except registry.UnknownAgent:
        return agent_id


def read(task_id: str) -> Task:
    """Return the task as stored now (TaskNotFound when there is none)."""
    return Task.objects.read(task_id)


def refuse(refusal: TaskError | None) -> None:
    """Raise the refusal a rule's check returned, if any."""
    if refusal is not None:
        raise refusal


def check_agent(agent_id: str) -> None:
    """Refuse an agent that is no longer registered (before a run of it is launched)."""
    registry.get(agent_id)
