"""The only writer of task and run statuses: every transition is one compare-and-set transaction.

Each operation locks its rows with `select_for_update()`, re-checks its predicate (the allowed
statuses and the run id the caller observed) on the locked rows, writes, appends its events in the
same transaction, and answers whether it won. A won operation returns the row as written (truthy:
the snapshot signals are built from); a lost one returns False. An unknown id raises.

Lock order, always (children before parents, so no two writers wait on each other in a circle):
the task, its own conversation and its current run, taken by one statement; then the parent
conversation; then actions and wake-ups. A run without a task is guarded by its conversation's
row. Inserting an event moves the conversation's `last_seq` by a database trigger, so the next
seq is read from the conversation row the writer holds.
"""

import hashlib
import logging
from collections.abc import Iterable
from datetime import timedelta

from django.db import models, transaction
from django.db.models import Q
from django.utils import timezone

from . import ids
from .conf import app_settings
from .exceptions import ConversationNotFound, RunNotFound, TaskError, TaskLimit, TaskNotFound
from .listen import conversation_key, hub
from .models import Comment, Conversation, Event, File, PendingAction, Run, Task, TaskResult, Wakeup
from .states import (
    LIVE,
    RUN_ACTIVE,
    RUN_ENDED,
    TERMINAL,
    ActionStatus,
    RunStatus,
    RunTrigger,
    StopRequest,
    TaskStatus,
    WakeupState,
)
from .types import ActionRequest, RunOutcome, StopOutcome

logger = logging.getLogger(__name__)

ORPHAN_TEXT = "The server stopped while the task was running"
DELEGATE = "delegate"
RETRY_PROMPT = (
    "A previous attempt at this task failed: {reason}. The conversation above is the progress "
    "made so far. Review it and continue the task to completion; avoid repeating work that "
    "already succeeded."
)


class Log:
    """Events appended in the current transaction, numbered from the locked conversations."""

    def __init__(self):
        self.rows: list[Event] = []
        self._seq: dict[str, int] = {}

    def hold(self, conversation: Conversation) -> None:
        """Number this conversation's events after its seq (its row must be locked)."""
        self._seq.setdefault(conversation.id, conversation.last_seq)

    def holds(self, conversation_id: str | None) -> bool:
        return conversation_id in self._seq

    def add(self, conversation_id: str, type: str, data: dict, *, run_id="", task_id="") -> Event:
        seq = self._seq[conversation_id] + 1
        self._seq[conversation_id] = seq
        event = Event(
            conversation_id=conversation_id,
            seq=seq,
            type=type,
            run_id=run_id or "",
            task_id=task_id or "",
            data=data,
        )
        self.rows.append(event)
        return event

    def flush(self) -> None:
        if self.rows:
            Event.objects.bulk_create(self.rows)
            # Stream readers in this process hear of the events at commit (other processes hear
            # the database's NOTIFY, or poll).
            for conversation_id in {row.conversation_id for row in self.rows}:
                transaction.on_commit(lambda c=conversation_id: hub.publish(conversation_key(c)))
            self.rows = []


# --- locking ---------------------------------------------------------------------------------


def _task_rows():
    return Task.objects.select_related("conversation", "run").select_for_update(
        no_key=True, of=("self", "conversation", "run")
    )


def _lock_task(task_id: str) -> Task:
    while True:
        task = _task_rows().filter(pk=task_id).first()
        if task is not None:
            return task
        # On PostgreSQL a statement that waited for the lock re-checks the join with the rows it
        # locked: if the writer it waited for moved the task to a new run, the old run no longer
        # joins and the task looks absent. A new statement sees the committed state.
        if not Task.objects.filter(pk=task_id).exists():
            raise TaskNotFound()


def _run_rows():
    """Runs locked with their conversation (its row guards a run that has no task)."""
    return Run.objects.select_related("conversation").select_for_update(
        no_key=True, of=("conversation", "self")
    )


def _lock_run(run_id: str) -> Run:
    try:
        return _run_rows().get(pk=run_id)
    except Run.DoesNotExist:
        raise RunNotFound() from None


def _lock_open_action(action_id: str) -> PendingAction | None:
    """Lock an action that is still pending; None when it is gone or already settled."""
    action = PendingAction.objects.select_for_update().filter(pk=action_id).first()
    return action if action is not None and action.status == ActionStatus.PENDING else None


def lock_task(task_id: str) -> Task:
    """Lock a task (with its conversation and current run) inside the caller's transaction."""
    return _lock_task(task_id)


def _lock_conversation(conversation_id: str) -> Conversation:
    return Conversation.objects.select_for_update(no_key=True).get(pk=conversation_id)


def _hold_task(log: Log, task: Task, *, parent: bool = True) -> None:
    """Hold the task's conversation (already locked) and, when asked, lock its parent's."""
    log.hold(task.conversation)
    if parent and task.parent_conversation_id and not log.holds(task.parent_conversation_id):
        log.hold(_lock_conversation(task.parent_conversation_id))


def lock_conversation(conversation_id: str, log: Log | None = None) -> Conversation:
    """Lock a conversation row inside the caller's transaction (for its own writers)."""
    try:
        conversation = _lock_conversation(conversation_id)
    except Conversation.DoesNotExist:
        raise ConversationNotFound() from None
    if log is not None:
        log.hold(conversation)
    return conversation


# --- events ----------------------------------------------------------------------------------


def _task_status(log: Log, task: Task, previous: str | None, reason: str = "") -> None:
    """Append the task.status event to the task's log and mirror it to its parent's."""
    data = {"taskId": task.id}
    if previous is not None:
        data["from"] = previous
    data.update({"to": task.status, "runId": task.run_id, "attempt": task.attempt_no()})
    if task.status == TaskStatus.FAILED and task.error:
        data["error"] = task.error
    if reason:
        data["reason"] = reason
    log.add(task.conversation_id, "task.status", data, run_id=task.run_id, task_id=task.id)
    if log.holds(task.parent_conversation_id):
        log.add(
            task.parent_conversation_id,
            "task.status",
            dict(data),
            run_id=task.run_id,
            task_id=task.id,
        )


def _run_finished(log: Log, run: Run) -> None:
    data = {"status": run.status}
    if run.error:
        data["error"] = run.error
    if run.usage is not None:
        data["usage"] = run.usage
    log.add(run.conversation_id, "run.finished", data, run_id=run.id, task_id=run.task_id or "")


