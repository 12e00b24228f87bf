"""Wake-up debt: the notification text, when a parent may be woken, and delivering what it is owed.

The debt and each change of its state are the store's (`store/debts.py`): written in the
transaction of the ending that owes it, consumed when the model pulled a result in-turn, delivered
when a wake-up turn carries every owed result of a conversation to its agent (`deliver_pending`
here decides when).

A conversation with no agent behind it (`agent == ""`: an MCP client's, docs/mcp.md) is never
woken, since no run could carry the results: its debt stays pending until its owner pulls it
(`owed`, then `lifecycle.take_owed` settles each as consumed).
"""

import logging

from django.db import transaction

from .. import ids, store
from ..broker import queue
from ..exceptions import ConversationNotFound, TaskNotFound
from ..models import Conversation, PendingAction, Run, Task, Wakeup
from ..states import TERMINAL, RunTrigger, TaskStatus, WakeupState, model_status
from ..text import go_quote, one_line

logger = logging.getLogger(__name__)

PREFIX = "[task-notification] "
RETRY_HINT = "(task_retry can resume a failed task from where it stopped)"
GUIDANCE = (
    "(These are reports from background agents, not requests from the person. Tell the person "
    "what happened. The work above is done — do not repeat or re-check it unless they ask.)"
)
TRUNCATION_MARKER = " [truncated — call task_status({id}) for the full result]"


def task_line(
    task_id: str, label: str, status: str, summary: str = "", truncated: bool = False
) -> str:
    """Render one task's line: a record consumers parse, so label and summary cannot break it."""
    line = f"Task {go_quote(one_line(label))} ({task_id}) {status}."
    if summary:
        line += f" Result: {one_line(summary)}"
    if truncated:
        line += TRUNCATION_MARKER.format(id=task_id)
    return line


def format_notification(items) -> str:
    """Build the wake-up message for items with task_id, label, status, summary and truncated."""
    lines = []
    failed = False
    for item in items:
        status = item.status if item.status in TERMINAL else model_status(item.status)
        failed = failed or status == TaskStatus.FAILED
        lines.append(task_line(item.task_id, item.label, status, item.summary, item.truncated))
    if failed:
        lines.append(RETRY_HINT)
    lines.append(GUIDANCE)
    return PREFIX + "\n".join(lines)


def may_wake(conversation: Conversation) -> bool:
    """Say whether a locked conversation may be woken now
    (docs/lifecycle.md#wake-up-debt-and-notifications).

    Not when it is being deleted, has a queued, running or paused run (its latest run paused on
    its own action or an escalated one included), or has an open approval or question.
    """
    if conversation.deleting_at is not None:
        return False
    if Run.objects.active().filter(conversation_id=conversation.id).exists():
        return False
    return not PendingAction.objects.open().filter(conversation_id=conversation.id).exists()


def schedule_delivery(conversation_id: str | None) -> None:
    """Attempt delivery to a conversation after the current transaction commits."""
    if conversation_id:
        queue.enqueue_job("agenttasks.delivery.wakeups.deliver_pending", conversation_id)


def deliver_pending(conversation_id: str) -> Run | None:
    """Start what an idle conversation has waiting: its oldest enqueued message, else a wake-up
    with every result it is owed (one event, one run, all in one commit)."""
    own_task = Task.objects.filter(conversation_id=conversation_id).only("id", "status").first()
    released = _release(conversation_id, own_task.id if own_task is not None else None)
    if released is not None:
        return released
    try:
        with transaction.atomic():
            if own_task is not None:
                run = _wake_task(own_task.id, conversation_id)
            else:
                run = _wake_conversation(conversation_id)
    except (Conversation.DoesNotExist, Task.DoesNotExist):
        return None
    except Exception:
        logger.exception("wakeups.deliver_failed conversation=%s", conversation_id)
        return None
    if run is not None:
        queue.launch_on_commit(run.id)
        logger.info("wakeups.delivered conversation=%s run=%s", conversation_id, run.id)
    return run


def _release(conversation_id: str, task_id: str | None) -> Run | None:
    """Start the oldest message waiting its turn in an idle conversation, or re-open the task
    on it (the `enqueue` strategy: docs/lifecycle.md#busy-conversations)."""
    try:
        if task_id is None:
            started = store.release_waiting(conversation_id)
            run = started[0] if started is not None else None
        else:
            task = store.release_task_waiting(task_id)
            run = task.run if task is not None else None
    except (ConversationNotFound, TaskNotFound):
        return None
    except Exception:
        logger.exception("wakeups.release_failed conversation=%s", conversation_id)
        return None
    if run is None:
        return None
    queue.launch_on_commit(run.id)
    logger.info("wakeups.released conversation=%s run=%s", conversation_id, run.id)
    return run


def has_agent(conversation: Conversation) -> bool:
    """Say whether an agent of ours is behind the conversation (a wake-up run could carry its debt)."""
    return bool(conversation.agent)


def owed(conversation_id: str) -> list[Wakeup]:
    """Return every pending wake-up owed to a conversation, oldest first."""
    return _owed(conversation_id)


def _owed(conversation_id: str) -> list[Wakeup]:
    return list(
        Wakeup.objects.filter(conversation_id=conversation_id, state=WakeupState.PENDING).order_by(
            "created_at", "id"
        )
    )


def _guard(conversation: Conversation) -> bool:
    try:
        return may_wake(conversation)
    except Exception:
        logger.exception("wakeups.guard_failed conversation=%s", conversation.id)
        return False


def _wake_conversation(conversation_id: str) -> Run | None:
    conversation = store.lock_conversation(conversation_id)
    if not has_agent(conversation):
        return None  # its owner pulls what it is owed: no run starts here
    if not _guard(conversation):
        return None
    owed = _owed(conversation_id)
    if not owed:
        return None
    run = store.wake_conversation(
        conversation, format_notification(owed), [w.task_id for w in owed]
    )
    store.mark_delivered(owed, run.id)
    return run


def _wake_task(task_id: str, conversation_id: str) -> Run | None:
    """Wake a task's own conversation (MAX_DEPTH above 1): its next run carries the results."""
    task = store.lock_task(task_id)
    if task.conversation.deleting_at is not None:
        return None
    owed = _owed(conversation_id)
    if not owed:
        return None
    if task.status == TaskStatus.CANCELLED:
        # A person stopped it: it is not revived, and what its children owed it is moot.
        store.drop_wakeups(owed)
        return None
    if task.status not in (TaskStatus.COMPLETED, TaskStatus.FAILED) or not _guard(
        task.conversation
    ):
        return None  # busy, or waiting on a person: the debt waits for its next ending
    text = format_notification(owed)
    run_id = ids.new_run_id()
    won = store.reopen(
        task_id,
        run_id,
        text,
        trigger=RunTrigger.WAKEUP,
        notification_task_ids=[w.task_id for w in owed],
    )
    if not won:
        return None
    store.mark_delivered(owed, run_id)
    return won.run
