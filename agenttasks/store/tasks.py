"""Task transitions: create, pause, answer, retry, advance, re-open, stop and progress.

Each is one compare-and-set transaction on the locked task (see `store.locking` for the lock
order): it re-checks the statuses and the run id the caller observed, writes, appends its events,
and returns the task (or run) as written, or None when the race was lost. An unknown id raises.
A claim is in `store.claims`; the ending of a run and the finalize of a task are in
`store.endings`.
"""

from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from .. import ids
from ..broker import queue
from ..conf import app_settings
from ..exceptions import (
    ActiveTaskLimit,
    ConversationNotFound,
    TaskError,
    TaskLimit,
)
from ..models import Comment, Conversation, PendingAction, Run, Task, Wakeup
from ..states import (
    LIVE,
    TERMINAL,
    ActionStatus,
    RunStatus,
    RunTrigger,
    StopRequest,
    TaskKind,
    TaskStatus,
)
from ..types import ActionRequest, NewTask, StopOutcome, default_label
from . import postgres
from .limits import check_active_limit, live_count, lock_principal, over_limit
from .locking import (
    Log,
    hold_task,
    lock_conversation,
    lock_open_action,
    lock_task,
    lock_task_of_run,
    retried,
    run_finished,
    task_status,
    task_status_data,
    user_message,
    user_message_data,
)
from .rows import (
    add_comment,
    create_actions,
    move_to_new_run,
    new_run,
    requeue_paused,
    resolve_action,
    save_task,
    set_status,
    write_result,
)
from .runs import held

RETRY_PROMPT = (
    "A previous attempt at this task failed: {reason}. The conversation above is the progress "
    "made so far. Review it and continue the task to completion; avoid repeating work that "
    "already succeeded."
)


# --- create ----------------------------------------------------------------------------------


@retried
def create_task(
    new: NewTask,
    *,
    parent_cap: int | None = None,
    owner_limit: int = 0,
    job: dict[str, Any] | None = None,
    notify: bool = False,
) -> Task:
    """Create a task with its conversation, first run and first events.

    Refused (nothing written) past the user's active-task limit `owner_limit` (ActiveTaskLimit),
    on a parent conversation that is gone or being deleted (ConversationNotFound), or past the
    parent's `parent_cap` live tasks (TaskLimit). `job` is the broker row of the first run's job
    (`queue.job_row`), written in the same transaction; `notify` tells the listening worker
    processes instead (`queue.workers_listen`), in the same transaction too.
    """
    if new.task_id is not None and not new.task_id:
        raise TaskError("tasks: Create requires an ID")
    now = timezone.now()
    conversation, run, task = _new_rows(new, now)
    try:
        _insert(new, conversation, run, task, parent_cap, owner_limit, job, notify)
    except IntegrityError as exc:
        if new.task_id and _names_task_id(exc):
            raise TaskError(f"tasks: duplicate task id {new.task_id}") from None
        raise
    return task


def _names_task_id(exc: IntegrityError) -> bool:
    """Whether an insert failed on the task id (PostgreSQL and SQLite spell it differently)."""
    return "agenttasks_task_pkey" in str(exc) or "agenttasks_task.id" in str(exc)


