"""The task lifecycle (the brief's Manager): create, spawn, status, retry, stop, continuations.

Every status change goes through `store`; this module decides which transition to ask for,
launches runs after commit, sends the signals with the snapshot the winning write used, schedules
callbacks and wake-up delivery, and wakes status waiters.
"""

import dataclasses
import logging
import sys
import time
from collections.abc import Callable, Collection, Iterable
from typing import Any

from django.db import DatabaseError, transaction
from django.utils import timezone

from . import answers, callbacks, ids, progress, queue, registry, signals, store, wakeups
from .conf import app_settings
from .exceptions import (
    ActionNotFound,
    ActionPending,
    ActionResolved,
    ActiveTaskLimit,
    AlreadyFinal,
    ConversationBusy,
    ConversationNotFound,
    DepthLimit,
    LaunchFailed,
    NotRetryable,
    RetryConflict,
    RetryLimit,
    RunNotFound,
    SpawnError,
    StoreError,
    TaskBusy,
    TaskError,
    TaskLimit,
    TaskNotFound,
)
from .files import remove_now, remove_stored
from .listen import hub, task_key
from .models import Comment, Conversation, PendingAction, Run, Task
from .states import (
    LIVE,
    TERMINAL,
    ActionStatus,
    OutcomeStatus,
    RunStatus,
    RunTrigger,
    StopRequest,
    TaskKind,
    TaskStatus,
)
from .types import (
    Continuation,
    ConversationRef,
    Ending,
    NewTask,
    Owner,
    RunOutcome,
    StopOutcome,
    TaskInfo,
    TaskMeta,
)

__all__ = [
    "Continuation",
    "RunOutcome",
    "StopOutcome",
    "TaskInfo",
    "TaskMeta",
    "cancel",
    "comment",
    "create",
    "delete_conversation",
    "list_tasks",
    "meta_for",
    "model_has_result",
    "on_run_finished",
    "recover",
    "resolve_action",
    "retry",
    "spawn",
    "status",
    "stop",
    "stop_tree",
]

if sys.version_info < (3, 11):  # pragma: no cover
    from exceptiongroup import ExceptionGroup

logger = logging.getLogger(__name__)

STATUS_POLL = 0.25
STOP_SETTLE_WAIT = 2.0
STOP_PASSES = 2
LABEL_LENGTH = 60
DELEGATE = TaskKind.DELEGATE
CEILING_TEXT = "stopped after %d runs: the task's continuation ceiling (%d) was reached"
NO_RUN_ID_WARNING = "task outcome without a run id: Continue not consulted; a job of several runs needs run identity"


# --- views -----------------------------------------------------------------------------------


def progress_line(task: Task, run: Run | None = None) -> str:
    """Render the progress of a task with its kind's DESCRIBE_STATE hook, or the default line."""
    try:
        hook = app_settings.hook("DESCRIBE_STATE", task.kind)  # "" is a plain task's kind
        run = run if run is not None else task.run
        state = run.progress if run is not None and run.progress is not None else task.state
        if state is None:
            return ""
        return str(hook(state) or "") if hook is not None else progress.default_line(state)
    except Exception:
        logger.exception("lifecycle.describe_failed task=%s", task.id)
        return ""


def info(task: Task, *, agent: str = "") -> TaskInfo:
    """Return the Python view of a task (stored status; `agent` defaults to its display name)."""
    return TaskInfo(
        task_id=task.id,
        run_id=task.run_id,
        label=task.label,
        kind=task.kind,
        agent=agent or agent_name(task.agent),
        status=task.status,
        attempt=task.attempt_no(),
        summary=task.summary,
        result=task.result,
        state=task.state,
        progress=progress_line(task),
    )


def conversation_id_of(conversation: ConversationRef) -> str:
    """The id of a conversation given as a row or as its id."""
    return conversation if isinstance(conversation, str) else conversation.pk


def agent_name(agent_id: str) -> str:
    """The registered agent's display name, or its id when it is no longer registered."""
    try:
        return registry.get(agent_id).name or agent_id
    except registry.UnknownAgent:
        return agent_id


