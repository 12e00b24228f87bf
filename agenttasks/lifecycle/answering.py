"""What people send into a task: comments, messages, and answers to approvals and questions."""

from typing import Any

from django.db import transaction
from django.utils import timezone

from .. import ids, registry, store
from ..conf import app_settings
from ..exceptions import (
    ActionNotFound,
    ActionPending,
    ActionResolved,
    ConversationBusy,
    InvalidField,
    TaskBusy,
    TaskError,
)
from ..models import Comment, PendingAction, Run, Task
from ..states import ActionStatus, MultitaskStrategy, RunStatus, RunTrigger, TaskStatus
from ..store.busy_tasks import Sent
from ..types import Owner
from . import answers
from .base import DELEGATE, info, read, refuse
from .effects import announce, launch, launch_durable

# What a write that would start a run in a busy conversation or task may do instead
# (docs/lifecycle.md#busy-conversations).
STRATEGIES = tuple(MultitaskStrategy.values)


def comment(
    task_id: str,
    content: str,
    *,
    author: Owner = None,
    metadata: dict[str, Any] | None = None,
    origin: str = "comment",
    files: list[Any] | None = None,
    answering: str | None = None,
) -> Comment:
    """Add a user comment: it re-opens a finished task (or answers a clarification) on a new run.

    `origin="message"` is a message posted to the task's own conversation, refused while that
    conversation is busy. `answering` (a run id) makes it only the answer to the clarification
    that run asked. The comment comes back with `comment.task`, the task as it left it.
    """
    refusal = message_refusal if origin == "message" else comment_refusal
    task = read(task_id)
    refuse(refusal(task))
    run_id = ids.new_run_id()
    won = store.reopen(
        task.id,
        run_id,
        content,
        author=author,
        metadata=metadata,
        origin=origin,
        trigger=RunTrigger.MESSAGE if origin == "message" else RunTrigger.COMMENT,
        files=files,
        owner_limit=app_settings.MAX_ACTIVE_TASKS_PER_USER,
        answering=answering,
    )
    if not won:
        # Another writer moved the task between the check and the re-open: say what it is now.
        task = read(task_id)
        refuse(refusal(task))
        raise TaskBusy(task.status, task_id=task.id, info=info(task))
    launch_durable(run_id)
    announce(won)
    assert won.new_comment is not None  # a comment or message trigger records one
    return won.new_comment


def send_to_task(
    task_id: str,
    content: str,
    *,
    strategy: str = MultitaskStrategy.REJECT,
    author: Owner = None,
    metadata: dict[str, Any] | None = None,
    origin: str = "comment",
    files: list[Any] | None = None,
) -> Sent:
    """Comment on a task, or post to its conversation (`origin="message"`), under `strategy`.

    A task that can take it re-opens on a new run at once, whatever the strategy (`comment`).
    A busy one refuses it under `reject`; otherwise it waits its turn, stops the current run
    first, or steers it (docs/lifecycle.md#busy-tasks). A delegate task is its caller's to drive:
    always refused.
    """
    check_strategy(strategy)
    task = read(task_id)
    refusal = (message_refusal if origin == "message" else comment_refusal)(task)
    if refusal is None or strategy == MultitaskStrategy.REJECT or task.kind == DELEGATE:
        refuse(refusal)
        written = comment(
            task_id, content, author=author, metadata=metadata, origin=origin, files=files
        )
        return Sent(written.task, written.task.run, comment=written)
    agent = registry.get(task.agent)
    fallback = agent.steer_fallback
    if strategy == MultitaskStrategy.STEER and not agent.takes_steering:
        strategy = fallback
    try:
        with transaction.atomic():
            sent = store.send_to_busy_task(
                task_id,
                content,
                strategy=strategy,
                fallback=fallback,
                origin=origin,
                author_id=getattr(author, "pk", None),
                metadata=metadata,
                files=files,
            )
            if sent is not None and sent.comment is not None:
                announce(sent.task)
                launch_durable(sent.run.id)
            if strategy == MultitaskStrategy.ROLLBACK or fallback == MultitaskStrategy.ROLLBACK:
                from .recovery import forget_rolled_back  # recovery imports this module

                transaction.on_commit(lambda: forget_rolled_back(task.conversation_id))
    except ConversationBusy:
        refuse((message_refusal if origin == "message" else comment_refusal)(read(task_id)))
        raise
    if sent is None:  # it finished meanwhile: the comment re-opens it now
        written = comment(
            task_id, content, author=author, metadata=metadata, origin=origin, files=files
        )
        return Sent(written.task, written.task.run, comment=written)
    return sent


def check_strategy(strategy: str) -> None:
    """Refuse a multitask strategy that does not exist (InvalidField)."""
    if strategy not in STRATEGIES:
        names = ", ".join(STRATEGIES)
        raise InvalidField(f"multitaskStrategy must be one of {names}", "multitaskStrategy")


