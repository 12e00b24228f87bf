"""What follows a won write: one announcer after commit, launching runs, resuming a caller."""

import logging

from django.db import DatabaseError, transaction

from .. import signals, store
from ..broker import queue
from ..broker.listen import hub, task_key
from ..conf import app_settings
from ..delivery import callbacks, wakeups
from ..exceptions import TaskError
from ..models import Task
from ..states import TERMINAL, RunStatus, TaskStatus
from .base import DELEGATE

logger = logging.getLogger(__name__)


def announce(task: Task) -> None:
    """Announce a won write after commit, from the task as written (every winning write).

    Waiters wake and `task_updated` is sent; an ending also sends `task_finished` (or, for a
    cancellation, `result_delivered`), its callback, and the delivery of the result it owes; a
    pause sends its callback and lets a caller waiting on escalations resume.
    """
    transaction.on_commit(lambda: hub.publish(task_key(task.id)))
    transaction.on_commit(lambda: signals.task_updated.send(sender=Task, task=task))
    if task.status in TERMINAL:
        signal = (
            signals.result_delivered
            if task.status == TaskStatus.CANCELLED
            else signals.task_finished
        )
        transaction.on_commit(lambda: signal.send(sender=Task, snapshot=task))
        callbacks.schedule(task, task.status)
        if task.status != TaskStatus.CANCELLED and task.kind != DELEGATE:
            wakeups.schedule_delivery(task.parent_conversation_id)  # the debt this ending wrote
        if task.kind == DELEGATE:
            # A caller paused on this child may now resume (docs/delegation.md#resuming-a-paused-caller).
            transaction.on_commit(lambda: resume_if_settled(task.parent_conversation_id))
        own_run_boundary(task)
    elif task.status == TaskStatus.WAITING_FOR_INPUT:
        callbacks.schedule(task, task.status)
        if task.run.status != RunStatus.PAUSED and _messages_wait(task):
            wakeups.schedule_delivery(task.conversation_id)  # a waiting message answers it
        # A child may have settled between its escalation and this pause: check once after it.
        transaction.on_commit(lambda: resume_if_settled(task.conversation_id))


def own_run_boundary(task: Task) -> None:
    """Deliver what a task's own conversation is owed: the results of its children (only a task
    that may spawn has any), and the messages that wait to re-open it (docs/lifecycle.md#busy-tasks)."""
    if app_settings.MAX_DEPTH > 1 or _messages_wait(task):
        wakeups.schedule_delivery(task.conversation_id)


def _messages_wait(task: Task) -> bool:
    """Say whether messages wait to re-open a task: as its ending read it, else asked now."""
    known = task.messages_wait_at_end
    return store.messages_wait(task.id) if known is None else known


def launch(run_id: str) -> None:
    """Enqueue a run after commit; outside a transaction an enqueue failure raises here."""
    queue.launch_on_commit(run_id)


def launch_durable(run_id: str) -> None:
    """Launch a run whose queued row is committed: a failure is logged, not raised.

    Nothing is lost: the reaper enqueues a run queued longer than REQUEUE_AFTER again.
    """
    try:
        launch(run_id)
    except Exception:
        logger.exception(
            "lifecycle.launch_failed run=%s (the reaper will enqueue it again)", run_id
        )


def resume_if_settled(conversation_id: str | None) -> None:
    """Resume the conversation's paused run if its own actions and escalated children settled.

    Checked after an escalating run pauses and after a delegate task ends (docs/delegation.md#resuming-a-paused-caller);
    the store's compare-and-set makes a losing or premature check do nothing.
    """
    if not conversation_id:
        return
    try:
        won = store.resume_paused(conversation_id)
    except (TaskError, DatabaseError):
        logger.exception("delegation.resume_failed conversation=%s", conversation_id)
        return
    if won is None:
        return
    logger.info("delegation.resume_caller run=%s conversation=%s", won.id, conversation_id)
    if won.task is not None:
        announce(won.task)
    launch_durable(won.id)