def _read(task_id: str) -> Task:
    return Task.objects.read(task_id)


def _after_commit(fn: Callable[[], object]) -> None:
    transaction.on_commit(fn)


def announce(task: Task) -> None:
    """Announce a won write after commit, from the task as written (every winning write).

    Waiters wake and `task_updated` is sent; an ending also sends `task_finished` (or, for a
    cancellation, `result_delivered`), its callback, and the delivery of the result it owes; a
    pause sends its callback and lets a caller waiting on escalations resume.
    """
    _after_commit(lambda: hub.publish(task_key(task.id)))
    _after_commit(lambda: signals.task_updated.send(sender=Task, task=task))
    if task.status in TERMINAL:
        signal = (
            signals.result_delivered
            if task.status == TaskStatus.CANCELLED
            else signals.task_finished
        )
        _after_commit(lambda: signal.send(sender=Task, snapshot=task))
        callbacks.schedule(task, task.status)
        if task.status != TaskStatus.CANCELLED and task.kind != DELEGATE:
            wakeups.schedule_delivery(task.parent_conversation_id)  # the debt this ending wrote
        if task.kind == DELEGATE:
            # A caller paused on this child may now resume (docs/delegation.md#resuming-a-paused-caller).
            _after_commit(lambda: resume_if_settled(task.parent_conversation_id))
        _own_run_boundary(task)
    elif task.status == TaskStatus.WAITING_FOR_INPUT:
        callbacks.schedule(task, task.status)
        # A child may have settled between its escalation and this pause: check once after it.
        _after_commit(lambda: resume_if_settled(task.conversation_id))


def _own_run_boundary(task: Task) -> None:
    """Deliver what a task's own conversation is owed; only a task that may spawn can be owed."""
    if app_settings.MAX_DEPTH > 1:
        wakeups.schedule_delivery(task.conversation_id)


# --- launching -------------------------------------------------------------------------------


def _launch(run_id: str) -> None:
    """Enqueue a run after commit; outside a transaction an enqueue failure raises here."""
    queue.launch_on_commit(run_id)


def _launch_durable(run_id: str) -> None:
    """Launch a run whose queued row is committed: a failure is logged, not raised.

    Nothing is lost: the reaper enqueues a run queued longer than REQUEUE_AFTER again.
    """
    try:
        _launch(run_id)
    except Exception:
        logger.exception(
            "lifecycle.launch_failed run=%s (the reaper will enqueue it again)", run_id
        )


def _check_agent(agent_id: str) -> None:
    registry.get(agent_id)


# --- create and spawn ------------------------------------------------------------------------


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
    files: Iterable[Any] = (),
    before_commit: Callable[[Task], None] | None = None,
) -> Task:
    """Create a task from REST or site code: a visible conversation, depth 1, no parent.

    `before_commit(task)` runs inside the creating transaction (REST stores the files there).
    """
    agent = registry.get(agent_id)
    if callback_url:
        callbacks.check_syntax(callback_url)
        callbacks.check_address(callback_url)
    run_id = ids.new_run_id()
    new = NewTask(
        owner=owner,
        agent=agent_id,
        input=input,
        label=label or " ".join(input.split())[:LABEL_LENGTH],
        kind=kind,
        state=state,
        inherit=agent.snapshot(),
        callback_url=callback_url or "",
        metadata=metadata or {},
        files=list(files),
        run_id=run_id,
    )
    # The first run's job commits with the task when the broker is this database.
    job = queue.job_row(run_id)
    limit = app_settings.MAX_ACTIVE_TASKS_PER_USER
    if before_commit is None:
        task = store.create_task(new, owner_limit=limit, job=job)
    else:
        with transaction.atomic():
            task = store.create_task(new, owner_limit=limit, job=job)
            before_commit(task)
    if job is None:
        _launch_durable(run_id)
    announce(task)
    return task


