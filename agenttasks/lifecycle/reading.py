"""Reading tasks: status (waiting for a task to settle), listings, and a conversation's task."""

import time
from collections.abc import Callable, Collection

from django.db import DatabaseError

from ..broker.listen import hub, task_key
from ..conf import app_settings
from ..exceptions import SpawnError
from ..models import Task
from ..states import TERMINAL, TaskStatus
from ..types import ConversationRef, TaskInfo, TaskMeta
from .base import DELEGATE, conversation_id_of, info, read

STATUS_POLL = 0.25
SETTLED = TERMINAL | {TaskStatus.WAITING_FOR_INPUT}


def meta_for(conversation: ConversationRef) -> TaskMeta | None:
    """Return the task whose own conversation this is, or None; a lookup failure raises."""
    conversation_id = conversation_id_of(conversation)
    try:
        row = (
            Task.objects.filter(conversation_id=conversation_id)
            .values("id", "label", "parent_conversation_id", "depth", "priority")
            .first()
        )
    except DatabaseError as exc:
        raise SpawnError.looking_up(str(conversation_id), exc) from exc
    if row is None:
        return None
    return TaskMeta(
        row["id"], row["label"], row["parent_conversation_id"], row["depth"], row["priority"]
    )


def status(
    task_id: str,
    *,
    wait: float = 0,
    stop_check: Callable[[], bool] | None = None,
    settled: Collection[str] = SETTLED,
) -> TaskInfo:
    """Read a task, waiting up to `wait` seconds (clamped to MAX_STATUS_WAIT) for it to settle.

    Settled is terminal or waiting for input (as REST's /wait), unless `settled` says otherwise.
    """
    return info(wait_for(task_id, wait=wait, stop_check=stop_check, settled=settled))


def wait_for(
    task_id: str,
    *,
    wait: float = 0,
    stop_check: Callable[[], bool] | None = None,
    settled: Collection[str] = TERMINAL,
) -> Task:
    """Return the task once its status is in `settled`, or when the wait runs out."""
    wait = min(max(float(wait or 0), 0.0), float(app_settings.MAX_STATUS_WAIT))
    deadline = time.monotonic() + wait
    with hub.subscribe(task_key(task_id)) as woken:
        while True:
            task = read(task_id)
            remaining = deadline - time.monotonic()
            if task.status in settled or remaining <= 0:
                return task
            if stop_check is not None and stop_check():
                return task
            woken.wait(min(remaining, STATUS_POLL))
            woken.clear()


def list_tasks(conversation: ConversationRef) -> list[TaskInfo]:
    """Return every task spawned from the conversation (delegates excluded), newest first."""
    conversation_id = conversation_id_of(conversation)
    tasks = (
        Task.objects.filter(parent_conversation_id=conversation_id)
        .exclude(kind=DELEGATE)
        .select_related("run")
        .order_by("-created_at", "-id")
    )
    return [info(t) for t in tasks]