def _insert(
    new: NewTask,
    conversation: Conversation,
    run: Run,
    task: Task,
    parent_cap: int | None,
    owner_limit: int,
    job: dict[str, Any] | None,
    notify: bool,
) -> None:
    parent_id = new.parent_conversation_id
    if postgres.enabled():
        # The events the ORM path appends (the function numbers them after its locks).
        status = task_status_data(task, None)
        own = task.conversation_id
        events = [
            postgres.event(own, "message.user", _first_message(new), run.id, task.id),
            postgres.event(own, "task.status", status, run.id, task.id),
        ]
        if parent_id is not None:
            events.append(postgres.event(parent_id, "task.status", status, run.id, task.id))
        verdict = postgres.create(
            conversation,
            run,
            task,
            events,
            owner_limit=owner_limit,
            parent_cap=parent_cap or 0,
            job=job,
            notify=notify,
        )
        _refuse(verdict, owner_limit, parent_cap, parent_id)
        return
    with transaction.atomic():
        log = Log()
        check_active_limit(task.owner_id, owner_limit)
        if parent_id is not None:
            parent = lock_conversation(parent_id, log)
            if parent.deleting_at is not None:
                raise ConversationNotFound(parent_id)
            if parent_cap and live_count(parent_id) >= parent_cap:
                raise TaskLimit(parent_cap)
        conversation.save(force_insert=True)
        log.hold(conversation)
        task.save(force_insert=True)
        run.save(force_insert=True)
        _first_events(log, task, run, new)
        log.flush()
        if job is not None:
            queue.insert_job(job)
        if notify:
            queue.notify_workers()


def _new_rows(new: NewTask, now: datetime) -> tuple[Conversation, Run, Task]:
    task_id = new.task_id or ids.new_task_id()
    parent_id = new.parent_conversation_id
    label = new.label or default_label(new.input)
    source = TaskKind.DELEGATE if new.kind == TaskKind.DELEGATE else "task"
    conversation = Conversation(
        owner=new.owner,
        agent=new.agent,
        hidden=parent_id is not None,
        parent_id=parent_id,
        title=f"{new.kind or 'task'}: {label}" if parent_id is not None else "",
        metadata={"source": source, "taskId": task_id},
        created_at=now,
        updated_at=now,
    )
    run = Run(
        id=new.run_id or ids.new_run_id(),
        conversation=conversation,
        task_id=task_id,
        owner=new.owner,
        priority=new.priority,
        agent=new.agent,
        trigger=RunTrigger.INITIAL,
        input=new.input,
        attempt=1,
        queued_at=now,
        not_before=new.not_before if new.not_before and new.not_before > now else None,
        created_at=now,
    )
    task = Task(
        id=task_id,
        run=run,
        owner=new.owner,
        agent=new.agent,
        input=new.input,
        label=label,
        kind=new.kind,
        state=new.state,
        inherit=new.inherit or {},
        depth=new.depth,
        conversation=conversation,
        parent_conversation_id=parent_id,
        parent_run_id=new.parent_run_id,
        tool_call_id=new.tool_call_id,
        delegation_key=new.delegation_key,
        callback_url=new.callback_url or "",
        metadata=new.metadata or {},
        priority=new.priority,
        schedule_id=new.schedule_id,
        created_at=now,
        updated_at=now,
    )
    return conversation, run, task


def _first_events(log: Log, task: Task, run: Run, new: NewTask) -> None:
    log.add(
        task.conversation_id, "message.user", _first_message(new), run_id=run.id, task_id=task.id
    )
    task_status(log, task, None)


def _first_message(new: NewTask) -> dict[str, Any]:
    return user_message_data(new.input, "input", list(new.files) or None)


def _refuse(verdict: str, owner_limit: int, parent_cap: int | None, parent_id: str | None) -> None:
    if verdict == "owner_limit":
        raise ActiveTaskLimit(owner_limit)
    if verdict == "parent_gone":
        raise ConversationNotFound(parent_id or "")
    if verdict == "parent_cap":
        raise TaskLimit(parent_cap or 0)


