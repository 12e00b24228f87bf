"""Starting tasks: `create` (REST and site code) and `spawn` (a model's background task)."""

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from django.db import DatabaseError, transaction

from .. import ids, registry, store
from ..broker import queue
from ..conf import app_settings
from ..delivery import callbacks
from ..exceptions import (
    ActiveTaskLimit,
    ConversationNotFound,
    DepthLimit,
    LaunchFailed,
    SpawnError,
    TaskLimit,
)
from ..models import Conversation, Run, Task
from ..states import TaskKind
from ..store import faults, files
from ..types import ConversationRef, NewTask, Owner, TaskInfo, default_label
from .base import info, read
from .effects import announce, launch, launch_durable
from .reading import meta_for


def create(
    *,
    owner: Owner,
    agent_id: str,
    input: str,
    label: str = "",
    kind: str = "",
    state: Any = None,
    callback_url: str | None = None,
    metadata: dict[str, Any] | None = None,
    uploads: Sequence[files.Upload] = (),
    before_commit: Callable[[Task], None] | None = None,
    not_before: datetime | None = None,
    priority: int = 0,
    schedule_id: str | None = None,
) -> Task:
    """Create a task from REST or site code: a visible conversation, depth 1, no parent.

    `not_before` delays its start (the task is pending, its run queued until then; a time
    already past starts it now); `priority` puts it before lower ones of its owner and of
    others whose share is the same (docs/lifecycle.md#when-a-task-starts).

    Refused in the order of docs/rest.md#creating-a-task: an unknown agent (UnknownAgent), a
    file its policy refuses (files.FileRefused), a callback address that is not public
    (callbacks.CallbackURLError), then the active-task limit. `uploads` are stored as the
    task's files and `before_commit(task)` runs, both inside the creating transaction; the bytes
    of a transaction that fails are removed.
    """
    agent = registry.get(agent_id)
    rules = files.policy(agent)
    files.check(agent_id, rules, list(uploads))
    if callback_url:
        callbacks.check_syntax(callback_url)
        callbacks.check_address(callback_url)
    run_id = ids.new_run_id()
    new = NewTask(
        owner=owner,
        agent=agent_id,
        input=input,
        label=label or default_label(" ".join(input.split())),  # REST's: whitespace collapsed
        kind=kind,
        state=state,
        inherit=agent.snapshot(),
        callback_url=callback_url or "",
        metadata=metadata or {},
        files=[u.ref() for u in uploads],
        run_id=run_id,
        not_before=not_before,
        priority=priority,
        schedule_id=schedule_id,
    )
    # Listening workers are told in the creating transaction; else the first run's job commits
    # with the task when the broker is this database.
    notify = queue.workers_listen()
    job = None if notify else queue.job_row(run_id)
    limit = app_settings.MAX_ACTIVE_TASKS_PER_USER
    if not uploads and before_commit is None:
        task = store.create_task(new, owner_limit=limit, job=job, notify=notify)
    else:
        with files.kept_only_on_success() as written, transaction.atomic():
            task = store.create_task(new, owner_limit=limit, job=job, notify=notify)
            if uploads:
                files.save(
                    uploads,
                    conversation_id=task.conversation_id,
                    owner=owner,
                    rules=rules,
                    task_id=task.id,
                    written=written,
                )
            if before_commit is not None:
                before_commit(task)
    if job is None and not notify:
        launch_durable(run_id)
    announce(task)
    return task


def spawn(
    parent: "ConversationRef | None",
    agent_name: str,
    input: str,
    *,
    label: str = "",
    kind: str = "",
    state: Any = None,
    tool_call_id: str = "",
    parent_run: Run | None = None,
    metadata: dict[str, Any] | None = None,
    not_before: datetime | None = None,
    priority: int | None = None,
) -> TaskInfo:
    """Start a background task from a model's conversation; returns at once.

    `metadata` is the task's, as REST's create takes it (an MCP client's agent call passes it);
    `not_before` and `priority` are `create`'s. Without a `priority` the task takes the priority
    of the task spawning it (0 from a conversation of no task): its work is that task's.
    """
    if parent is None:
        raise SpawnError.no_parent()
    meta = meta_for(parent)
    depth = 1
    if priority is None:
        priority = meta.priority if meta is not None else 0
    if meta is not None:
        depth = meta.depth + 1
        if depth > app_settings.MAX_DEPTH:
            raise DepthLimit(meta.depth)
    label = label or default_label(input)
    if not isinstance(parent, Conversation):
        parent = Conversation.objects.get(pk=parent)
    agent_id = agent_name or (parent_run.agent if parent_run is not None else parent.agent)
    try:
        agent = registry.get(agent_id)
    except registry.UnknownAgent as exc:
        raise SpawnError.resolving_agent(agent_id, exc) from exc
    run_id = ids.new_run_id()
    new = NewTask(
        parent_conversation_id=parent.pk,
        owner=parent.owner,
        agent=agent_id,
        input=input,
        label=label,
        kind=kind,
        state=state,
        inherit=agent.snapshot(),
        depth=depth,
        parent_run_id=parent_run.pk if parent_run is not None else None,
        tool_call_id=tool_call_id,
        metadata=metadata or {},
        run_id=run_id,
        not_before=not_before,
        priority=priority,
    )
    notify = queue.workers_listen()
    job = None if notify else queue.job_row(run_id)
    try:
        task = store.create_task(
            new,
            parent_cap=app_settings.MAX_CONCURRENT_PER_PARENT,
            owner_limit=app_settings.MAX_ACTIVE_TASKS_PER_USER,
            job=job,
            notify=notify,
        )
    except (TaskLimit, ActiveTaskLimit, ConversationNotFound):
        raise
    except DatabaseError as exc:
        raise SpawnError.creating_task(exc) from exc
    if job is None and not notify:
        try:
            launch(run_id)
        except Exception as exc:
            store.discard_spawn(task.id, f"could not start: {faults.told(exc)}")
            raise LaunchFailed.spawn(exc) from exc
        task = read(task.id)  # the run may have moved on while it was being enqueued
    announce(task)
    return info(task, agent=agent.name)


def delegate(
    *,
    conversation_id: str,
    run_id: str,
    owner: Owner,
    definition: registry.AgentDef,
    prompt: str,
    depth: int,
    key: str,
    call_id: str,
) -> Task:
    """Create a `task` call's child (its hidden conversation and first run) and `task.delegated`.

    Both commit at once, in the caller's conversation (docs/delegation.md); the caller runs the
    child inline, so nothing is launched here.
    """
    with transaction.atomic():
        child = store.create_task(
            NewTask(
                parent_conversation_id=conversation_id,
                owner=owner,
                agent=definition.id,
                input=prompt,
                kind=TaskKind.DELEGATE,
                inherit=definition.snapshot(),
                depth=depth,
                parent_run_id=run_id,
                tool_call_id=call_id,
                delegation_key=key,
            )
        )
        data = {
            "taskId": child.id,
            "agent": definition.id,
            "toolCallId": call_id,
            "runId": run_id,
            "conversationId": child.conversation_id,
        }
        store.append_events(conversation_id, [("task.delegated", data, run_id, child.id)])
    return child
