"""Deleting a conversation tree: mark it (no new work starts), then delete it in one transaction."""

from django.db import models, transaction
from django.db.models import Q
from django.utils import timezone

from ..models import Conversation, File, Task, Wakeup
from .locking import lock_conversation


def conversation_tree(root_id: str) -> list[str]:
    """Return the root and every hidden task conversation below it, over live edges only.

    A child is the conversation of a task spawned from the current conversation that is hidden
    and names the current conversation as its parent; anything else a task row says is ignored.
    """
    reached, frontier = [root_id], [root_id]
    seen = {root_id}
    while frontier:
        children = list(
            Task.objects.filter(
                parent_conversation_id__in=frontier,
                conversation__hidden=True,
                conversation__parent_id=models.F("parent_conversation_id"),
            ).values_list("conversation_id", flat=True)
        )
        frontier = [c for c in children if c not in seen]
        seen.update(frontier)
        reached.extend(frontier)
    return reached


def mark_deleting(root_id: str) -> list[str]:
    """Block new work on a conversation tree before it is stopped and deleted; return its ids."""
    with transaction.atomic():
        lock_conversation(root_id)
        tree = conversation_tree(root_id)
        Conversation.objects.filter(pk__in=tree, deleting_at__isnull=True).update(
            deleting_at=timezone.now()
        )
    return tree


def delete_tree(root_id: str) -> list[str]:
    """Delete a conversation tree in one transaction; return the storage names of its files."""
    with transaction.atomic():
        tree = conversation_tree(root_id)
        stored = list(
            File.objects.filter(conversation_id__in=tree).values_list("storage_name", flat=True)
        )
        Wakeup.objects.filter(
            Q(conversation_id__in=tree) | Q(task__conversation_id__in=tree)
        ).delete()
        Task.objects.filter(
            Q(conversation_id__in=tree) | Q(parent_conversation_id__in=tree)
        ).delete()
        Conversation.objects.filter(pk__in=tree).delete()
    return stored