def user_message(
    log: Log,
    conversation_id: str,
    content: str,
    origin: str,
    *,
    run_id="",
    task_id="",
    files=None,
    comment_id=None,
    metadata=None,
) -> Event:
    """Append a message.user event."""
    data = {"content": content, "origin": origin}
    if files:
        data["files"] = files
    if comment_id:
        data["commentId"] = comment_id
    if metadata:
        data["metadata"] = metadata
    return log.add(conversation_id, "message.user", data, run_id=run_id, task_id=task_id)


def append_events(
    conversation_id: str, events: Iterable[tuple[str, dict, str, str]]
) -> list[Event]:
    """Append (type, data, run_id, task_id) events to a conversation in one short transaction."""
    with transaction.atomic():
        log = Log()
        lock_conversation(conversation_id, log)
        added = [log.add(conversation_id, t, d, run_id=r, task_id=k) for t, d, r, k in events]
        log.flush()
    return added


# --- helpers ---------------------------------------------------------------------------------


def _alive(run: Run, now) -> bool:
    seen = run.heartbeat_at or run.started_at
    return seen is not None and seen > now - timedelta(seconds=app_settings.LEASE_TIMEOUT)


def _new_run(task: Task, run_id: str, trigger: str, input: str, now) -> Run:
    return Run.objects.create(
        id=run_id,
        conversation_id=task.conversation_id,
        task_id=task.id,
        agent=task.agent,
        trigger=trigger,
        input=input,
        attempt=task.attempt_no(),
        status=RunStatus.QUEUED,
        queued_at=now,
    )


def _owes_wakeup(task: Task) -> bool:
    return bool(task.parent_conversation_id) and task.kind != DELEGATE


def _write_debt(task: Task, run_id: str, status: str) -> None:
    truncated = len(task.result.encode("utf-8")) > len(task.summary.encode("utf-8"))
    Wakeup.objects.create(
        conversation_id=task.parent_conversation_id,
        task_id=task.id,
        run_id=run_id,
        status=status,
        label=task.label,
        summary=task.summary,
        truncated=truncated,
    )


def _drop_debt(task: Task, now) -> None:
    Wakeup.objects.filter(task_id=task.id, state=WakeupState.PENDING).update(
        state=WakeupState.DROPPED, settled_at=now
    )


RESULT_FIELDS = ["run_id", "content", "partial", "files", "metadata", "usage", "created_at"]


def _write_result(task: Task, run_id: str, result: dict, *, partial: bool = False) -> None:
    """Write the task's one result, replacing an older one (one upsert statement)."""
    row = TaskResult(
        task_id=task.id,
        run_id=run_id,
        content=result.get("content") or "",
        partial=partial or result.get("partial", False),
        files=result.get("files") or [],
        metadata=result.get("metadata") or {},
        usage=result.get("usage"),
        created_at=timezone.now(),
    )
    TaskResult.objects.bulk_create(
        [row], update_conflicts=True, unique_fields=["task"], update_fields=RESULT_FIELDS
    )


def _cancel_open_actions(log: Log, run: Run, now, status=ActionStatus.CANCELLED) -> None:
    actions = list(PendingAction.objects.filter(run_id=run.id, status=ActionStatus.PENDING))
    for action in actions:
        action.status, action.decided_at = status, now
        log.add(
            action.conversation_id,
            "action.resolved",
            {"actionId": action.id, "kind": action.kind, "status": status},
            run_id=run.id,
            task_id=action.task_id or "",
        )
    if actions:
        PendingAction.objects.bulk_update(actions, ["status", "decided_at"])


def _end_run(run: Run, status: str, now, error: str = "") -> None:
    run.status, run.ended_at, run.error = status, now, error
    run.save(update_fields=["status", "ended_at", "error"])


def retry_prompt(task: Task) -> str:
    """Build the retry run's input from the failed attempt's result or summary."""
    reason = (task.result or task.summary).strip()[: app_settings.SUMMARY_LIMIT]
    return RETRY_PROMPT.format(reason=reason or "no reason was recorded")


def delegation_key(agent: str, prompt: str) -> str:
    """Return the SHA-256 key that makes identical `task` calls reattach."""
    return hashlib.sha256(f"{agent}:{prompt}".encode()).hexdigest()


def _save_task(task: Task, fields: list[str], now) -> None:
    task.updated_at = now
    task.version += 1
    task.save(update_fields=[*fields, "updated_at", "version"])


def live_count(conversation_id: str) -> int:
    """Count the live tasks spawned from a conversation (delegates do not count)."""
    return (
        Task.objects.filter(parent_conversation_id=conversation_id, status__in=LIVE)
        .exclude(kind=DELEGATE)
        .count()
    )


# --- operations ------------------------------------------------------------------------------