def meta_for(conversation: ConversationRef) -> TaskMeta | None:
    """Return the task whose own conversation this is, or None; a lookup failure raises."""
    conversation_id = conversation_id_of(conversation)
    try:
        row = (
            Task.objects.filter(conversation_id=conversation_id)
            .values("id", "label", "parent_conversation_id", "depth")
            .first()
        )
    except DatabaseError as exc:
        raise SpawnError.looking_up(str(conversation_id), exc) from exc
    if row is None:
        return None
    return TaskMeta(row["id"], row["label"], row["parent_conversation_id"], row["depth"])


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
) -> TaskInfo:
    """Start a background task from a model's conversation; returns at once."""
    if parent is None:
        raise SpawnError.no_parent()
    meta = meta_for(parent)
    depth = 1
    if meta is not None:
        depth = meta.depth + 1
        if depth > app_settings.MAX_DEPTH:
            raise DepthLimit(meta.depth)
    label = label or input[:LABEL_LENGTH]
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
        run_id=run_id,
    )
    job = queue.job_row(run_id)
    try:
        task = store.create_task(
            new,
            parent_cap=app_settings.MAX_CONCURRENT_PER_PARENT,
            owner_limit=app_settings.MAX_ACTIVE_TASKS_PER_USER,
            job=job,
        )
    except (TaskLimit, ActiveTaskLimit, ConversationNotFound):
        raise
    except DatabaseError as exc:
        raise SpawnError.creating_task(exc) from exc
    if job is None:
        try:
            _launch(run_id)
        except Exception as exc:
            store.discard_spawn(task.id, f"could not start: {exc}")
            raise LaunchFailed.spawn(exc) from exc
        task = _read(task.id)  # the run may have moved on while it was being enqueued
    announce(task)
    return info(task, agent=agent.name)


# --- status and listings ---------------------------------------------------------------------


SETTLED = TERMINAL | {TaskStatus.WAITING_FOR_INPUT}


def status(
    task_id: str,
    *,
    wait: float = 0,
    stop_check: Callable[[], bool] | None = None,
    settled: Collection[str] = SETTLED,
) -> TaskInfo:
    """Read a task, waiting up to `wait` seconds (clamped to MAX_STATUS_WAIT) for it to settle.

    Settled is terminal or waiting for input (as REST's /wait), unless `settled` says otherwise.
    """
    return info(wait_for(task_id, wait=wait, stop_check=stop_check, settled=settled))


def wait_for(
    task_id: str,
    *,
    wait: float = 0,
    stop_check: Callable[[], bool] | None = None,
    settled: Collection[str] = TERMINAL,
) -> Task:
    """Return the task once its status is in `settled`, or when the wait runs out."""
    wait = min(max(float(wait or 0), 0.0), float(app_settings.MAX_STATUS_WAIT))
    deadline = time.monotonic() + wait
    with hub.subscribe(task_key(task_id)) as woken:
        while True:
            task = _read(task_id)
            remaining = deadline - time.monotonic()
            if task.status in settled or remaining <= 0:
                return task
            if stop_check is not None and stop_check():
                return task
            woken.wait(min(remaining, STATUS_POLL))
            woken.clear()


def list_tasks(conversation: ConversationRef) -> list[TaskInfo]:
    """Every task spawned from the conversation (delegates excluded), newest first."""
    conversation_id = conversation_id_of(conversation)
    tasks = (
        Task.objects.filter(parent_conversation_id=conversation_id)
        .exclude(kind=DELEGATE)
        .select_related("run")
        .order_by("-created_at", "-id")
    )
    return [info(t) for t in tasks]


# --- retry -----------------------------------------------------------------------------------


def retry(task_id: str) -> TaskInfo:
    """Resume a failed task on its own conversation as a new attempt; return it as it is now."""
    retry_task(task_id)
    return info(_read(task_id))


