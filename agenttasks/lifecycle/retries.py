"""Retrying a failed task as a new attempt, and the rule of who may be retried."""

from .. import ids, store
from ..conf import app_settings
from ..exceptions import LaunchFailed, NotRetryable, RetryConflict, RetryLimit, TaskError, TaskLimit
from ..models import Task
from ..states import TaskStatus
from ..types import TaskInfo
from .base import DELEGATE, check_agent, info, read, refuse
from .effects import announce, launch


def retry(task_id: str) -> TaskInfo:
    """Resume a failed task on its own conversation as a new attempt; return it as it is now."""
    retry_task(task_id)
    return info(read(task_id))


def retry_task(task_id: str) -> Task:
    """Retry a failed task; return it as the retry wrote it (before a worker could move it)."""
    task = read(task_id)
    refuse(retry_refusal(task))
    run_id = ids.new_run_id()
    cap = app_settings.MAX_CONCURRENT_PER_PARENT
    won = store.retry_claim(
        task.id,
        run_id,
        app_settings.MAX_ATTEMPTS,
        cap,
        owner_limit=app_settings.MAX_ACTIVE_TASKS_PER_USER,
    )
    if not won:
        task = read(task_id)
        refuse(retry_refusal(task))
        if task.parent_conversation_id and store.live_count(task.parent_conversation_id) >= cap:
            raise TaskLimit(cap, info=info(task))
        raise RetryConflict(info=info(task))
    try:
        check_agent(won.agent)
        launch(run_id)
    except Exception as exc:
        full = f"retry could not start: {exc}"
        released = store.release_retry_claim(
            task.id, run_id, full[: app_settings.SUMMARY_LIMIT], full
        )
        if released:
            announce(released)
        raise LaunchFailed.retry(exc, info=info(read(task_id))) from exc
    announce(won)
    return won


def retry_refusal(task: Task) -> TaskError | None:
    """Why this task cannot be retried now (None: it can): a delegate, not failed, or spent."""
    if task.kind == DELEGATE or task.status != TaskStatus.FAILED:
        return NotRetryable(
            task.status, task_id=task.id, delegate=task.kind == DELEGATE, info=info(task)
        )
    limit = app_settings.MAX_ATTEMPTS
    if task.attempt_no() >= limit:
        return RetryLimit(limit, task_id=task.id, attempt=task.attempt_no(), info=info(task))
    return None
