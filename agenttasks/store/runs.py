"""Conversations and their runs without a task: messages, answers, resumes, wake-ups, stops.

A run without a task is guarded by its conversation's row, locked before the run's.
"""

from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from .. import ids
from ..exceptions import ConversationBusy, ConversationNotFound, InvalidField
from ..models import RESERVED_METADATA, Conversation, Event, PendingAction, Run, Task
from ..models.action import PendingActionQuerySet
from ..states import (
    RUN_ENDED,
    RUN_UNFINISHED,
    ActionStatus,
    MultitaskStrategy,
    RunStatus,
    RunTrigger,
    StopRequest,
    TaskKind,
    TaskStatus,
)
from .limits import check_active_limit
from .locking import (
    Log,
    hold_task,
    lock_conversation,
    lock_open_action,
    lock_run,
    lock_task,
    retried,
    run_finished,
    user_message_data,
)
from .rollbacks import roll_back
from .rows import cancel_open_actions, requeue_paused, resolve_action
from .steering import leave_untaken, steer

_UNSET = object()


def create_conversation(
    *, owner: Any, agent: str, title: str = "", metadata: dict[str, Any] | None = None
) -> Conversation:
    """Create a visible conversation (no run starts; its first message does that)."""
    return Conversation.objects.create(
        owner=owner, agent=agent, title=title or "", metadata=metadata or {}
    )


def host_conversation(
    conversation_id: str, *, owner: Any, title: str = "", metadata: dict[str, Any] | None = None
) -> Conversation:
    """Return the conversation with no agent behind it named `conversation_id`, creating it.

    It is hidden (no listing shows it) and its `agent` is "" (docs/lifecycle.md#wake-up-debt-and-notifications).
    Two creators of one id race on the primary key: the loser reads the winner's row.
    """
    found = Conversation.objects.filter(pk=conversation_id).first()
    if found is not None:
        return found
    try:
        with transaction.atomic():
            return Conversation.objects.create(
                id=conversation_id,
                owner=owner,
                agent="",
                title=title or "",
                metadata=metadata or {},
                hidden=True,
            )
    except IntegrityError:
        return Conversation.objects.get(pk=conversation_id)


@retried
def update_conversation(
    conversation_id: str, *, title: Any = _UNSET, metadata: Any = _UNSET
) -> Conversation:
    """Change a conversation's title or client metadata under its row lock.

    `title=""` removes the title. New metadata replaces the client's as a whole; the server's
    `source` and `taskId` (a task's conversation) are kept whatever it says.
    """
    with transaction.atomic():
        conversation = lock_conversation(conversation_id)
        if conversation.deleting_at is not None:
            raise ConversationNotFound(conversation_id)
        fields = []
        if title is not _UNSET and (title or "") != conversation.title:
            conversation.title = title or ""
            fields.append("title")
        if metadata is not _UNSET:
            current = conversation.metadata or {}
            server = {k: current[k] for k in RESERVED_METADATA if k in current}
            merged = {**(metadata or {}), **server}
            if merged != current:
                conversation.metadata = merged
                fields.append("metadata")
        if fields:
            conversation.save(update_fields=[*fields, "updated_at"])
    return conversation