def retry_task(task_id: str) -> Task:
    """Retry a failed task; return it as the retry wrote it (before a worker could move it)."""
    task = _read(task_id)
    _raise(retry_refusal(task))
    run_id = ids.new_run_id()
    cap = app_settings.MAX_CONCURRENT_PER_PARENT
    won = store.retry_claim(
        task.id,
        run_id,
        app_settings.MAX_ATTEMPTS,
        cap,
        owner_limit=app_settings.MAX_ACTIVE_TASKS_PER_USER,
    )
    if not won:
        task = _read(task_id)
        _raise(retry_refusal(task))
        if task.parent_conversation_id and store.live_count(task.parent_conversation_id) >= cap:
            raise TaskLimit(cap, info=info(task))
        raise RetryConflict(info=info(task))
    try:
        _check_agent(won.agent)
        _launch(run_id)
    except Exception as exc:
        full = f"retry could not start: {exc}"
        released = store.release_retry_claim(
            task.id, run_id, full[: app_settings.SUMMARY_LIMIT], full
        )
        if released:
            announce(released)
        raise LaunchFailed.retry(exc, info=info(_read(task_id))) from exc
    announce(won)
    return won


def retry_refusal(task: Task) -> TaskError | None:
    """Why this task cannot be retried now (None: it can): a delegate, not failed, or spent."""
    if task.kind == DELEGATE or task.status != TaskStatus.FAILED:
        return NotRetryable(
            task.status, task_id=task.id, delegate=task.kind == DELEGATE, info=info(task)
        )
    limit = app_settings.MAX_ATTEMPTS
    if task.attempt_no() >= limit:
        return RetryLimit(limit, task_id=task.id, attempt=task.attempt_no(), info=info(task))
    return None


def _raise(refusal: TaskError | None) -> None:
    if refusal is not None:
        raise refusal


# --- stop ------------------------------------------------------------------------------------


def stop(task_id: str, *, graceful: bool = False) -> TaskInfo:
    """Stop a task: at most two passes, the second chasing one retry that replaced the first."""
    for pass_no in range(1, STOP_PASSES + 1):
        task = _read(task_id)
        if task.status in TERMINAL:
            if pass_no == 1:
                raise AlreadyFinal(task.status, task_id=task.id, info=info(task))
            return info(task)
        if task.status == TaskStatus.WAITING_FOR_INPUT:
            won = store.finalize(
                task.id,
                task.run_id,
                TaskStatus.CANCELLED,
                summary="stopped while awaiting approval",
                reason="stopped while awaiting input",
            )
        else:
            outcome = store.request_stop(task.id, task.run_id, graceful=graceful)
            if outcome is StopOutcome.MOVED:
                continue
            if outcome is StopOutcome.AFTER_TURN:
                announce(task)
                return info(task)
            if outcome is StopOutcome.ALREADY_FINISHED and pass_no == 1:
                _settle(task)
                continue
            reason = "stopped" if outcome is StopOutcome.CANCELLED else "stopped while queued"
            won = store.finalize(
                task.id, task.run_id, TaskStatus.CANCELLED, summary="stopped", reason=reason
            )
        if won:
            announce(won)
            _stop_children(won)
            return info(_read(task_id))
    return info(_read(task_id))


def cancel(task_id: str, *, graceful: bool = False) -> Task:
    """Cancel a task for a client; return it as the stop left it (graceful: still winding down).

    Cancelling a cancelled task changes nothing; a task that completed or failed, before or
    during the stop, refuses with AlreadyFinal.
    """
    task = _read(task_id)
    if task.status in LIVE:
        try:
            stop(task.id, graceful=graceful)
        except AlreadyFinal:
            pass  # it ended meanwhile: judged below as it is now
        task = Task.objects.select_related("run").get(pk=task.id)
    if task.status in (TaskStatus.COMPLETED, TaskStatus.FAILED):
        raise AlreadyFinal(task.status, task_id=task.id, info=info(task))
    return task


def _settle(task: Task) -> None:
    """Give a recorded ending up to 2 s to be applied by its worker."""
    deadline = time.monotonic() + STOP_SETTLE_WAIT
    while time.monotonic() < deadline:
        time.sleep(STATUS_POLL)
        now = _read(task.id)
        if now.status in TERMINAL or now.run_id != task.run_id:
            return


def _stop_children(task: Task) -> None:
    try:
        stop_tree(task.conversation_id)
    except Exception:
        logger.exception("lifecycle.stop_children_failed task=%s", task.id)