@retried
def discard_spawn(task_id: str, reason: str = "the task could not be started") -> None:
    """Delete a spawned task whose launch failed, with its runs and hidden conversation.

    The parent's log keeps the card the spawn mirrored there, so it gets a closing
    `task.status` (to `failed`, with the reason): a UI following the parent never shows a task
    that no longer exists as still pending.
    """
    with transaction.atomic():
        task = (
            Task.objects.filter(pk=task_id)
            .only("id", "conversation_id", "parent_conversation_id", "run_id", "attempt")
            .first()
        )
        if task is None or task.parent_conversation_id is None:
            return
        try:
            log = Log()
            lock_conversation(task.parent_conversation_id, log)
            data = {
                "taskId": task.id,
                "from": TaskStatus.PENDING,
                "to": TaskStatus.FAILED,
                "runId": task.run_id,
                "attempt": task.attempt_no(),
                "error": reason,
                "reason": "launch failed",
            }
            log.add(
                task.parent_conversation_id,
                "task.status",
                data,
                run_id=task.run_id,
                task_id=task.id,
            )
            log.flush()
        except ConversationNotFound:
            pass
        Wakeup.objects.filter(task_id=task_id).delete()
        PendingAction.objects.filter(conversation_id=task.conversation_id).delete()
        Task.objects.filter(pk=task_id).delete()
        Run.objects.filter(conversation_id=task.conversation_id).delete()
        Conversation.objects.filter(pk=task.conversation_id, hidden=True).delete()


# --- pausing and answering -------------------------------------------------------------------


@retried
def pause(
    task_id: str,
    run_id: str,
    *,
    actions: Iterable[ActionRequest] = (),
    clarification: str | None = None,
    task_result: dict[str, Any] | None = None,
    escalated: bool = False,
) -> Task | None:
    """Pause a running task: on actions (run paused) or on a legacy clarification (run ends).

    `escalated` pauses the run with no action of its own: it waits on its delegate children's
    escalated actions.
    """
    now = timezone.now()
    with transaction.atomic():
        task = lock_task(task_id)
        run = task.run
        if (
            task.status != TaskStatus.RUNNING
            or task.run_id != run_id
            or run.status != RunStatus.RUNNING
            # A run told to stop never pauses for a person: it ends instead, even when its
            # runtime had not yet read the request when it asked.
            or run.stop_request
        ):
            return None
        log = Log()
        hold_task(log, task)
        actions = tuple(actions)
        if actions or escalated:
            run.status = RunStatus.PAUSED
            run.save(update_fields=["status"])
            create_actions(log, run, actions, now)
            if task_result is not None:
                write_result(task, run_id, task_result, partial=True)
        else:
            _clarify(log, task, run, clarification or "", task_result, now)
        set_status(task, TaskStatus.WAITING_FOR_INPUT)
        save_task(task, ["status"], now)
        task_status(log, task, TaskStatus.RUNNING)
        log.flush()
        return task


def _clarify(
    log: Log,
    task: Task,
    run: Run,
    question: str,
    task_result: dict[str, Any] | None,
    now: datetime,
) -> None:
    """End the run on a legacy clarification: the question is an agent comment."""
    metadata = dict((task_result or {}).get("metadata") or {})
    metadata["waitingForInput"] = True
    if question:
        log.add(
            task.conversation_id,
            "message.assistant",
            {"content": question},
            run_id=run.id,
            task_id=task.id,
        )
    run.status, run.output, run.ended_at = RunStatus.COMPLETED, question, now
    run.save(update_fields=["status", "output", "ended_at"])
    run_finished(log, run)
    add_comment(task, run.id, Comment.Role.AGENT, question, metadata)
    write_result(
        task,
        run.id,
        {**(task_result or {}), "content": question, "metadata": metadata},
        partial=True,
    )


@retried
def answer(task_id: str, run_id: str, action_id: str, resolution: dict[str, Any]) -> Task | None:
    """Settle an action of the paused current run; resume the run when none is left open.

    `resolution` holds `status` (approved, denied, answered or expired) and optionally
    `decided_by`, `comment`, `answers` and `args`. A stale answer closes the action unanswered.
    """
    now = timezone.now()
    with transaction.atomic():
        task = lock_task(task_id)
        action = lock_open_action(action_id)
        if action is None:
            return None
        run = task.run
        log = Log()
        hold_task(log, task)
        if not (
            task.status == TaskStatus.WAITING_FOR_INPUT
            and task.run_id == run_id
            and run.status == RunStatus.PAUSED
            and action.run_id == run_id
        ):
            # A stale answer is discarded, never retried: the action closes with its run.
            resolve_action(log, action, {"status": ActionStatus.CANCELLED}, now)
            log.flush()
            return None
        resolve_action(log, action, resolution, now)
        if not held(run):
            requeue_paused(log, run, now, task)
        log.flush()
        return task