@retried
def start_conversation_run(
    conversation_id: str,
    content: str,
    *,
    run_id: str | None = None,
    metadata: dict[str, Any] | None = None,
    files: list[Any] | None = None,
    owner_limit: int = 0,
    strategy: str = MultitaskStrategy.REJECT,
    fallback: str = MultitaskStrategy.REJECT,
) -> tuple[Run, Event | None]:
    """Start a run of a conversation without a task on a user message; return it and the message.

    Under the conversation's row lock: not deleting; then, when nothing is pending or unfinished
    there, the queued run and its message.user event, in one transaction. A busy conversation
    refuses it (ConversationBusy) under `reject`. Otherwise the run waits its turn (`waiting`,
    with no event yet: its message is posted when `release_waiting` starts it): behind the others
    under `enqueue`; under `interrupt` and `rollback` every unfinished run there is stopped first
    (`stop_for_newer`), and when none was running the run starts at once. Under `steer` the
    message goes to the queued or running run (`steering.steer`), which is returned with its
    `message.steer` event; where none can take it (a run paused, an action pending) the write
    follows `fallback`. Refused (ActiveTaskLimit) when its owner is at `owner_limit` active tasks.
    """
    now = timezone.now()
    with transaction.atomic():
        owner_id = (
            Conversation.objects.filter(pk=conversation_id)
            .values_list("owner_id", flat=True)
            .first()
        )
        check_active_limit(owner_id, owner_limit)
        log = Log()
        conversation = lock_conversation(conversation_id, log)
        if conversation.deleting_at is not None:
            raise ConversationNotFound(conversation_id)
        busy = conversation_busy(conversation_id)
        if busy is not None and strategy == MultitaskStrategy.STEER:
            target = steerable_run(conversation_id, busy)
            if target is not None:
                event = steer(log, target, content, metadata, files)
                log.flush()
                return target, event
            strategy = fallback
        if busy is not None and strategy in STOPPING:
            stop_for_newer(log, conversation_id, STOPPING[strategy], now)
            busy = conversation_busy(conversation_id)
        if busy is not None and strategy == MultitaskStrategy.REJECT:
            raise busy
        message = user_message_data(content, "message", files, None, metadata)
        run = Run.objects.create(
            id=run_id or ids.new_run_id(),
            conversation=conversation,
            owner_id=conversation.owner_id,
            agent=conversation.agent,
            trigger=RunTrigger.MESSAGE,
            input=content,
            status=RunStatus.QUEUED if busy is None else RunStatus.WAITING,
            queued_at=now,
            message=None if busy is None else message,  # posted when it is released
        )
        if busy is not None:
            return run, None
        event = log.add(conversation_id, "message.user", message, run_id=run.id)
        log.flush()
    return run, event


# The strategies that stop what runs for a newer message, and the stop request each makes.
STOPPING: dict[str, str] = {
    MultitaskStrategy.INTERRUPT: StopRequest.INTERRUPT,
    MultitaskStrategy.ROLLBACK: StopRequest.ROLLBACK,
}


def steerable_run(conversation_id: str, busy: ConversationBusy) -> Run | None:
    """Lock and return the run a steered message can reach: the conversation's queued or running
    run, not being stopped, with no action pending (None when there is none)."""
    if busy.action_ids:
        return None
    return (
        Run.objects.select_for_update(no_key=True)
        .filter(
            conversation_id=conversation_id,
            status__in=(RunStatus.QUEUED, RunStatus.RUNNING),
            stop_request=StopRequest.NONE,
        )
        .order_by("-created_at", "-id")
        .first()
    )


def stop_for_newer(log: Log, conversation_id: str, request: str, now: Any) -> None:
    """Stop every unfinished run of a locked conversation for a newer message.

    Waiting runs are cancelled (their messages never posted). A running one is told to stop now
    (`request`: its worker ends it interrupted or rolled back); a queued or paused one ends here,
    its open actions cancelled with the reason `interrupted`.
    """
    runs = (
        Run.objects.select_for_update(no_key=True)
        .unfinished()
        .filter(conversation_id=conversation_id)
        .order_by("created_at", "id")
    )
    for run in runs:
        stop_one(log, run, request, now)


def stop_one(log: Log, run: Run, request: str, now: Any) -> None:
    """Stop a locked unfinished run of a locked conversation (`request`: interrupt or rollback).

    A waiting run is cancelled (its message never posted); a running one is told to stop now
    (its worker ends it interrupted or rolled back); a queued or paused one ends here, its open
    actions cancelled with the reason `interrupted`.
    """
    if run.status == RunStatus.WAITING:
        run.status, run.ended_at, run.message = RunStatus.CANCELLED, now, None
    elif run.status == RunStatus.RUNNING:
        run.stop_request = request
    elif request == StopRequest.ROLLBACK:
        run.stop_request = request
        roll_back(run, now)
    else:
        run.status, run.ended_at, run.stop_request = RunStatus.INTERRUPTED, now, request
        cancel_open_actions(log, run, now, reason="interrupted")
        leave_untaken(log, run, now)
        run_finished(log, run)
    run.save()


@retried
def stop_run(run_id: str, request: str) -> Run | None:
    """Stop one unfinished run of a conversation without a task (`stop_one`); None when it had
    ended already."""
    now = timezone.now()
    with transaction.atomic():
        run = lock_run(run_id)
        if run.task_id is not None or run.status not in RUN_UNFINISHED:
            return None
        log = Log()
        log.hold(run.conversation)
        stop_one(log, run, request, now)
        log.flush()
        return run


