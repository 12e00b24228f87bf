"""Conversations and the messages that start their runs, and progress reported by site code."""

import time
from collections.abc import Collection, Sequence
from typing import Any

from django.db import transaction

from .. import registry, store
from ..broker.listen import conversation_key, hub
from ..conf import app_settings
from ..delivery import wakeups
from ..exceptions import ConversationNotFound, RunNotFound, RunNotWaiting
from ..models import Conversation, Event, File, Run, Task
from ..states import RUN_ENDED, MultitaskStrategy, RunStatus, StopRequest
from ..store import files
from ..store.steering import STEER
from ..types import Owner
from .answering import check_strategy, send_to_task
from .base import progress_line
from .effects import launch_durable
from .recovery import forget_rolled_back


def record_progress(run_id: str, state: Any) -> None:
    """Record a run's progress state (tools, API, stream and admin show it rendered)."""
    run = Run.objects.select_related("task").filter(pk=run_id).first()
    if run is None:
        raise RunNotFound()
    rendered = progress_line(run.task, run=_with_progress(run, state)) if run.task else ""
    store.record_progress(run_id, state, rendered)


def _with_progress(run: Run, state: Any) -> Run:
    run.progress = state
    return run


def create_conversation(
    *, owner: Owner, agent_id: str, title: str = "", metadata: dict[str, Any] | None = None
) -> Conversation:
    """Create a visible conversation of an agent; its first message starts a run.

    `agent_id=""` leaves the agent to its first run (`adopt_agent`: a LangGraph thread).
    """
    if agent_id:
        registry.get(agent_id)
    return store.create_conversation(owner=owner, agent=agent_id, title=title, metadata=metadata)


def host_conversation(
    conversation_id: str,
    *,
    owner: Owner,
    title: str = "",
    metadata: dict[str, Any] | None = None,
) -> Conversation:
    """Return the conversation with no agent behind it that a host's tasks belong to, creating it.

    An MCP client's (docs/mcp.md): hidden, `agent` "", never woken (its owner pulls what its
    tasks' endings owe it: `take_owed`), and no message starts a run there. Another owner's
    conversation, or one being deleted, is ConversationNotFound.
    """
    conversation = store.host_conversation(
        conversation_id, owner=owner, title=title, metadata=metadata
    )
    owner_id = owner.pk if owner is not None else None
    if conversation.agent or conversation.owner_id != owner_id or conversation.deleting_at:
        raise ConversationNotFound(conversation_id)
    return conversation


def update_conversation(conversation_id: str, **changes: Any) -> Conversation:
    """Change a conversation's `title` and/or client `metadata` (see store.update_conversation)."""
    return store.update_conversation(conversation_id, **changes)