def create_task(
    *,
    task_id: str | None = None,
    parent_conversation: Conversation | str | None = None,
    owner=None,
    agent: str,
    input: str,
    label: str = "",
    kind: str = "",
    state=None,
    inherit: dict | None = None,
    depth: int = 1,
    parent_run=None,
    tool_call_id: str = "",
    cap: int | None = None,
    callback_url: str = "",
    metadata: dict | None = None,
    files: list | None = None,
    delegation_key: str = "",
    run_id: str | None = None,
) -> Task:
    """Create a task with its conversation, first run and first events; enforce the cap."""
    if task_id is not None and not task_id:
        raise TaskError("tasks: Create requires an ID")
    task_id = task_id or ids.new_task_id()
    parent_id = getattr(parent_conversation, "pk", parent_conversation)
    label = label or input[:60]
    now = timezone.now()
    with transaction.atomic():
        log = Log()
        if parent_id is not None:
            try:
                parent = _lock_conversation(parent_id)
            except Conversation.DoesNotExist:
                raise ConversationNotFound() from None
            if parent.deleting_at is not None:
                raise ConversationNotFound()
            if cap is not None and cap > 0 and live_count(parent_id) >= cap:
                raise TaskLimit(cap)
            log.hold(parent)
        if Task.objects.filter(pk=task_id).exists():
            raise TaskError(f"tasks: duplicate task id {task_id}")
        source = DELEGATE if kind == DELEGATE else "task"
        conversation = Conversation.objects.create(
            owner=owner,
            agent=agent,
            hidden=parent_id is not None,
            parent_id=parent_id,
            title=f"{kind or 'task'}: {label}" if parent_id is not None else "",
            metadata={"source": source, "taskId": task_id},
        )
        log.hold(conversation)
        run = Run(
            id=run_id or ids.new_run_id(),
            conversation=conversation,
            task_id=task_id,
            agent=agent,
            trigger=RunTrigger.INITIAL,
            input=input,
            attempt=1,
            queued_at=now,
        )
        task = Task(
            id=task_id,
            run=run,
            owner=owner,
            agent=agent,
            input=input,
            label=label,
            kind=kind,
            state=state,
            inherit=inherit or {},
            depth=depth,
            conversation=conversation,
            parent_conversation_id=parent_id,
            parent_run_id=getattr(parent_run, "pk", parent_run),
            tool_call_id=tool_call_id,
            delegation_key=delegation_key,
            callback_url=callback_url or "",
            metadata=metadata or {},
            created_at=now,
            updated_at=now,
        )
        task.save(force_insert=True)
        run.save(force_insert=True)
        user_message(
            log, conversation.id, input, "input", run_id=run.id, task_id=task_id, files=files
        )
        _task_status(log, task, None)
        log.flush()
    return task


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
        if task is None:
            return
        parent = (
            Conversation.objects.select_for_update(no_key=True)
            .filter(pk=task.parent_conversation_id)
            .first()
        )
        if parent is not None:
            log = Log()
            log.hold(parent)
            data = {
                "taskId": task.id,
                "from": TaskStatus.PENDING,
                "to": TaskStatus.FAILED,
                "runId": task.run_id,
                "attempt": task.attempt_no(),
                "error": reason,
                "reason": "launch failed",
            }
            log.add(parent.id, "task.status", data, run_id=task.run_id, task_id=task.id)
            log.flush()
        Wakeup.objects.filter(task_id=task_id).delete()
        PendingAction.objects.filter(conversation_id=task.conversation_id).delete()
        Task.objects.filter(pk=task_id).delete()
        Run.objects.filter(conversation_id=task.conversation_id).delete()
        Conversation.objects.filter(pk=task.conversation_id, hidden=True).delete()


def claim(run_id: str, worker: str = "") -> Run | bool:
    """Move a queued run (and its task) to running; False if it is no longer the one to run."""
    now = timezone.now()
    with transaction.atomic():
        task = _task_rows().filter(run_id=run_id).first()
        if task is None:
            return _claim_taskless(run_id, worker, now)
        run = task.run
        if (
            run.status != RunStatus.QUEUED
            or task.status != TaskStatus.PENDING
            or task.conversation.deleting_at is not None
        ):
            return False
        log = Log()
        _hold_task(log, task)
        first = run.started_at is None
        run.status, run.worker, run.heartbeat_at = RunStatus.RUNNING, worker, now
        run.started_at = run.started_at or now
        run.save(update_fields=["status", "worker", "heartbeat_at", "started_at"])
        task.status = TaskStatus.RUNNING
        task.started_at = task.started_at or now
        _save_task(task, ["status", "started_at"], now)
        if first:
            data = {"trigger": _trigger_name(run.trigger), "attempt": run.attempt}
            log.add(run.conversation_id, "run.started", data, run_id=run.id, task_id=task.id)
        _task_status(log, task, TaskStatus.PENDING)
        log.flush()
        run.task = task
        return run


def _trigger_name(trigger: str) -> str:
    return "create" if trigger == RunTrigger.INITIAL else trigger


def _claim_taskless(run_id: str, worker: str, now) -> Run | bool:
    run = _lock_run(run_id)
    if run.status != RunStatus.QUEUED:
        return False
    if run.task_id is not None or run.conversation.deleting_at is not None:
        # Housekeeping: a queued run its task left (or on a dying conversation) never runs.
        _end_run(run, RunStatus.CANCELLED, now)
        return False
    log = Log()
    log.hold(run.conversation)
    first = run.started_at is None
    run.status, run.worker, run.heartbeat_at = RunStatus.RUNNING, worker, now
    run.started_at = run.started_at or now
    run.save(update_fields=["status", "worker", "heartbeat_at", "started_at"])
    if first:
        log.add(run.conversation_id, "run.started", {"trigger": run.trigger}, run_id=run.id)
    log.flush()
    return run


def record_run_end(run_id: str, outcome: RunOutcome) -> Run | bool:
    """Record how a running (or paused) run ended; the task row is not touched."""
    now = timezone.now()
    with transaction.atomic():
        run = _lock_run(run_id)
        if run.status not in (RunStatus.RUNNING, RunStatus.PAUSED):
            return False
        log = Log()
        log.hold(run.conversation)
        _record_end(log, run, outcome, now)
        log.flush()
        return run


def _record_end(log: Log, run: Run, outcome: RunOutcome, now) -> None:
    """Write a locked run's ending: its status, output and usage, and its events."""
    if run.status == RunStatus.PAUSED and outcome.status != "input_required":
        _cancel_open_actions(log, run, now)  # a paused run that ends leaves nothing open
    _record_usage(run, outcome.usage)
    if outcome.text and outcome.append_message:
        data = {"content": outcome.text}
        if outcome.usage:
            data["usage"] = run.usage
        log.add(
            run.conversation_id, "message.assistant", data, run_id=run.id, task_id=run.task_id or ""
        )
    run.output, run.graceful_stop, run.ended_at = outcome.text, outcome.graceful_stop, now
    if outcome.status == "input_required" and run.task_id is None:
        # A conversation run pauses the way mark_input_required pauses a task's run.
        run.status, run.ended_at = RunStatus.PAUSED, None
        _create_actions(log, run, outcome.actions, now)
    elif run.stop_request == StopRequest.NOW:
        # Told to stop now: whatever it reports afterwards is a late ending, discarded.
        run.status, run.error = RunStatus.CANCELLED, ""
        _run_finished(log, run)
    else:
        run.status = outcome.status if outcome.status in RUN_ENDED else RunStatus.COMPLETED
        run.error = outcome.error if run.status == RunStatus.FAILED else ""
        _run_finished(log, run)
    run.save()