@retried
def delete_run(run_id: str) -> bool:
    """Delete an ended run of a conversation without a task with its settled actions (a
    LangGraph run's record); what it wrote stays in the transcript. False when it has not ended
    or is a task's."""
    with transaction.atomic():
        run = lock_run(run_id)
        if run.task_id is not None or run.status not in RUN_ENDED:
            return False
        run.delete()
        return True


# The events a copy of a conversation carries: what its transcript reads.
TRANSCRIPT = ("message.user", "message.assistant", "tool.result", "task.notification")


def copy_conversation(conversation_id: str, *, owner: Any) -> Conversation:
    """Copy a conversation's transcript into a new visible conversation of the same owner and
    agent (a LangGraph thread's copy): its messages and tool results, in order, without runs,
    actions or files."""
    with transaction.atomic():
        source = lock_conversation(conversation_id)
        if source.deleting_at is not None:
            raise ConversationNotFound(conversation_id)
        metadata = {k: v for k, v in (source.metadata or {}).items() if k not in RESERVED_METADATA}
        copy = Conversation.objects.create(
            owner=owner, agent=source.agent, title=source.title, metadata=metadata
        )
        log = Log()
        log.hold(lock_conversation(copy.id))
        events = Event.objects.filter(conversation_id=source.id, type__in=TRANSCRIPT)
        for event in events.order_by("seq"):
            log.add(copy.id, event.type, event.data or {})
        log.flush()
        copy.refresh_from_db()
        return copy


@retried
def adopt_agent(conversation_id: str, agent: str) -> Conversation:
    """Give a visible conversation created without an agent the agent of its first run (a
    LangGraph thread's); ConversationBusy-free, but InvalidField for another agent than its own."""
    with transaction.atomic():
        conversation = lock_conversation(conversation_id)
        if conversation.deleting_at is not None or conversation.hidden:
            raise ConversationNotFound(conversation_id)
        if conversation.agent == agent:
            return conversation
        if conversation.agent:
            raise InvalidField(
                f"Conversation {conversation_id} runs the agent {conversation.agent}", "agent"
            )
        conversation.agent = agent
        conversation.metadata = {**(conversation.metadata or {}), "graph_id": agent}
        conversation.save(update_fields=["agent", "metadata", "updated_at"])
        return conversation


@retried
def release_waiting(conversation_id: str) -> tuple[Run, Event] | None:
    """Start the oldest waiting run of an idle conversation: queue it and post its message.

    Under the conversation's row lock, the same test as a message's: nothing pending, nothing
    queued, running or paused. Returns the run (the caller launches it after commit) and its
    message, or None when the conversation is busy or nothing waits.
    """
    now = timezone.now()
    with transaction.atomic():
        conversation = lock_conversation(conversation_id)
        if conversation.deleting_at is not None:
            return None
        if conversation_busy(conversation_id, waiting=False) is not None:
            return None
        run = (
            Run.objects.select_for_update(no_key=True)
            .filter(conversation_id=conversation_id, status=RunStatus.WAITING)
            .order_by("created_at", "id")
            .first()
        )
        if run is None:
            return None
        log = Log()
        log.hold(conversation)
        event = log.add(conversation_id, "message.user", run.message or {}, run_id=run.id)
        run.status, run.queued_at, run.message = RunStatus.QUEUED, now, None
        run.save(update_fields=["status", "queued_at", "message"])
        log.flush()
        return run, event


@retried
def cancel_waiting(run_id: str) -> Run | None:
    """Cancel a run still waiting its turn; None when it is not waiting (any more)."""
    with transaction.atomic():
        run = lock_run(run_id)
        if run.status != RunStatus.WAITING:
            return None
        run.status, run.ended_at, run.message = RunStatus.CANCELLED, timezone.now(), None
        run.save(update_fields=["status", "ended_at", "message"])
        return run


@retried
def wake_conversation(conversation: Conversation, text: str, task_ids: list[str]) -> Run:
    """Queue the wake-up run of a locked conversation with its task.notification event."""
    log = Log()
    log.hold(conversation)
    run = Run.objects.create(
        conversation=conversation,
        owner_id=conversation.owner_id,
        agent=conversation.agent,
        trigger=RunTrigger.WAKEUP,
        input=text,
        status=RunStatus.QUEUED,
    )
    data = {"content": text, "taskIds": task_ids}
    log.add(conversation.id, "task.notification", data, run_id=run.id)
    log.flush()
    return run


