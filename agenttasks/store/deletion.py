"""Deleting a conversation tree: mark it (no new work starts), stop it, then delete it.

The mark is durable: a tree whose delete died halfway stays marked (hidden from every reader and
counted by no limit) until a repeated delete or the reaper's pass finishes it.
"""

from datetime import datetime

from django.db import models, transaction
from django.db.models import Q
from django.utils import timezone

from ..models import Conversation, File, Run, Task, Wakeup
from ..states import RunStatus, StopRequest
from .locking import lock_conversation, retried


def conversation_tree(root_id: str) -> list[str]:
    """Return the root and every hidden task conversation below it, over live edges only.

    A child is the conversation of a task spawned from the current conversation that is hidden
    and names the current conversation as its parent; anything else a task row says is ignored.
    """
    reached = [root_id]
    for level in Task.objects.tree_edges().only("conversation_id").levels_below([root_id]):
        reached.extend(task.conversation_id for task in level)
    return reached


@retried
def mark_deleting(root_id: str) -> list[str]:
    """Block new work on a conversation tree before it is stopped and deleted; return its ids."""
    with transaction.atomic():
        lock_conversation(root_id)
        tree = conversation_tree(root_id)
        Conversation.objects.visible().filter(pk__in=tree).update(deleting_at=timezone.now())
    return tree


def mark_expired(ids: list[str], now: datetime) -> set[str]:
    """Mark expired conversations deleting as of `now` (retention); return those the mark holds."""
    Conversation.objects.visible().filter(pk__in=ids).update(deleting_at=now)
    return set(
        Conversation.objects.filter(pk__in=ids, deleting_at=now).values_list("pk", flat=True)
    )


def release_marks(ids: list[str], now: datetime) -> None:
    """Take back the marks made as of `now` on conversations that work reached meanwhile."""
    Conversation.objects.filter(pk__in=ids, deleting_at=now).update(deleting_at=None)


@retried
def stop_runs(tree: list[str]) -> None:
    """Stop every run in a marked tree: running ones are told to stop now, the rest end."""
    now = timezone.now()
    with transaction.atomic():
        runs = Run.objects.unfinished().filter(conversation_id__in=tree)
        runs.filter(status=RunStatus.RUNNING).update(stop_request=StopRequest.NOW)
        runs.exclude(status=RunStatus.RUNNING).update(status=RunStatus.CANCELLED, ended_at=now)


def stored_files(tree: list[str]) -> list[str]:
    """Return the storage names of the files of a conversation tree."""
    return list(
        File.objects.filter(conversation_id__in=tree).values_list("storage_name", flat=True)
    )


def interrupted_deletes() -> list[str]:
    """Return the roots of marked trees whose delete has not finished (an interrupted delete)."""
    marked = Conversation.objects.being_deleted()
    # A marked tree's root: no parent, or a parent that is not marked itself.
    return list(
        marked.exclude(parent__in=Conversation.objects.being_deleted())
        .order_by("deleting_at")
        .values_list("id", flat=True)[:100]
    )


@retried
def delete_tree(root_id: str) -> None:
    """Delete a conversation tree's rows in one transaction, its locks taken in the store's order."""
    with transaction.atomic():
        tree = conversation_tree(root_id)
        tasks = Task.objects.filter(
            Q(conversation_id__in=tree) | Q(parent_conversation_id__in=tree)
        )
        _lock_for_delete(tasks, tree)
        Wakeup.objects.filter(
            Q(conversation_id__in=tree) | Q(task__conversation_id__in=tree)
        ).delete()
        tasks.delete()
        Conversation.objects.filter(pk__in=tree).delete()


def _lock_for_delete(tasks: models.QuerySet[Task], tree: list[str]) -> None:
    """Lock what a delete removes in the documented order, before it removes anything.

    Each task with its conversation and current run, children before parents (deepest first),
    then the tree's conversations (the root last of all): the order every transition takes, so a
    delete waits for an ending or a stop under way instead of deadlocking with it. FOR UPDATE,
    not FOR NO KEY UPDATE: the rows go, and a lock taken weaker would have to be raised later,
    past writers that took the key-share locks of their foreign keys meanwhile.
    """
    list(
        tasks.select_related("conversation", "run")
        .select_for_update(of=("self", "conversation", "run"))
        .order_by("-depth", "id")
        .only("id", "conversation__id", "run__id")
    )
    list(
        Conversation.objects.filter(pk__in=tree)
        .select_for_update()
        .order_by(models.F("parent_id").asc(nulls_last=True), "id")
        .values_list("id", flat=True)
    )