def finish_run(
    task_id: str, run_id: str, outcome: RunOutcome, decide
) -> tuple[Run | bool, Task | bool]:
    """Record a task run's ending and finalize the task in one transaction.

    `decide(task, run)` sees the locked rows with the ending recorded and returns the keyword
    arguments of the finalize (status, summary, result, error, state, task_result, reason), or
    None to leave the task as it is. Returns (the run if its ending was recorded, else False;
    the task as written if the finalize won, else False).
    """
    now = timezone.now()
    with transaction.atomic():
        task = _lock_task(task_id)
        if task.run_id != run_id:
            return record_run_end(run_id, outcome), False  # a run its task has left
        log = Log()
        _hold_task(log, task)
        run = task.run
        recorded = run.status in (RunStatus.RUNNING, RunStatus.PAUSED)
        if recorded:
            _record_end(log, run, outcome, now)
        ending = decide(task, run)
        won = _finalize_locked(log, task, run_id, now=now, **ending) if ending else False
        log.flush()
        return (run if recorded else False), won


def _record_usage(run: Run, usage: dict | None) -> None:
    if not usage:
        return
    run.usage_known = True
    run.prompt_tokens = int(usage.get("inputTokens", usage.get("prompt_tokens", 0)) or 0)
    run.completion_tokens = int(usage.get("outputTokens", usage.get("completion_tokens", 0)) or 0)
    total = usage.get("totalTokens", usage.get("total_tokens"))
    run.total_tokens = (
        int(total) if total is not None else run.prompt_tokens + run.completion_tokens
    )


def _create_actions(
    log: Log, run: Run, requests: Iterable[ActionRequest], now
) -> list[PendingAction]:
    actions = []
    for request in requests:
        action = PendingAction.objects.create(
            conversation_id=run.conversation_id,
            run=run,
            task_id=run.task_id,
            kind=request.kind,
            tool_name=request.tool_name,
            tool_call_id=request.tool_call_id,
            args=request.args,
            questions=request.questions,
            prompt=request.prompt,
            deadline=request.deadline,
            on_timeout=request.on_timeout,
        )
        log.add(
            run.conversation_id,
            "action.requested",
            {"action": action.as_payload()},
            run_id=run.id,
            task_id=run.task_id or "",
        )
        actions.append(action)
    return actions


def mark_input_required(
    task_id: str,
    run_id: str,
    *,
    actions: Iterable[ActionRequest] = (),
    clarification: str | None = None,
    task_result: dict | None = None,
    escalated: bool = False,
) -> Task | bool:
    """Pause a running task: on actions (run paused) or on a legacy clarification (run ends).

    `escalated` pauses the run with no action of its own: it waits on its delegate children's
    escalated actions (spec/delegation.md §4.8).
    """
    now = timezone.now()
    with transaction.atomic():
        task = _lock_task(task_id)
        run = task.run
        if (
            task.status != TaskStatus.RUNNING
            or task.run_id != run_id
            or run.status != RunStatus.RUNNING
            # A run told to stop never pauses for a person: it ends instead (lifecycle §3.14.4),
            # even when its runtime had not yet read the request when it asked.
            or run.stop_request
        ):
            return False
        log = Log()
        _hold_task(log, task)
        actions = tuple(actions)
        if actions or escalated:
            run.status = RunStatus.PAUSED
            run.save(update_fields=["status"])
            _create_actions(log, run, actions, now)
            if task_result is not None:
                _write_result(task, run_id, task_result, partial=True)
        else:
            question = clarification or ""
            metadata = dict((task_result or {}).get("metadata") or {})
            metadata["waitingForInput"] = True
            if question:
                log.add(
                    task.conversation_id,
                    "message.assistant",
                    {"content": question},
                    run_id=run_id,
                    task_id=task.id,
                )
            run.status, run.output, run.ended_at = RunStatus.COMPLETED, question, now
            run.save(update_fields=["status", "output", "ended_at"])
            _run_finished(log, run)
            Comment.objects.create(
                task=task,
                role=Comment.Role.AGENT,
                content=question,
                metadata=metadata,
                run_id=run_id,
            )
            _write_result(
                task,
                run_id,
                {**(task_result or {}), "content": question, "metadata": metadata},
                partial=True,
            )
        task.status = TaskStatus.WAITING_FOR_INPUT
        _save_task(task, ["status"], now)
        _task_status(log, task, TaskStatus.RUNNING)
        log.flush()
        return task


def reclaim_working(task_id: str, run_id: str, action_id: str, resolution: dict) -> Task | bool:
    """Resolve an action of the paused current run; resume the run when none is left open.

    `resolution` holds `status` (approved, denied, answered or expired) and optionally
    `decided_by`, `comment`, `answers` and `args`.
    """
    now = timezone.now()
    with transaction.atomic():
        task = _lock_task(task_id)
        run = task.run
        try:
            action = PendingAction.objects.select_for_update().get(pk=action_id)
        except PendingAction.DoesNotExist:
            return False
        log = Log()
        _hold_task(log, task)
        current = (
            task.status == TaskStatus.WAITING_FOR_INPUT
            and task.run_id == run_id
            and run.status == RunStatus.PAUSED
            and action.run_id == run_id
        )
        if action.status != ActionStatus.PENDING:
            return False
        if not current:
            # A stale answer is discarded, never retried: the action closes with its run.
            _resolve_action(log, action, {"status": ActionStatus.CANCELLED}, now)
            log.flush()
            return False
        _resolve_action(log, action, resolution, now)
        still_open = PendingAction.objects.filter(
            run_id=run_id, status=ActionStatus.PENDING
        ).exists() or escalations_open(run)
        if not still_open:
            run.status, run.queued_at = RunStatus.QUEUED, now
            run.save(update_fields=["status", "queued_at"])
            task.status = TaskStatus.PENDING
            _save_task(task, ["status"], now)
            _task_status(log, task, TaskStatus.WAITING_FOR_INPUT)
        log.flush()
        return task


def _resolve_action(log: Log, action: PendingAction, resolution: dict, now) -> None:
    action.status = resolution["status"]
    action.decided_at = now
    action.decided_by = resolution.get("decided_by")
    action.resolution = {
        k: v for k, v in resolution.items() if k not in ("status", "decided_by")
    } or None
    action.save(update_fields=["status", "decided_at", "decided_by", "resolution"])
    data = {"actionId": action.id, "kind": action.kind, "status": action.status}
    if action.decided_by_id is not None:
        data["decidedBy"] = str(action.decided_by_id)
    if resolution.get("comment"):
        data["comment"] = resolution["comment"]
    if resolution.get("answers") is not None:
        data["answers"] = resolution["answers"]
    log.add(
        action.conversation_id,
        "action.resolved",
        data,
        run_id=action.run_id,
        task_id=action.task_id or "",
    )


