"""The reaper's pass, and deleting conversation trees (which it finishes when interrupted)."""

import logging
from typing import Any

from django.db import DatabaseError, transaction

from .. import store
from ..broker import queue
from ..conf import app_settings
from ..delivery import outbox as deliveries
from ..delivery import wakeups
from ..exceptions import StoreError, TaskError
from ..models import Conversation, Task
from ..states import RunStatus
from ..store.files import remove_now, remove_stored
from .answering import expire_actions
from .effects import announce
from .endings import on_run_finished
from .retries import retry_orphan
from .stopping import stop_tree

logger = logging.getLogger(__name__)


def recover() -> list[Task]:
    """Run one reaper pass: orphans, stuck endings, dead taskless runs, requeues, timeouts,
    deliveries."""
    try:
        orphans = store.fail_orphans(retried_instead=retry_orphan)
    except DatabaseError as exc:
        raise StoreError.failing_orphans(exc) from exc
    if orphans:
        logger.info("recover.orphans count=%d", len(orphans))
    for task in orphans:
        announce(task)
    for task, outcome in store.stuck_endings():
        try:
            on_run_finished(task.conversation_id, outcome)
        except TaskError:
            logger.info("recover.stuck_ending_gone task=%s", task.id)
    for conversation_id in store.fail_dead_conversation_runs():
        wakeups.schedule_delivery(conversation_id)
    for run_id in store.requeue_stale(queue.queued_runs(app_settings.REQUEUE_AFTER)):
        try:
            queue.enqueue_run(run_id)
        except Exception:
            logger.exception("recover.requeue_failed run=%s", run_id)
    expire_actions()
    deliveries.resend_overdue()
    for conversation_id in store.conversations_owed():
        wakeups.deliver_pending(conversation_id)
    for root in store.interrupted_deletes():
        try:
            delete_conversation(root)
        except Exception:
            logger.exception("recover.delete_failed conversation=%s", root)
    return orphans


def delete_conversation(conversation_id: str) -> None:
    """Stop and delete a conversation's whole tree, the bytes of its files included.

    The tree is marked first, so a delete that dies halfway is finished by calling this again (a
    repeated DELETE does, and so does the reaper). The bytes go before the rows, so none are
    ever left on disk without a row that leads to them; inside a caller's transaction they go
    when it commits.
    """
    tree = store.mark_deleting(conversation_id)
    stop_tree(conversation_id)  # its tasks end cancelled, with their events and callbacks
    store.stop_runs(tree)  # and whatever still runs there stops
    stored = store.stored_files(tree)
    if transaction.get_connection().in_atomic_block:
        remove_stored(stored)
    else:
        remove_now(stored)
    store.delete_tree(conversation_id)


def forget_rolled_back(conversation_id: str) -> None:
    """Delete the trees of the tasks that rolled-back runs of a conversation spawned (each stops
    first, as a tree stop does): a rollback leaves nothing of its run in the conversation."""
    children = Task.objects.filter(
        parent_run__conversation_id=conversation_id,
        parent_run__status=RunStatus.ROLLED_BACK,
        conversation__deleting_at__isnull=True,
    ).values_list("conversation_id", flat=True)
    for child in list(children):
        try:
            delete_conversation(child)
        except Exception:
            logger.exception("recover.forget_failed conversation=%s", child)


def delete_owned_by(user: Any) -> None:
    """Delete every conversation tree a user owns, stopping their work (before the user goes)."""
    roots = Conversation.objects.filter(owner=user, parent__isnull=True).values_list(
        "id", flat=True
    )
    for conversation_id in list(roots):
        delete_conversation(conversation_id)