def waiting_on(task: Task) -> list[str]:
    """Return the pending actions a task waits on: its current run's, and those escalated to it."""
    return [
        action.id
        for action in store.pending_actions_below(task.conversation_id)
        if action.conversation_id != task.conversation_id or action.run_id == task.run_id
    ]


def comment_refusal(task: Task) -> TaskError | None:
    """Why a comment cannot re-open this task now (None: it can)."""
    if task.kind == DELEGATE or task.status in (TaskStatus.PENDING, TaskStatus.RUNNING):
        return TaskBusy(
            task.status, task_id=task.id, delegate=task.kind == DELEGATE, info=info(task)
        )
    if task.status == TaskStatus.WAITING_FOR_INPUT:
        actions = waiting_on(task)
        if actions or task.run.status == RunStatus.PAUSED:
            return ActionPending(actions, task_id=task.id, info=info(task))
    return None


def message_refusal(task: Task) -> TaskError | None:
    """Why a message to this task's own conversation cannot start a run now (None: it can)."""
    busy = store.conversation_busy(task.conversation_id)
    if busy is not None:
        return busy
    if task.status in (TaskStatus.PENDING, TaskStatus.RUNNING):
        return ConversationBusy(task.conversation_id, run_id=task.run_id)
    if task.kind == DELEGATE:
        return TaskBusy(task.status, task_id=task.id, delegate=True, info=info(task))
    return None


def resolve_as_person(action_id: str, resolution: dict[str, Any]) -> Task | None:
    """Apply a resolution a person gave (REST, the admin, A2A, MCP); return the task it left.

    Refused (ActionResolved) when the action is already settled, has expired (its timeout is
    applied now) or belongs to a run that is no longer current. None for a conversation's run.
    """
    action = PendingAction.objects.filter(pk=action_id).first()
    if action is None:
        raise ActionNotFound(action_id)
    refuse(answer_refusal(action))
    won = resolve(action_id, resolution)
    if not won:
        action.refresh_from_db()
        refuse(answer_refusal(action))
        raise ActionResolved.stale(action.id, action.status)
    return won if isinstance(won, Task) else None


def answer_refusal(action: PendingAction) -> TaskError | None:
    """Why a person cannot answer this action now (None: they can); a lapsed one expires now."""
    if action.status != ActionStatus.PENDING:
        return ActionResolved.settled(action.id, action.status)
    if action.task_id is not None:
        current = Task.objects.filter(pk=action.task_id, run_id=action.run_id).exists()
    else:
        current = Run.objects.filter(pk=action.run_id, status=RunStatus.PAUSED).exists()
    if not current:
        return ActionResolved.stale(action.id, action.status)
    if action.deadline is not None and action.deadline <= timezone.now():
        # The reaper would apply the timeout soon; an answer that comes late applies it now.
        expire_actions([action.id])
        action.refresh_from_db()
        return ActionResolved.expired(action.id, action.status, action.deadline)
    return None


def resolve_action(
    action: "PendingAction | str", answer: dict[str, Any], *, decided_by: Any = None
) -> Task | Run | None:
    """Answer an approval or a question with the REST answer body; resume its run if it was last.

    `action` is a PendingAction or its id; `answer` is `{"approved": bool, "comment"?: str}` for
    an approval or `{"answers": {...}}` for a question (docs/rest.md#approvals-and-questions).
    Anything else raises `answers.AnswerError` (a ValueError); an unknown id raises
    `ActionNotFound`. Returns the task as written (or the run, outside tasks), or None when the
    answer was stale.
    """
    action_id = action if isinstance(action, str) else action.pk
    row = PendingAction.objects.filter(pk=action_id).first()
    if row is None:
        raise ActionNotFound(action_id)
    resolution = answers.resolution(row, answer)
    if decided_by is not None:
        resolution["decided_by"] = decided_by
    return resolve(row.id, resolution)


def resolve(action_id: str, resolution: dict[str, Any]) -> Task | Run | None:
    """Apply a store resolution (`status` approved, denied, answered, expired, cancelled)."""
    action = PendingAction.objects.get(pk=action_id)
    if action.task_id is not None:
        won = store.answer(action.task_id, action.run_id, action_id, resolution)
        if won:
            announce(won)
            if won.status == TaskStatus.PENDING:
                launch(won.run_id)
        return won
    run = store.answer_conversation_run(action.run_id, action_id, resolution)
    if run and run.status == RunStatus.QUEUED:
        launch(run.id)
    return run


def expire_actions(action_ids: list[str] | None = None) -> list[str]:
    """Apply the timeout of every open action past its deadline; return the ids it settled."""
    settled = []
    for action in store.expired_actions(action_ids):
        won: Task | Run | None
        if action.on_timeout == "cancel" and action.task_id is not None:
            won = store.expire_and_cancel(action.task_id, action.run_id, action.id)
            if won:
                announce(won)
        else:
            won = resolve(action.id, {"status": ActionStatus.EXPIRED, "on_timeout": "deny"})
        if won:
            settled.append(action.id)
    return settled