def finalize(
    task_id: str,
    run_id: str,
    status: str,
    *,
    summary: str = "",
    result: str = "",
    error: str = "",
    state=None,
    task_result: dict | None = None,
    reason: str = "",
) -> Task | bool:
    """End a live task on its current run: completed, failed or cancelled, with its debt."""
    if status not in TERMINAL:
        raise ValueError(f"finalize needs a terminal status, not {status!r}")
    now = timezone.now()
    with transaction.atomic():
        task = _lock_task(task_id)
        log = Log()
        won = _finalize_locked(
            log,
            task,
            run_id,
            status,
            summary=summary,
            result=result,
            error=error,
            state=state,
            task_result=task_result,
            reason=reason,
            now=now,
        )
        log.flush()
        return won


def _finalize_locked(
    log: Log,
    task: Task,
    run_id: str,
    status: str,
    *,
    summary="",
    result="",
    error="",
    state=None,
    task_result=None,
    reason="",
    now,
) -> Task | bool:
    """Finalize a locked task on its current run (the body of `finalize`)."""
    if task.status not in LIVE or task.run_id != run_id:
        return False
    _hold_task(log, task)
    run = task.run
    if run.status in (RunStatus.QUEUED, RunStatus.PAUSED):
        if run.status == RunStatus.PAUSED:
            _cancel_open_actions(log, run, now)
        _end_run(run, status, now, error=(error or result) if status == TaskStatus.FAILED else "")
        _run_finished(log, run)
    elif run.status == RunStatus.RUNNING and run.stop_request != StopRequest.NOW:
        # Ended from outside (a stop, the reaper, a timeout): the worker aborts.
        run.stop_request = StopRequest.NOW
        run.save(update_fields=["stop_request"])
    previous = task.status
    task.status = status
    if summary:
        task.summary = summary
    if result:
        task.result = result
    task.error = (error or result) if status == TaskStatus.FAILED else ""
    if state is not None:
        task.state = state
    task.stop_reason = reason
    task.finished_at = now
    _save_task(
        task, ["status", "summary", "result", "error", "state", "stop_reason", "finished_at"], now
    )
    if task_result is not None:
        _write_result(task, run_id, task_result)
    if status != TaskStatus.CANCELLED and _owes_wakeup(task):
        _write_debt(task, run_id, status)
    _task_status(log, task, previous, reason)
    return task


def retry_claim(task_id: str, new_run_id: str, max_attempts: int, cap: int | None) -> Task | bool:
    """Re-open one failed attempt as a new run, under the attempt ceiling and the parent's cap."""
    now = timezone.now()
    with transaction.atomic():
        task = _lock_task(task_id)
        log = Log()
        if task.status != TaskStatus.FAILED:
            return False
        if max_attempts > 0 and task.attempt_no() >= max_attempts:
            return False
        if task.conversation.deleting_at is not None:
            return False
        _hold_task(log, task, parent=False)
        if task.parent_conversation_id:
            parent = _lock_conversation(task.parent_conversation_id)
            if parent.deleting_at is not None:
                return False
            if cap is not None and cap > 0 and live_count(parent.id) >= cap:
                return False
            log.hold(parent)
        prompt = retry_prompt(task)
        task.attempt = task.attempt_no() + 1
        run = _new_run(task, new_run_id, RunTrigger.RETRY, prompt, now)
        _move_to_new_run(task, run, now, "attempt")
        user_message(log, task.conversation_id, prompt, "retry", run_id=run.id, task_id=task.id)
        _task_status(log, task, TaskStatus.FAILED)
        log.flush()
        return task


def _move_to_new_run(task: Task, run: Run, now, *more_fields: str) -> None:
    """Point a task at a new queued run: pending, its last outcome, debt and result cleared."""
    task.run = run
    task.status = TaskStatus.PENDING
    task.summary = task.result = task.error = task.stop_reason = ""
    task.continuations = 0
    task.finished_at = task.started_at = None
    fields = ["run", "status", "summary", "result", "error", "stop_reason", "continuations"]
    _save_task(task, [*fields, "finished_at", "started_at", *more_fields], now)
    _drop_debt(task, now)  # the task is no longer finished: its next ending owes afresh
    TaskResult.objects.filter(task_id=task.id).delete()


def release_retry_claim(task_id: str, run_id: str, summary: str, result: str) -> Task | bool:
    """Give back a retry whose run could not start: failed again, the attempt rolled back."""
    now = timezone.now()
    with transaction.atomic():
        task = _lock_task(task_id)
        if task.status not in (TaskStatus.PENDING, TaskStatus.RUNNING) or task.run_id != run_id:
            return False
        log = Log()
        _hold_task(log, task)
        run = task.run
        if run.status not in RUN_ENDED:
            _end_run(run, RunStatus.FAILED, now, error=result)
            _run_finished(log, run)
        previous = task.status
        task.status = TaskStatus.FAILED
        task.attempt = max(task.attempt_no() - 1, 1)
        task.summary, task.result, task.error = summary, result, result
        task.finished_at = now
        _save_task(task, ["status", "attempt", "summary", "result", "error", "finished_at"], now)
        if _owes_wakeup(task):
            _write_debt(task, run_id, TaskStatus.FAILED)
        _task_status(log, task, previous)
        log.flush()
        return task


def advance(
    task_id: str, run_id: str, next_run_id: str, *, input: str = "", state=None
) -> Task | bool:
    """Chain the next run of a multi-run job under the same task and attempt."""
    now = timezone.now()
    with transaction.atomic():
        task = _lock_task(task_id)
        if (
            task.status not in (TaskStatus.PENDING, TaskStatus.RUNNING)
            or task.run_id != run_id
            or task.conversation.deleting_at is not None
        ):
            return False
        if next_run_id == run_id:
            if state is not None:
                task.state = state
                _save_task(task, ["state"], now)
            return task
        log = Log()
        _hold_task(log, task)
        previous = task.status
        run = _new_run(task, next_run_id, RunTrigger.CONTINUATION, input, now)
        task.run, task.status = run, TaskStatus.PENDING
        task.continuations += 1
        if state is not None:
            task.state = state
        _save_task(task, ["run", "status", "continuations", "state"], now)
        user_message(
            log, task.conversation_id, input, "continuation", run_id=run.id, task_id=task.id
        )
        _task_status(log, task, previous)
        log.flush()
        return task