# --- new runs of a task ----------------------------------------------------------------------


def retry_prompt(task: Task) -> str:
    """Build the retry run's input from the failed attempt's result or summary."""
    reason = (task.result or task.summary).strip()[: app_settings.SUMMARY_LIMIT]
    return RETRY_PROMPT.format(reason=reason or "no reason was recorded")


@retried
def retry_claim(
    task_id: str, new_run_id: str, max_attempts: int, cap: int | None, owner_limit: int = 0
) -> Task | None:
    """Re-open one failed attempt as a new run, under the attempt ceiling and the caps."""
    now = timezone.now()
    with transaction.atomic():
        check_active_limit(_owner_of(task_id), owner_limit)
        task = lock_task(task_id)
        if (
            task.status != TaskStatus.FAILED
            or (max_attempts > 0 and task.attempt_no() >= max_attempts)
            or task.conversation.deleting_at is not None
        ):
            return None
        log = Log()
        hold_task(log, task, parent=False)
        if task.parent_conversation_id:
            parent = lock_conversation(task.parent_conversation_id)
            if parent.deleting_at is not None or (
                cap is not None and cap > 0 and live_count(parent.id) >= cap
            ):
                return None
            log.hold(parent)
        prompt = retry_prompt(task)
        task.attempt = task.attempt_no() + 1
        run = new_run(task, new_run_id, RunTrigger.RETRY, prompt, now)
        move_to_new_run(task, run, now, "attempt")
        user_message(log, task.conversation_id, prompt, "retry", run_id=run.id, task_id=task.id)
        task_status(log, task, TaskStatus.FAILED)
        log.flush()
        return task


def _owner_of(task_id: str) -> int | None:
    """The owner of a task, read before its lock (the user's lock comes first; it never changes)."""
    return Task.objects.filter(pk=task_id).values_list("owner_id", flat=True).first()


@retried
def advance(
    task_id: str, run_id: str, next_run_id: str, *, input: str = "", state: Any = None
) -> Task | None:
    """Chain the next run of a multi-run job under the same task and attempt."""
    now = timezone.now()
    with transaction.atomic():
        task = lock_task(task_id)
        if (
            task.status not in (TaskStatus.PENDING, TaskStatus.RUNNING)
            or task.run_id != run_id
            or task.conversation.deleting_at is not None
        ):
            return None
        if next_run_id == run_id:
            if state is not None:
                task.state = state
                save_task(task, ["state"], now)
            return task
        log = Log()
        hold_task(log, task)
        previous = task.status
        run = new_run(task, next_run_id, RunTrigger.CONTINUATION, input, now)
        task.run = run
        set_status(task, TaskStatus.PENDING)
        task.continuations += 1
        if state is not None:
            task.state = state
        save_task(task, ["run", "status", "continuations", "state"], now)
        user_message(
            log, task.conversation_id, input, "continuation", run_id=run.id, task_id=task.id
        )
        task_status(log, task, previous)
        log.flush()
        return task