def stop_tree(conversation: ConversationRef) -> None:
    """Stop every live task spawned from the conversation, and theirs, recursively."""
    conversation_id = conversation_id_of(conversation)
    errors: list[Exception] = []
    seen: set[str] = set()
    frontier = [conversation_id]
    while frontier:
        try:
            live = list(
                Task.objects.filter(
                    parent_conversation_id__in=frontier, status__in=LIVE
                ).values_list("id", "conversation_id")
            )
        except DatabaseError as exc:
            raise StoreError.listing_live(exc) from exc
        frontier = []
        for task_id, child_conversation_id in live:
            if task_id in seen:
                continue
            seen.add(task_id)
            frontier.append(child_conversation_id)
            try:
                stop(task_id)
            except (AlreadyFinal, TaskNotFound):
                pass
            except Exception as exc:  # collected and raised together
                errors.append(exc)
    if errors:
        raise ExceptionGroup("tasks: stopping the task tree", errors)


# --- comments and answers --------------------------------------------------------------------


def comment(
    task_id: str,
    content: str,
    *,
    author: Owner = None,
    metadata: dict[str, Any] | None = None,
    origin: str = "comment",
    files: list[Any] | None = None,
) -> Comment:
    """Add a user comment: it re-opens a finished task (or answers a clarification) on a new run.

    `origin="message"` is a message posted to the task's own conversation, refused while that
    conversation is busy. The comment comes back with `comment.task`, the task as it left it.
    """
    refusal = message_refusal if origin == "message" else comment_refusal
    task = _read(task_id)
    _raise(refusal(task))
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
    )
    if not won:
        # Another writer moved the task between the check and the re-open: say what it is now.
        task = _read(task_id)
        _raise(refusal(task))
        raise TaskBusy(task.status, task_id=task.id, info=info(task))
    _launch_durable(run_id)
    announce(won)
    assert won.new_comment is not None  # a comment or message trigger records one
    return won.new_comment


def waiting_on(task: Task) -> list[str]:
    """The pending actions a task waits on: its current run's, and those escalated to it."""
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


def answer(action_id: str, resolution: dict[str, Any]) -> Task | None:
    """Answer an approval or a question as a person; return its task as the answer left it.

    Refused (ActionResolved) when the action is already settled, has expired (its timeout is
    applied now) or belongs to a run that is no longer current. None for a conversation's run.
    """
    action = PendingAction.objects.filter(pk=action_id).first()
    if action is None:
        raise ActionNotFound()
    _raise(answer_refusal(action))
    won = _resolve(action_id, resolution)
    if not won:
        action.refresh_from_db()
        _raise(answer_refusal(action))
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
        raise ActionNotFound()
    resolution = answers.resolution(row, answer)
    if decided_by is not None:
        resolution["decided_by"] = decided_by
    return _resolve(row.id, resolution)


def _resolve(action_id: str, resolution: dict[str, Any]) -> Task | Run | None:
    """Apply a store resolution (`status` approved, denied, answered, expired, cancelled)."""
    action = PendingAction.objects.get(pk=action_id)
    if action.task_id is not None:
        won = store.answer(action.task_id, action.run_id, action_id, resolution)
        if won:
            announce(won)
            if won.status == TaskStatus.PENDING:
                _launch(won.run_id)
        return won
    run = store.answer_conversation_run(action.run_id, action_id, resolution)
    if run and run.status == RunStatus.QUEUED:
        _launch(run.id)
    return run


# --- a run's ending --------------------------------------------------------------------------