def reopen(
    task_id: str,
    new_run_id: str,
    content: str,
    *,
    trigger: str = RunTrigger.COMMENT,
    author=None,
    metadata: dict | None = None,
    origin: str = "comment",
    files: list | None = None,
    notification_task_ids: list | None = None,
) -> Task | bool:
    """Re-open a finished task (or one waiting on a clarification) on a new run, same attempt.

    A `comment` or `message` trigger records a user Comment (returned as `task.new_comment`);
    a `wakeup` trigger writes the content as a task.notification event.
    """
    now = timezone.now()
    with transaction.atomic():
        task = _lock_task(task_id)
        if task.conversation.deleting_at is not None:
            return False
        waiting_on_clarification = (
            task.status == TaskStatus.WAITING_FOR_INPUT and task.run.status != RunStatus.PAUSED
        )
        if task.status not in TERMINAL and not waiting_on_clarification:
            return False
        log = Log()
        _hold_task(log, task)
        previous = task.status
        run_trigger = trigger  # a message on a task's conversation keeps its `message` trigger
        run = _new_run(task, new_run_id, run_trigger, content, now)
        _move_to_new_run(task, run, now)
        task.new_comment = None
        if trigger == RunTrigger.WAKEUP:
            data = {"content": content, "taskIds": notification_task_ids or []}
            log.add(task.conversation_id, "task.notification", data, run_id=run.id, task_id=task.id)
        else:
            task.new_comment = Comment.objects.create(
                task=task,
                role=Comment.Role.USER,
                content=content,
                metadata=metadata,
                run_id=run.id,
                author=author,
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
        _task_status(log, task, previous)
        log.flush()
        return task


def request_stop(task_id: str, run_id: str, *, graceful: bool) -> StopOutcome:
    """Ask the current run to stop, and say what stopping it takes (§3.5 of the lifecycle spec)."""
    now = timezone.now()
    with transaction.atomic():
        task = _lock_task(task_id)
        if task.status not in LIVE or task.run_id != run_id:
            return StopOutcome.MOVED
        run = task.run
        if run.status in RUN_ENDED:
            return StopOutcome.ALREADY_FINISHED
        if run.status != RunStatus.RUNNING or not _alive(run, now):
            return StopOutcome.UNKNOWN_RUN
        wanted = StopRequest.AFTER_TURN if graceful else StopRequest.NOW
        if run.stop_request != StopRequest.NOW and run.stop_request != wanted:
            run.stop_request = wanted
            run.save(update_fields=["stop_request"])
        if run.stop_request == StopRequest.NOW:
            return StopOutcome.CANCELLED
        return StopOutcome.AFTER_TURN


def fail_orphans() -> list[Task]:
    """Fail every running task whose run's lease expired; concurrent reapers split the work."""
    now = timezone.now()
    cutoff = now - timedelta(seconds=app_settings.LEASE_TIMEOUT)
    expired = Q(run__heartbeat_at__lt=cutoff) | Q(
        run__heartbeat_at__isnull=True, run__started_at__lt=cutoff
    )
    candidates = list(
        Task.objects.filter(
            expired,
            status=TaskStatus.RUNNING,
            run__status=RunStatus.RUNNING,
            conversation__deleting_at__isnull=True,
        ).values_list("pk", flat=True)[:500]
    )
    failed = []
    for task_id in candidates:
        with transaction.atomic():
            task = (
                Task.objects.select_related("conversation", "run")
                .select_for_update(
                    no_key=True, skip_locked=True, of=("self", "conversation", "run")
                )
                .filter(
                    expired,
                    pk=task_id,
                    status=TaskStatus.RUNNING,
                    run__status=RunStatus.RUNNING,
                    conversation__deleting_at__isnull=True,
                )
                .first()
            )
            if task is None:
                continue
            log = Log()
            _hold_task(log, task)
            _end_run(task.run, RunStatus.FAILED, now, error=ORPHAN_TEXT)
            _run_finished(log, task.run)
            task.status = TaskStatus.FAILED
            task.summary = task.error = ORPHAN_TEXT
            task.finished_at = now
            _save_task(task, ["status", "summary", "error", "finished_at"], now)
            if _owes_wakeup(task):
                _write_debt(task, task.run_id, TaskStatus.FAILED)
            _task_status(log, task, TaskStatus.RUNNING, "lease expired")
            log.flush()
            failed.append(task)
    return failed


# --- reads used by several modules -----------------------------------------------------------


def get_task(task_id: str) -> Task:
    """Read a task (with its conversation and current run) or raise TaskNotFound."""
    try:
        return Task.objects.select_related("conversation", "run").get(pk=task_id)
    except Task.DoesNotExist:
        raise TaskNotFound() from None


def live_tasks(parent_conversation_id: str) -> list[Task]:
    """Return the live tasks spawned from a conversation, newest first."""
    return list(
        Task.objects.filter(
            parent_conversation_id=parent_conversation_id, status__in=LIVE
        ).order_by("-created_at", "-id")
    )


def tasks_of(parent_conversation_id: str) -> list[Task]:
    """Return every task spawned from a conversation, newest first."""
    return list(
        Task.objects.filter(parent_conversation_id=parent_conversation_id).order_by(
            "-created_at", "-id"
        )
    )


# --- deleting a conversation tree ------------------------------------------------------------


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
        try:
            _lock_conversation(root_id)
        except Conversation.DoesNotExist:
            raise ConversationNotFound() from None
        tree = conversation_tree(root_id)
        Conversation.objects.filter(pk__in=tree, deleting_at__isnull=True).update(
            deleting_at=timezone.now()
        )
    return tree


def delete_tree(root_id: str) -> list[str]:
    """Delete a conversation tree in one transaction; return the storage names of its files."""
    with transaction.atomic():
        tree = conversation_tree(root_id)
        stored = list(
            File.objects.filter(conversation_id__in=tree).values_list("storage_name", flat=True)
        )
        Wakeup.objects.filter(
            Q(conversation_id__in=tree) | Q(task__conversation_id__in=tree)
        ).delete()
        Task.objects.filter(
            Q(conversation_id__in=tree) | Q(parent_conversation_id__in=tree)
        ).delete()
        Conversation.objects.filter(pk__in=tree).delete()
    return stored


# --- conversation runs (no task) -------------------------------------------------------------


def reclaim_conversation_run(run_id: str, action_id: str, resolution: dict) -> Run | bool:
    """Resolve an action of a paused conversation run; re-queue the run when none is left open."""
    now = timezone.now()
    with transaction.atomic():
        run = _lock_run(run_id)
        action = _lock_open_action(action_id)
        if action is None:
            return False
        log = Log()
        log.hold(run.conversation)
        if run.status != RunStatus.PAUSED or action.run_id != run_id:
            _resolve_action(log, action, {"status": ActionStatus.CANCELLED}, now)
            log.flush()
            return False
        _resolve_action(log, action, resolution, now)
        if not _held(run):
            run.status, run.queued_at = RunStatus.QUEUED, now
            run.save(update_fields=["status", "queued_at"])
        log.flush()
        return run


def stop_conversation_runs(conversation_id: str) -> None:
    """Stop the runs without a task in a conversation tree: queued and paused ones end now."""
    now = timezone.now()
    tree = conversation_tree(conversation_id)
    with transaction.atomic():
        runs = list(
            Run.objects.select_for_update().filter(
                conversation_id__in=tree, task__isnull=True, status__in=RUN_ACTIVE
            )
        )
        for run in runs:
            if run.status == RunStatus.RUNNING:
                run.stop_request = StopRequest.NOW
                run.save(update_fields=["stop_request"])
            else:
                _end_run(run, RunStatus.CANCELLED, now)


# --- the reaper's reads and writes -----------------------------------------------------------


def _expired_cutoff():
    return timezone.now() - timedelta(seconds=app_settings.LEASE_TIMEOUT)


def stuck_endings() -> list[tuple[Task, RunOutcome]]:
    """Tasks still naming a run whose ending was recorded by a worker that then died."""
    cutoff = _expired_cutoff()
    tasks = Task.objects.select_related("run").filter(
        status__in=(TaskStatus.PENDING, TaskStatus.RUNNING),
        run__status__in=RUN_ENDED,
        run__heartbeat_at__lt=cutoff,
        conversation__deleting_at__isnull=True,
    )[:500]
    return [
        (
            task,
            RunOutcome(
                run_id=task.run_id,
                status=task.run.status,
                text=task.run.output,
                error=task.run.error,
                graceful_stop=task.run.graceful_stop,
                append_message=False,
            ),
        )
        for task in tasks
    ]


def fail_dead_conversation_runs() -> list[str]:
    """Fail taskless runs whose lease expired; return their conversations (a run boundary)."""
    cutoff = _expired_cutoff()
    expired = Q(heartbeat_at__lt=cutoff) | Q(heartbeat_at__isnull=True, started_at__lt=cutoff)
    now = timezone.now()
    ended = []
    for run_id in Run.objects.filter(
        expired, task__isnull=True, status=RunStatus.RUNNING
    ).values_list("pk", flat=True)[:500]:
        with transaction.atomic():
            run = (
                Run.objects.select_related("conversation")
                .select_for_update(no_key=True, skip_locked=True, of=("conversation", "self"))
                .filter(expired, pk=run_id, status=RunStatus.RUNNING)
                .first()
            )
            if run is None:
                continue
            log = Log()
            log.hold(run.conversation)
            _end_run(run, RunStatus.FAILED, now, error=ORPHAN_TEXT)
            _run_finished(log, run)
            log.flush()
            ended.append(run.conversation_id)
    return ended


def requeue_stale() -> list[str]:
    """Move the queued_at of runs queued longer than REQUEUE_AFTER; return them to enqueue again."""
    now = timezone.now()
    cutoff = now - timedelta(seconds=app_settings.REQUEUE_AFTER)
    stale = Run.objects.filter(status=RunStatus.QUEUED, queued_at__lt=cutoff).filter(
        Q(task__isnull=True) | Q(task__run_id=models.F("id"))
    )
    run_ids = list(stale.values_list("pk", flat=True)[:1000])
    # Moving queued_at under the same predicate lets only one reaper re-enqueue each run.
    return [
        run_id
        for run_id in run_ids
        if Run.objects.filter(pk=run_id, status=RunStatus.QUEUED, queued_at__lt=cutoff).update(
            queued_at=now
        )
    ]


def conversations_owed() -> list[str]:
    """Conversations that have pending wake-ups."""
    return list(
        Wakeup.objects.filter(state=WakeupState.PENDING)
        .values_list("conversation_id", flat=True)
        .distinct()[:1000]
    )


def expired_actions(action_ids=None) -> list[PendingAction]:
    """Open actions past their deadline (optionally only those ids)."""
    actions = PendingAction.objects.filter(status=ActionStatus.PENDING, deadline__lt=timezone.now())
    if action_ids is not None:
        actions = actions.filter(pk__in=action_ids)
    return list(actions.order_by("deadline")[:500])


def expire_and_cancel(task_id: str, run_id: str, action_id: str) -> Task | bool:
    """Apply `on_timeout: cancel`: the action expires and the task ends cancelled on its run."""
    now = timezone.now()
    with transaction.atomic():
        task = _lock_task(task_id)
        action = _lock_open_action(action_id)
        if action is None:
            return False
        log = Log()
        _hold_task(log, task)
        _resolve_action(log, action, {"status": ActionStatus.EXPIRED}, now)
        log.flush()
        won = finalize(
            task_id,
            run_id,
            TaskStatus.CANCELLED,
            summary="timed out waiting for input",
            reason="timed out waiting for input",
        )
        return won


def record_progress(run_id: str, state, rendered: str) -> bool:
    """Record a run's progress state and append task.progress (mirrored to the parent)."""
    with transaction.atomic():
        task = _task_rows().filter(run_id=run_id).first()
        if task is None:
            updated = Run.objects.filter(pk=run_id, status=RunStatus.RUNNING).update(progress=state)
            return bool(updated)
        if task.run.status != RunStatus.RUNNING:
            return False
        log = Log()
        _hold_task(log, task)
        task.run.progress = state
        task.run.save(update_fields=["progress"])
        data = {"taskId": task.id, "runId": run_id, "progress": rendered, "state": state}
        log.add(task.conversation_id, "task.progress", data, run_id=run_id, task_id=task.id)
        if log.holds(task.parent_conversation_id):
            log.add(
                task.parent_conversation_id,
                "task.progress",
                dict(data),
                run_id=run_id,
                task_id=task.id,
            )
        log.flush()
        return True


# --- REST API additions (issue 5): principal slots, conversation runs, conversation edits -----

RESERVED_METADATA = ("source", "taskId")
_UNSET = object()


class ConversationBusy(TaskError):
    """A message reached a conversation with an action pending or a run in progress."""

    def __init__(self, conversation_id: str, *, run_id: str = "", action_ids=()):
        super().__init__(f"tasks: conversation {conversation_id} is busy")
        self.run_id = run_id
        self.action_ids = list(action_ids)


def lock_principal(owner_id) -> None:
    """Serialize one principal's slot-taking writes (create, re-open, retry) until commit.

    PostgreSQL: a transaction-scoped advisory lock keyed by the owner, so that
    MAX_ACTIVE_TASKS_PER_USER holds across processes without locking the host's user table.
    SQLite: the IMMEDIATE transaction the caller is in already serializes every writer.
    """
    from django.db import connection

    if not connection.in_atomic_block:
        raise RuntimeError("lock_principal needs the caller's transaction")
    if connection.vendor != "postgresql":
        return
    digest = hashlib.sha256(f"agenttasks:principal:{owner_id}".encode()).digest()
    key = int.from_bytes(digest[:8], "big", signed=True)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [key])