@retried
def reopen(
    task_id: str,
    new_run_id: str,
    content: str,
    *,
    trigger: str = RunTrigger.COMMENT,
    author: Any = None,
    metadata: dict[str, Any] | None = None,
    origin: str = "comment",
    files: list[Any] | None = None,
    notification_task_ids: list[Any] | None = None,
    owner_limit: int = 0,
    answering: str | None = None,
) -> Task | None:
    """Re-open a finished task (or one waiting on a clarification) on a new run, same attempt.

    A `comment` or `message` trigger records a user Comment (returned as `task.new_comment`);
    a `wakeup` trigger writes the content as a task.notification event. `answering` binds it to
    the clarification that run asked: None unless the task still waits on it.
    """
    now = timezone.now()
    with transaction.atomic():
        if owner_limit:
            lock_principal(_owner_of(task_id))
        task = lock_task(task_id)
        if task.conversation.deleting_at is not None:
            return None
        waiting_on_clarification = (
            task.status == TaskStatus.WAITING_FOR_INPUT and task.run.status != RunStatus.PAUSED
        )
        if task.status not in TERMINAL and not waiting_on_clarification:
            return None
        if answering is not None and not (waiting_on_clarification and task.run_id == answering):
            return None
        if task.status in TERMINAL and over_limit(task.owner_id, owner_limit):
            raise ActiveTaskLimit(owner_limit)
        log = Log()
        hold_task(log, task)
        previous = task.status
        run = new_run(task, new_run_id, trigger, content, now)
        move_to_new_run(task, run, now)
        task.new_comment = None
        if trigger == RunTrigger.WAKEUP:
            data = {"content": content, "taskIds": notification_task_ids or []}
            log.add(task.conversation_id, "task.notification", data, run_id=run.id, task_id=task.id)
        else:
            task.new_comment = add_comment(
                task, run.id, Comment.Role.USER, content, metadata, author
            )
            user_message(
                log,
                task.conversation_id,
                content,
                origin,
                run_id=run.id,
                task_id=task.id,
                files=files,
                comment_id=task.new_comment.id,
                metadata=metadata,
            )
        task_status(log, task, previous)
        log.flush()
        return task


# --- stopping and progress -------------------------------------------------------------------


@retried
def request_stop(task_id: str, run_id: str, *, graceful: bool) -> StopOutcome:
    """Ask the current run to stop, and say what stopping it takes."""
    now = timezone.now()
    with transaction.atomic():
        task = lock_task(task_id)
        if task.status not in LIVE or task.run_id != run_id:
            return StopOutcome.MOVED
        run = task.run
        if run.status in (RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED):
            return StopOutcome.ALREADY_FINISHED
        seen = run.heartbeat_at or run.started_at
        alive = seen is not None and seen > now - timedelta(seconds=app_settings.LEASE_TIMEOUT)
        if run.status != RunStatus.RUNNING or not alive:
            return StopOutcome.UNKNOWN_RUN
        wanted = StopRequest.AFTER_TURN if graceful else StopRequest.NOW
        if run.stop_request != StopRequest.NOW and run.stop_request != wanted:
            run.stop_request = wanted
            run.save(update_fields=["stop_request"])
        if run.stop_request == StopRequest.NOW:
            return StopOutcome.CANCELLED
        return StopOutcome.AFTER_TURN


@retried
def record_progress(run_id: str, state: Any, rendered: str) -> bool:
    """Record a running run's progress state; a task's run appends task.progress (mirrored)."""
    with transaction.atomic():
        task = lock_task_of_run(run_id)
        if task is None:
            return bool(
                Run.objects.filter(pk=run_id, status=RunStatus.RUNNING).update(progress=state)
            )
        # A task stopped at once has ended while its run still winds down: its progress is over.
        if task.status != TaskStatus.RUNNING or task.run.status != RunStatus.RUNNING:
            return False
        log = Log()
        hold_task(log, task)
        task.run.progress = state
        task.run.save(update_fields=["progress"])
        data = {"taskId": task.id, "runId": run_id, "progress": rendered, "state": state}
        log.add(task.conversation_id, "task.progress", data, run_id=run_id, task_id=task.id)
        if task.parent_conversation_id is not None and log.holds(task.parent_conversation_id):
            log.add(
                task.parent_conversation_id,
                "task.progress",
                dict(data),
                run_id=run_id,
                task_id=task.id,
            )
        log.flush()
        return True