def post_message(
    conversation_id: str,
    content: str,
    *,
    author: Owner = None,
    metadata: dict[str, Any] | None = None,
    uploads: Sequence[files.Upload] = (),
    strategy: str = MultitaskStrategy.REJECT,
) -> tuple[Run, Event | None]:
    """Start a run of a conversation's agent on a user message; return the run and the message.

    On a task's own conversation the message is a comment (origin "message") that re-opens the
    task, under the same strategies (`answering.send_to_task`). `uploads` are checked against the agent's file policy, with the files the conversation
    already has (files.FileRefused), and stored as the conversation's files with the message.
    `strategy` says what a busy conversation does with it (docs/lifecycle.md#busy-conversations):
    `reject` refuses it (ConversationBusy; TaskBusy for a delegate task's); `enqueue` gives it a
    run that waits its turn (status `waiting`, and no message event until that run starts);
    `interrupt` and `rollback` stop what runs there first; `steer` hands it to the running run
    (returned with the `message.steer` event), or follows the agent's `steer_fallback`.
    Refused at the active-task limit too.
    """
    conversation = Conversation.objects.filter(pk=conversation_id).first()
    if conversation is None:
        raise ConversationNotFound(conversation_id)
    rules = files.policy(registry.get(conversation.agent)) if uploads else {}
    if uploads:
        existing = File.objects.filter(conversation_id=conversation_id).count()
        files.check(conversation.agent, rules, list(uploads), existing)
    task_id = (
        Task.objects.filter(conversation_id=conversation_id).values_list("id", flat=True).first()
    )
    check_strategy(strategy)
    fallback: str = MultitaskStrategy.REJECT
    if strategy == MultitaskStrategy.STEER and task_id is None:
        agent = registry.get(conversation.agent)
        fallback = agent.steer_fallback
        if not agent.takes_steering:
            strategy = fallback
    refs = [u.ref() for u in uploads] or None
    with files.kept_only_on_success() as written, transaction.atomic():
        if task_id is None:
            run, event = store.start_conversation_run(
                conversation_id,
                content,
                metadata=metadata,
                files=refs,
                owner_limit=app_settings.MAX_ACTIVE_TASKS_PER_USER,
                strategy=strategy,
                fallback=fallback,
            )
            steered = event is not None and event.type == STEER
            if run.status == RunStatus.QUEUED and not steered:
                launch_durable(run.id)
            if MultitaskStrategy.ROLLBACK in (strategy, fallback):  # the store may fall back
                transaction.on_commit(lambda: forget_rolled_back(conversation_id))
        else:
            sent = send_to_task(
                task_id,
                content,
                strategy=strategy,
                author=author,
                metadata=metadata,
                origin="message",
                files=refs,
            )
            run, event = sent.run, sent.event
            if sent.comment is not None and event is None:
                event = Event.objects.get(
                    conversation_id=conversation_id,
                    type="message.user",
                    data__commentId=sent.comment.id,
                )
        if uploads:
            files.save(
                uploads,
                conversation_id=conversation_id,
                owner=conversation.owner,
                rules=rules,
                written=written,
            )
    return run, event


def cancel_waiting(run_id: str) -> Run:
    """Cancel a message's run that waits its turn (`enqueue`); its message is never posted.

    RunNotFound for an unknown run; RunNotWaiting once it has started (cancel its task, or
    delete the conversation, to stop a run that started).
    """
    run = store.cancel_waiting(run_id)
    if run is None:
        raise RunNotWaiting(run_id)
    return run


def adopt_agent(conversation_id: str, agent_id: str) -> Conversation:
    """Give a conversation created without an agent the agent of its first run (its metadata
    gains `graph_id`); InvalidField when it has another agent already."""
    registry.get(agent_id)
    return store.adopt_agent(conversation_id, agent_id)


def stop_run(run_id: str, *, rollback: bool = False) -> Run | None:
    """Stop one unfinished run of a conversation without a task, as a newer message's
    `interrupt` (or `rollback`) stops it (docs/lifecycle.md#busy-conversations); None when it
    had ended. What waits behind it starts when it has ended."""
    request = StopRequest.ROLLBACK if rollback else StopRequest.INTERRUPT
    with transaction.atomic():
        run = store.stop_run(run_id, request)
        if run is not None:
            conversation_id = run.conversation_id
            if rollback:
                transaction.on_commit(lambda: forget_rolled_back(conversation_id))
            if run.status in RUN_ENDED:
                wakeups.schedule_delivery(conversation_id)
    return run


def wait_for_run(run_id: str, *, wait: float, settled: Collection[str]) -> Run:
    """Return the run once its status is in `settled`, or when `wait` seconds have passed
    (RunNotFound for an unknown one)."""
    deadline = time.monotonic() + max(float(wait), 0.0)
    row = Run.objects.filter(pk=run_id).only("conversation_id").first()
    if row is None:
        raise RunNotFound(run_id)
    with hub.subscribe(conversation_key(row.conversation_id)) as woken:
        while True:
            woken.clear()
            run = Run.objects.get(pk=run_id)
            left = deadline - time.monotonic()
            if run.status in settled or left <= 0:
                return run
            woken.wait(min(left, 0.5))


def copy_conversation(conversation_id: str, *, owner: Owner) -> Conversation:
    """Copy a conversation's transcript into a new conversation of `owner` (a LangGraph thread's
    copy); runs, actions and files are not copied."""
    return store.copy_conversation(conversation_id, owner=owner)


def delete_run(run_id: str) -> bool:
    """Delete an ended run of a conversation without a task (its record; what it wrote stays);
    False when it has not ended, or is a task's (a task keeps its runs)."""
    return store.delete_run(run_id)