@retried
def answer_conversation_run(run_id: str, action_id: str, resolution: dict[str, Any]) -> Run | None:
    """Settle an action of a paused conversation run; queue the run when none is left open."""
    now = timezone.now()
    with transaction.atomic():
        run = lock_run(run_id)
        action = lock_open_action(action_id)
        if action is None:
            return None
        log = Log()
        log.hold(run.conversation)
        if run.status != RunStatus.PAUSED or action.run_id != run_id:
            resolve_action(log, action, {"status": ActionStatus.CANCELLED}, now)
            log.flush()
            return None
        resolve_action(log, action, resolution, now)
        if not held(run):
            requeue_paused(log, run, now)
        log.flush()
        return run


@retried
def resume_paused(conversation_id: str) -> Run | None:
    """Resume a conversation's paused latest run once nothing holds it.

    Nothing holds it when it has no pending action of its own and every child it escalated has
    settled; checked on the locked task (or run) row, so of two children ending at once the later
    commit sees both endings. The run keeps its id; the caller enqueues it after commit. Returns
    the run as written (with `run.task`, the task as written, when it has one), or None when it is
    not paused or still held.
    """
    now = timezone.now()
    with transaction.atomic():
        task_id = (
            Task.objects.filter(conversation_id=conversation_id)
            .values_list("id", flat=True)
            .first()
        )
        if task_id is not None:
            task = lock_task(task_id)
            run = task.run
            if (
                task.status != TaskStatus.WAITING_FOR_INPUT
                or run.status != RunStatus.PAUSED
                or task.conversation.deleting_at is not None
                or held(run)
            ):
                return None
            log = Log()
            hold_task(log, task)
            requeue_paused(log, run, now, task)
            log.flush()
            run.task = task
            return run
        conversation = lock_conversation(conversation_id)
        latest = (
            Run.objects.select_for_update(no_key=True)
            .taskless()
            .filter(conversation_id=conversation_id)
            .order_by("-created_at", "-id")
            .first()
        )
        if (
            latest is None
            or latest.status != RunStatus.PAUSED
            or conversation.deleting_at is not None
            or held(latest)
        ):
            return None
        requeue_paused(Log(), latest, now)
        return latest


def conversation_busy(conversation_id: str, *, waiting: bool = True) -> ConversationBusy | None:
    """Why a message cannot start a run in this conversation now (None: it can).

    Busy while an action is pending (its own, or one its delegate descendants escalated to it)
    or while a run is queued, running or paused, or (`waiting`) waits its turn behind them.
    """
    pending = list(pending_actions_below(conversation_id).values_list("id", flat=True))
    if pending:
        return ConversationBusy(conversation_id, action_ids=pending)
    runs = Run.objects.unfinished() if waiting else Run.objects.active()
    active = (
        runs.filter(conversation_id=conversation_id)
        .order_by("-created_at", "-id")
        .values_list("id", flat=True)
        .first()
    )
    return ConversationBusy(conversation_id, run_id=active) if active else None


# --- what holds a paused run -----------------------------------------------------------------


def escalations_open(run: Run) -> bool:
    """Say whether a delegate child this run escalated (`task.escalated`) has not settled yet."""
    children = Event.objects.filter(
        conversation_id=run.conversation_id, type="task.escalated", run_id=run.id
    ).values_list("task_id", flat=True)
    return Task.objects.filter(pk__in=list(children)).live().exists()


def held(run: Run) -> bool:
    """Say whether a paused run still waits: on an action of its own or an escalated child."""
    return PendingAction.objects.open().filter(run_id=run.id).exists() or escalations_open(run)


def pending_actions_below(conversation_id: str) -> PendingActionQuerySet:
    """Return the pending actions of a conversation and of its delegate descendants, oldest first."""
    delegates = Task.objects.filter(kind=TaskKind.DELEGATE).only("conversation_id")
    tree = [conversation_id]
    for level in delegates.levels_below([conversation_id]):
        tree.extend(task.conversation_id for task in level)
    return (
        PendingAction.objects.open().filter(conversation_id__in=tree).order_by("created_at", "id")
    )