def on_run_finished(
    conversation: ConversationRef, outcome: RunOutcome, *, task: Task | None = None
) -> None:
    """The single entry point for a run's ending: pause, continue, or finalize its task.

    The run driver passes the task it claimed (`task`), which saves looking it up again.
    """
    conversation_id = conversation_id_of(conversation)
    if task is None:
        try:
            meta = meta_for(conversation_id)
        except SpawnError:
            logger.error(
                "resolving finished run's task; terminal state NOT recorded conversation=%s",
                conversation_id,
            )
            raise
        if meta is None:
            if outcome.run_id:
                store.record_run_end(outcome.run_id, outcome)
                if outcome.status == OutcomeStatus.INPUT_REQUIRED:
                    resume_if_settled(conversation_id)  # its escalated children may have settled
            wakeups.schedule_delivery(conversation_id)
            return
        task = _read(meta.task_id)
    run_id = outcome.run_id or task.run_id
    if outcome.status == OutcomeStatus.INPUT_REQUIRED:
        if _pause(task, run_id, outcome) or not _stopping_after_turn(run_id):
            return
        # The store refused the pause of a run asked to stop after its turn: it ends instead,
        # as a graceful stop (docs/lifecycle.md#pausing-for-a-person), so no action is left open and the stop is honoured.
        outcome = dataclasses.replace(
            outcome,
            status=OutcomeStatus.COMPLETED,
            graceful_stop=True,
            actions=(),
            clarification=None,
        )
    if outcome.status not in TERMINAL:
        return
    if app_settings.hook("CONTINUE", task.kind) is None:
        _finish(task, run_id, outcome)
    else:
        _finish_with_hook(_read(task.id), run_id, outcome)


def _ending(
    outcome: RunOutcome,
    *,
    graceful: bool,
    status: str | None = None,
    full: str | None = None,
    state: Any = None,
) -> Ending:
    """How an outcome settles its task (a completed run asked to stop after its turn is a
    cancellation that keeps its reply as the result)."""
    if full is None:
        failed = outcome.status == OutcomeStatus.FAILED
        full = outcome.text.strip() or (outcome.error if failed else "")
    status = status or outcome.status
    summary = full[: app_settings.SUMMARY_LIMIT]
    reason = ""
    if status == TaskStatus.COMPLETED and graceful:
        status = TaskStatus.CANCELLED
        summary = summary or "stopped after the current turn"
        reason = "stopped after the current turn"
    task_result = None
    if status == TaskStatus.COMPLETED or (status == TaskStatus.CANCELLED and full):
        task_result = outcome.task_result or {
            "content": full,
            "usage": outcome.usage,
            "metadata": outcome.metadata,
        }
    return Ending(
        status=status,
        summary=summary,
        result=full,
        error=outcome.error if status == outcome.status else "",
        state=state,
        task_result=task_result,
        reason=reason,
    )


def _finish(task: Task, run_id: str, outcome: RunOutcome) -> None:
    """Record the ending and finalize at once (a kind without a CONTINUE hook)."""
    ending = _ending(outcome, graceful=outcome.graceful_stop)
    graceful = _ending(outcome, graceful=True)
    after_turn = None if graceful == ending else graceful
    ended = store.end(task.id, run_id, ending, outcome=outcome, after_turn=after_turn)
    _settled(ended.task, task, run_id)


def _finish_with_hook(task: Task, run_id: str, outcome: RunOutcome) -> None:
    """Record the ending, ask the kind's CONTINUE hook, then advance or finalize."""
    graceful = outcome.graceful_stop or (
        task.run_id == run_id and task.run.stop_request == StopRequest.AFTER_TURN
    )
    if graceful and not outcome.graceful_stop:
        outcome = dataclasses.replace(outcome, graceful_stop=True)
    store.record_run_end(run_id, outcome)
    ending = _ending(outcome, graceful=graceful)
    if _wants_continuation(task, run_id, ending.status, outcome):
        if outcome.run_id is None:
            logger.warning(NO_RUN_ID_WARNING)
        else:
            step = _continue(task, run_id, outcome)
            if step is None:
                return
            status, full, final_state = step
            ending = _ending(outcome, graceful=False, status=status, full=full, state=final_state)
    _settled(store.end(task.id, run_id, ending).task, task, run_id)


def _settled(won: Task | None, task: Task, run_id: str) -> None:
    if won:
        announce(won)
    else:
        logger.debug("lifecycle.ending_lost task=%s run=%s", task.id, run_id)
        _own_run_boundary(task)