def active_count(owner_id) -> int:
    """Count a principal's live tasks (delegates, which their caller drives, excluded)."""
    return Task.objects.filter(owner_id=owner_id, status__in=LIVE).exclude(kind=DELEGATE).count()


def start_conversation_run(
    conversation_id: str,
    content: str,
    *,
    run_id: str | None = None,
    metadata: dict | None = None,
    files: list | None = None,
) -> tuple[Run, Event]:
    """Start a run of a conversation without a task on a user message, unless it is busy.

    Under the conversation's row lock: not deleting, no pending action, no queued, running or
    paused run; then the queued run and its message.user event, in one transaction.
    """
    now = timezone.now()
    with transaction.atomic():
        log = Log()
        conversation = lock_conversation(conversation_id, log)
        if conversation.deleting_at is not None:
            raise ConversationNotFound()
        # Its own actions and those its delegate descendants escalated to it.
        pending = list(pending_actions_below(conversation_id).values_list("id", flat=True))
        if pending:
            raise ConversationBusy(conversation_id, action_ids=pending)
        active = (
            Run.objects.filter(conversation_id=conversation_id, status__in=RUN_ACTIVE)
            .order_by("-created_at", "-id")
            .values_list("id", flat=True)
            .first()
        )
        if active:
            raise ConversationBusy(conversation_id, run_id=active)
        run = Run.objects.create(
            id=run_id or ids.new_run_id(),
            conversation=conversation,
            agent=conversation.agent,
            trigger=RunTrigger.MESSAGE,
            input=content,
            status=RunStatus.QUEUED,
            queued_at=now,
        )
        event = user_message(
            log, conversation_id, content, "message", run_id=run.id, files=files, metadata=metadata
        )
        log.flush()
    return run, event


