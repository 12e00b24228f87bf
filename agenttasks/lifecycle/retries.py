"""Retrying a failed task as a new attempt, and the rule of who may be retried; automatic
retries by an agent's retry policy."""

import logging
import random
from datetime import datetime, timedelta

from django.utils import timezone

from .. import ids, registry, store
from ..conf import app_settings
from ..exceptions import LaunchFailed, NotRetryable, RetryConflict, RetryLimit, TaskError, TaskLimit
from ..models import Task
from ..operations import metrics
from ..states import OutcomeStatus, TaskStatus
from ..store import faults
from ..types import RunOutcome, TaskInfo
from .base import DELEGATE, check_agent, info, read, refuse
from .effects import announce, launch, launch_durable

logger = logging.getLogger(__name__)


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
        logger.warning("retries.not_started task=%s", task.id, exc_info=True)
        full = f"retry could not start: {faults.told(exc)}"
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


def retry_later(
    task: Task, run_id: str, outcome: RunOutcome, lease_cutoff: datetime | None = None
) -> bool:
    """Try a task again after its run failed for a passing reason, as its agent's retry policy
    allows (docs/lifecycle.md#automatic-retries); whether the next attempt was queued.
    `lease_cutoff`: the run is an orphan the reaper found silent since then."""
    if not outcome.retryable or task.kind == DELEGATE:
        return False
    try:
        policy = registry.get(task.agent).retry
    except registry.UnknownAgent:
        return False
    attempt = task.attempt_no()
    if attempt >= policy.max_attempts:
        return False
    delay = policy.delay(attempt, random.random())
    not_before = timezone.now() + timedelta(seconds=delay)
    new_run_id = ids.new_run_id()
    won = store.retry_later(task.id, run_id, new_run_id, outcome, not_before, lease_cutoff)
    if won is None:
        return False
    logger.info("lifecycle.retry_later task=%s attempt=%d in=%.1fs", task.id, attempt + 1, delay)
    metrics.count("agenttasks_task_retries_total", agent=task.agent)
    announce(won)
    launch_durable(new_run_id)
    return True


def retry_orphan(task_id: str, run_id: str, lease_cutoff: datetime) -> bool:
    """Queue the next attempt of a task whose worker died under its run, as its agent's retry
    policy allows; whether it did (if not, the reaper fails the task)."""
    orphan = RunOutcome(
        run_id, OutcomeStatus.FAILED, error=store.ORPHAN_TEXT, append_message=False, retryable=True
    )
    try:
        task = read(task_id)
    except TaskError:
        return False
    return retry_later(task, run_id, orphan, lease_cutoff)
