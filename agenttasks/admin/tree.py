"""A task's place in its tree: the chain of parents above it and every task below it."""

from collections import defaultdict
from itertools import islice

from ..models import Conversation, Task

MAX_LEVELS = 50  # a guard against a corrupt parent cycle, far above any MAX_DEPTH
MAX_DESCENDANTS = 500


def task_of(conversation: Conversation | None) -> Task | None:
    """Return the task whose own conversation this is (from the select_related cache), or None."""
    if conversation is None:
        return None
    try:
        return conversation.task
    except Task.DoesNotExist:
        return None


def ancestors(task: Task) -> list[tuple[Conversation, Task | None]]:
    """Return (conversation, its task or None) from the root down to the task's parent."""
    chain: list[tuple[Conversation, Task | None]] = []
    seen = {task.pk}
    conversation = task.parent_conversation
    while conversation is not None and len(chain) < MAX_LEVELS:
        parent = task_of(conversation)
        chain.append((conversation, parent))
        if parent is None or parent.pk in seen or not parent.parent_conversation_id:
            break
        seen.add(parent.pk)
        conversation = (
            Conversation.objects.select_related("task")
            .filter(pk=parent.parent_conversation_id)
            .first()
        )
    chain.reverse()
    return chain


def descendants(conversation_id: str) -> tuple[list[tuple[Task, int]], bool]:
    """Return every task below a conversation as (task, level) in tree order, and if cut short."""
    children = defaultdict(list)
    total = 0
    rows = Task.objects.order_by("created_at", "id").only(
        "id", "label", "agent", "kind", "status", "conversation_id", "parent_conversation_id"
    )
    for found in islice(rows.levels_below([conversation_id]), MAX_LEVELS):
        for row in found:
            children[row.parent_conversation_id].append(row)
        total += len(found)
        if total >= MAX_DESCENDANTS:
            break
    ordered: list[tuple[Task, int]] = []
    stack = [(child, 1) for child in reversed(children[conversation_id])]
    while stack:
        node, level = stack.pop()
        ordered.append((node, level))
        stack.extend((child, level + 1) for child in reversed(children[node.conversation_id]))
    return ordered, total >= MAX_DESCENDANTS