def create_conversation(*, owner, agent: str, title: str = "", metadata=None) -> Conversation:
    """Create a visible conversation (no run starts; its first message does that)."""
    return Conversation.objects.create(
        owner=owner, agent=agent, title=title or "", metadata=metadata or {}
    )


def update_conversation(conversation_id: str, *, title=_UNSET, metadata=_UNSET) -> Conversation:
    """Change a conversation's title or client metadata under its row lock.

    `title=""` removes the title. New metadata replaces the client's as a whole; the server's
    `source` and `taskId` (a task's conversation) are kept whatever it says.
    """
    with transaction.atomic():
        conversation = lock_conversation(conversation_id)
        if conversation.deleting_at is not None:
            raise ConversationNotFound()
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


# --- delegation (issue 6): escalations and the resume of a paused caller ----------------------


def escalations_open(run: Run) -> bool:
    """Whether a delegate child this run escalated (`task.escalated`) has not settled yet."""
    children = Event.objects.filter(
        conversation_id=run.conversation_id, type="task.escalated", run_id=run.id
    ).values_list("task_id", flat=True)
    return Task.objects.filter(pk__in=list(children), status__in=LIVE).exists()


def _held(run: Run) -> bool:
    """Whether a paused run still waits: on an action of its own or an escalated child."""
    own = PendingAction.objects.filter(run_id=run.id, status=ActionStatus.PENDING).exists()
    return own or escalations_open(run)


def pending_actions_below(conversation_id: str):
    """The pending actions of a conversation and of its delegate descendants, oldest first."""
    tree, frontier = [conversation_id], [conversation_id]
    while frontier:
        frontier = list(
            Task.objects.filter(parent_conversation_id__in=frontier, kind=DELEGATE)
            .exclude(conversation_id__in=tree)
            .values_list("conversation_id", flat=True)
        )
        tree.extend(frontier)
    return PendingAction.objects.filter(
        conversation_id__in=tree, status=ActionStatus.PENDING
    ).order_by("created_at", "id")


def resume_paused(conversation_id: str) -> Task | Run | bool:
    """Resume a conversation's paused latest run once nothing holds it (delegation.md §4.9).

    The resume predicate: no pending action of the run's own and every child it escalated
    settled. Checked on the locked task (or run) row, so of two children ending at once the
    later commit sees both endings. The run keeps its id, as an answered run does; the caller
    enqueues it after commit. False when the run is not paused or is still held.
    """
    now = timezone.now()
    with transaction.atomic():
        task_id = (
            Task.objects.filter(conversation_id=conversation_id)
            .values_list("id", flat=True)
            .first()
        )
        if task_id is not None:
            task = _lock_task(task_id)
            run = task.run
            if (
                task.status != TaskStatus.WAITING_FOR_INPUT
                or run.status != RunStatus.PAUSED
                or task.conversation.deleting_at is not None
                or _held(run)
            ):
                return False
            log = Log()
            _hold_task(log, task)
            run.status, run.queued_at = RunStatus.QUEUED, now
            run.save(update_fields=["status", "queued_at"])
            task.status = TaskStatus.PENDING
            _save_task(task, ["status"], now)
            _task_status(log, task, TaskStatus.WAITING_FOR_INPUT)
            log.flush()
            return task
        run = (
            _run_rows()
            .filter(conversation_id=conversation_id, task__isnull=True)
            .order_by("-created_at", "-id")
            .first()
        )
        if (
            run is None
            or run.status != RunStatus.PAUSED
            or run.conversation.deleting_at is not None
            or _held(run)
        ):
            return False
        run.status, run.queued_at = RunStatus.QUEUED, now
        run.save(update_fields=["status", "queued_at"])
        return run
