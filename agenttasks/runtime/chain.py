"""Delegation chains: the conversations above a delegate's, its depth, its callers' windows.

A run's context asks these lazily (most runs are not a delegate's); the `task` tool asks them
for every call. They read rows only: nothing here executes a run.
"""

from .. import registry
from ..conf import app_settings
from ..models import Run, Task
from ..states import TaskKind
from .budget import CallerLink, Window

DELEGATE = TaskKind.DELEGATE


def _caller_conversation(conversation_id: str) -> str | None:
    """The caller conversation of a delegate task's conversation (None at the top)."""
    return (
        Task.objects.filter(conversation_id=conversation_id, kind=DELEGATE)
        .values_list("parent_conversation_id", flat=True)
        .first()
    )


def path_of(conversation_id: str) -> list[str]:
    """The conversations from the top of the delegation chain down to this one."""
    path = [conversation_id]
    while True:
        parent = _caller_conversation(path[-1])
        if not parent or parent in path:
            return path[::-1]
        path.append(parent)


def depth_of(conversation_id: str) -> int:
    """The delegation depth of a run on this conversation (1 unless it is a delegate's)."""
    return len(path_of(conversation_id))


def detached_callers(ctx) -> list[CallerLink]:
    """The windows of a delegate's paused callers, from their recorded totals (nearest first).

    A child resumed by a worker while its callers are paused gets their remaining budget as its
    allowance; its spend reaches them when their replayed calls absorb it.
    """
    if ctx.task is None or ctx.task.kind != DELEGATE:
        return []
    links: list[CallerLink] = []
    caller = ctx.task.parent_conversation_id
    while caller and len(links) < int(app_settings.DELEGATION_MAX_DEPTH) + 1:
        run = Run.objects.filter(conversation_id=caller).order_by("-created_at", "-id").first()
        if run is None:
            break
        try:
            agent = registry.get(run.agent)
        except registry.UnknownAgent:
            agent = registry.AgentDef(id=run.agent)
        links.append(CallerLink(Window.for_run(run, agent)))
        caller = _caller_conversation(caller)
    return links