def _pause(task: Task, run_id: str, outcome: RunOutcome) -> bool:
    partial = {"content": outcome.text, "metadata": outcome.metadata, "usage": outcome.usage}
    won = store.pause(
        task.id,
        run_id,
        actions=outcome.actions,
        clarification=outcome.clarification if not outcome.actions else None,
        task_result=partial,
        # No action and no clarification: the run waits on its delegate children's escalations.
        escalated=not outcome.actions and outcome.clarification is None,
    )
    if not won:
        logger.info("lifecycle.pause_lost task=%s run=%s", task.id, run_id)
        return False
    announce(won)
    return True


def _stopping_after_turn(run_id: str) -> bool:
    return Run.objects.filter(
        pk=run_id, status=RunStatus.RUNNING, stop_request=StopRequest.AFTER_TURN
    ).exists()


def _wants_continuation(task: Task, run_id: str, status: str, outcome: RunOutcome) -> bool:
    return (
        app_settings.hook("CONTINUE", task.kind) is not None
        and status != TaskStatus.CANCELLED
        and not outcome.graceful_stop
        and task.run_id == run_id
        and task.status == TaskStatus.RUNNING
    )


def _continue(task: Task, run_id: str, outcome: RunOutcome) -> tuple[str, str, Any] | None:
    """Ask the kind's CONTINUE hook; advance and launch, or return the ending it decided.

    Returns None when the task went on to a next run (or that attempt was settled here), else
    (status, full text, final state) for the ending.
    """
    hook = app_settings.hook("CONTINUE", task.kind)
    status = TaskStatus.COMPLETED if outcome.status == OutcomeStatus.COMPLETED else outcome.status
    full = outcome.text.strip() or (outcome.error if status == TaskStatus.FAILED else "")
    try:
        cont = hook(task, outcome)
    except Exception as exc:
        return TaskStatus.FAILED, str(exc), None
    if cont is None:
        return status, full, None
    if not cont.input:
        if cont.error:
            return TaskStatus.FAILED, cont.error, cont.state
        return status, full, cont.state
    if task.continuations >= app_settings.MAX_CONTINUATIONS:
        return (
            TaskStatus.FAILED,
            CEILING_TEXT % (task.continuations + 1, app_settings.MAX_CONTINUATIONS),
            None,
        )
    next_run_id = ids.new_run_id()
    try:
        advanced = store.advance(task.id, run_id, next_run_id, input=cont.input, state=cont.state)
        reason = "the task was moved before the next run could start"
    except Exception as exc:
        advanced, reason = None, str(exc)
    if not advanced:
        return TaskStatus.FAILED, "could not advance to the next run: " + reason, None
    try:
        _check_agent(advanced.agent)
        _launch(next_run_id)
    except Exception as exc:
        text = "could not start the next run: " + str(exc)
        won = store.finalize(
            task.id,
            next_run_id,
            TaskStatus.FAILED,
            summary=text[: app_settings.SUMMARY_LIMIT],
            result=text,
        )
        if won:
            announce(won)
        return None
    announce(advanced)
    return None


# --- delivery on the model's path ------------------------------------------------------------


def model_has_result(task_info: TaskInfo | None) -> None:
    """Settle the debt of a result the model was handed, bound to its run and attempt."""
    if task_info is None or task_info.status not in TERMINAL:
        return
    try:
        task = _read(task_info.task_id)
    except TaskNotFound:
        return
    if (
        task.status not in TERMINAL
        or task.run_id != task_info.run_id
        or task.attempt_no() != task_info.attempt
    ):
        return
    if wakeups.consume(task.id, task_info.run_id):
        signals.result_delivered.send(sender=Task, snapshot=task)


# --- recovery --------------------------------------------------------------------------------


