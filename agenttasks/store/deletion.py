"""Deleting a conversation tree: mark it (no new work starts), stop it, then delete it.

The mark is durable: a tree whose delete died halfway stays marked (hidden from every reader and
counted by no limit) until a repeated delete or the reaper's pass finishes it.
"""

from django.db import models, transaction
from django.db.models import Q
from django.utils import timezone

from ..models import Conversation, File, Run, Task, Wakeup
from ..states import RunStatus, StopRequest
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


def stop_runs(tree: list[str]) -> None:
    """Stop every run in a marked tree: running ones are told to stop now, the rest end."""
    now = timezone.now()
    with transaction.atomic():
        runs = Run.objects.active().filter(conversation_id__in=tree)
        runs.filter(status=RunStatus.RUNNING).update(stop_request=StopRequest.NOW)
        runs.exclude(status=RunStatus.RUNNING).update(status=RunStatus.CANCELLED, ended_at=now)


def stored_files(tree: list[str]) -> list[str]:
    """The storage names of the files of a conversation tree."""
    return list(
        File.objects.filter(conversation_id__in=tree).values_list("storage_name", flat=True)
    )


def interrupted_deletes() -> list[str]:
    """The roots of marked trees whose delete has not finished (an interrupted delete)."""
    marked = Conversation.objects.filter(deleting_at__isnull=False)
    return list(
        marked.filter(Q(parent__isnull=True) | Q(parent__deleting_at__isnull=True))
        .order_by("deleting_at")
        .values_list("id", flat=True)[:100]
    )


def delete_tree(root_id: str) -> None:
    """Delete a conversation tree's rows in one transaction."""
    with transaction.atomic():
        tree = conversation_tree(root_id)
        Wakeup.objects.filter(
            Q(conversation_id__in=tree) | Q(task__conversation_id__in=tree)
        ).delete()
        Task.objects.filter(
            Q(conversation_id__in=tree) | Q(parent_conversation_id__in=tree)
        ).delete()
        Conversation.objects.filter(pk__in=tree).delete()
