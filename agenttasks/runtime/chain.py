"""Delegation chains: the conversations above a delegate's, its depth, its callers' windows.

A run's context asks these lazily (most runs are not a delegate's); the `task` tool asks them
for every call. They read rows only: nothing here executes a run.
"""

from .. import registry
from ..conf import app_settings
from ..lifecycle.escalation import caller_conversation, escalation_path
from ..models import Run
from ..states import TaskKind
from .budget import CallerLink, Window

DELEGATE = TaskKind.DELEGATE


def depth_of(conversation_id: str) -> int:
    """Return the delegation depth of a run on this conversation (1 unless it is a delegate's)."""
    return len(escalation_path(conversation_id))


def detached_callers(ctx) -> list[CallerLink]:
    """Return the windows of a delegate's paused callers, from their recorded totals (nearest
    first).

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
        caller = caller_conversation(caller)
    return links