def recover() -> list[Task]:
    """One reaper pass: orphans, stuck endings, dead taskless runs, requeues, timeouts, delivery."""
    try:
        orphans = store.fail_orphans()
    except DatabaseError as exc:
        raise StoreError.failing_orphans(exc) from exc
    if orphans:
        logger.info("recover.orphans count=%d", len(orphans))
    for task in orphans:
        announce(task)
    for task, outcome in store.stuck_endings():
        try:
            on_run_finished(task.conversation_id, outcome)
        except TaskError:
            logger.info("recover.stuck_ending_gone task=%s", task.id)
    for conversation_id in store.fail_dead_conversation_runs():
        wakeups.schedule_delivery(conversation_id)
    for run_id in store.requeue_stale(queue.queued_runs(app_settings.REQUEUE_AFTER)):
        try:
            queue.enqueue_run(run_id)
        except Exception:
            logger.exception("recover.requeue_failed run=%s", run_id)
    expire_actions()
    for conversation_id in store.conversations_owed():
        wakeups.deliver_pending(conversation_id)
    for root in store.interrupted_deletes():
        try:
            delete_conversation(root)
        except Exception:
            logger.exception("recover.delete_failed conversation=%s", root)
    return orphans


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
            won = _resolve(action.id, {"status": ActionStatus.EXPIRED, "on_timeout": "deny"})
        if won:
            settled.append(action.id)
    return settled


# --- deleting --------------------------------------------------------------------------------


def delete_conversation(conversation_id: str) -> None:
    """Stop and delete a conversation's whole tree, the bytes of its files included.

    The tree is marked first, so a delete that dies halfway is finished by calling this again (a
    repeated DELETE does, and so does the reaper). The bytes go before the rows, so none are
    ever left on disk without a row that leads to them; inside a caller's transaction they go
    when it commits.
    """
    tree = store.mark_deleting(conversation_id)
    stop_tree(conversation_id)  # its tasks end cancelled, with their events and callbacks
    store.stop_runs(tree)  # and whatever still runs there stops
    stored = store.stored_files(tree)
    if transaction.get_connection().in_atomic_block:
        remove_stored(stored)
    else:
        remove_now(stored)
    store.delete_tree(conversation_id)


def delete_owned_by(user: Any) -> None:
    """Delete every conversation tree a user owns, stopping their work (before the user goes)."""
    roots = Conversation.objects.filter(owner=user, parent__isnull=True).values_list(
        "id", flat=True
    )
    for conversation_id in list(roots):
        delete_conversation(conversation_id)


# --- convenience for site code ---------------------------------------------------------------


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


# --- conversations and their messages ---------------------------------------------------------


def create_conversation(
    *, owner: Owner, agent_id: str, title: str = "", metadata: dict[str, Any] | None = None
) -> Conversation:
    """Create a visible conversation of an agent; its first message starts a run."""
    registry.get(agent_id)
    return store.create_conversation(owner=owner, agent=agent_id, title=title, metadata=metadata)


def update_conversation(conversation_id: str, **changes: Any) -> Conversation:
    """Change a conversation's `title` and/or client `metadata` (see store.update_conversation)."""
    return store.update_conversation(conversation_id, **changes)


def post_message(
    conversation_id: str,
    content: str,
    *,
    metadata: dict[str, Any] | None = None,
    files: list[Any] | None = None,
) -> tuple[Run, object]:
    """Start a run of a conversation's agent on a user message (a conversation without a task).

    Raises ConversationBusy while an action is pending or a run is queued, running or
    paused. A task's conversation takes a message through `comment(..., origin="message")`.
    """
    run, event = store.start_conversation_run(
        conversation_id,
        content,
        metadata=metadata,
        files=files,
        owner_limit=app_settings.MAX_ACTIVE_TASKS_PER_USER,
    )
    _launch_durable(run.id)
    return run, event


# --- resuming a caller paused on its delegate children ----------------------------------------


def resume_if_settled(conversation_id: str | None) -> None:
    """Resume the conversation's paused run if its own actions and escalated children settled.

    Checked after an escalating run pauses and after a delegate task ends (docs/delegation.md#resuming-a-paused-caller);
    the store's compare-and-set makes a losing or premature check do nothing.
    """
    if not conversation_id:
        return
    try:
        won = store.resume_paused(conversation_id)
    except (TaskError, DatabaseError):
        logger.exception("delegation.resume_failed conversation=%s", conversation_id)
        return
    if won is None:
        return
    logger.info("delegation.resume_caller run=%s conversation=%s", won.id, conversation_id)
    if won.task is not None:
        announce(won.task)
    _launch_durable(won.id)
