"""Escalation (docs/delegation.md#escalation): a delegate's action reaches every caller above it.

An action asked in a delegate child's conversation is listed by each conversation on its path
(the chain of callers down to the child's) and answerable through any of them.
"""

from .. import store
from ..models import PendingAction, Task
from ..states import TaskKind


def caller_conversation(conversation_id: str) -> str | None:
    """Return the caller conversation of a delegate task's conversation (None at the top)."""
    return (
        Task.objects.filter(conversation_id=conversation_id, kind=TaskKind.DELEGATE)
        .values_list("parent_conversation_id", flat=True)
        .first()
    )


def escalation_path(conversation_id: str) -> list[str]:
    """Return the conversations from the top of the delegation chain down to this one."""
    path = [conversation_id]
    while True:
        parent = caller_conversation(path[-1])
        if not parent or parent in path:
            return path[::-1]
        path.append(parent)


def pending_actions(conversation_id: str) -> list[tuple[PendingAction, list[str]]]:
    """Return a conversation's pending actions and those escalated to it, each with its path."""
    return [
        (action, escalation_path(action.conversation_id))
        for action in store.pending_actions_below(conversation_id)
    ]


def answerable_through(action: PendingAction, conversation_id: str) -> bool:
    """Say whether a person may answer `action` through `conversation_id` (on its path)."""
    return action.conversation_id == conversation_id or conversation_id in escalation_path(
        action.conversation_id
    )
