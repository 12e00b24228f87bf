"""Row writes that several transitions share, each on rows the caller has locked."""

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.db import connection
from django.utils import timezone

from ..exceptions import TransitionError
from ..models import (
    A2APushConfig,
    Comment,
    Delivery,
    PendingAction,
    Run,
    Task,
    TaskResult,
)
from ..states import (
    NOTIFIED,
    ActionStatus,
    RunStatus,
    TaskStatus,
    is_allowed,
)
from ..types import ActionRequest
from .debts import drop_debt
from .locking import Log, run_finished, task_status

RESULT_FIELDS = ["run_id", "content", "partial", "files", "metadata", "usage", "created_at"]


def set_status(task: Task, status: str) -> None:
    """Move a locked task to `status`; a change the transition table forbids is a bug here."""
    if not is_allowed(task.status, status):
        raise TransitionError(f"tasks: {task.status} -> {status} is not an allowed transition")
    task.status = status


def save_task(task: Task, fields: list[str], now: datetime) -> None:
    """Save a locked task's changed fields; every write moves its version (callbacks use it)."""
    task.updated_at = now
    task.version += 1
    task.save(update_fields=[*fields, "updated_at", "version"])
    # set_status let it in, so a saved notified status is one the task has just entered. On
    # PostgreSQL a trigger records what it owes, for the SQL functions' endings too.
    if "status" in fields and task.status in NOTIFIED and connection.vendor != "postgresql":
        owe_deliveries(task)


def owe_deliveries(task: Task) -> None:
    """Record the callback and the A2A pushes that the status the task entered owes."""
    configs = A2APushConfig.objects.filter(task_id=task.id).values_list("pk", flat=True)
    owed = [None] if task.callback_url else []
    Delivery.objects.bulk_create(
        Delivery(
            task_id=task.id,
            config_id=config,
            status=task.status,
            version=task.version,
            due_at=task.updated_at,
        )
        for config in [*owed, *configs]
    )


def new_run(
    task: Task,
    run_id: str,
    trigger: str,
    input: str,
    now: datetime,
    not_before: datetime | None = None,
) -> Run:
    """Create the task's next queued run (same attempt as the task), due at `not_before`."""
    return Run.objects.create(
        id=run_id,
        conversation_id=task.conversation_id,
        task_id=task.id,
        owner_id=task.owner_id,
        priority=task.priority,
        agent=task.agent,
        trigger=trigger,
        input=input,
        attempt=task.attempt_no(),
        status=RunStatus.QUEUED,
        queued_at=now,
        not_before=not_before,
    )


def move_to_new_run(task: Task, run: Run, now: datetime, *more_fields: str) -> None:
    """Point a task at a new queued run: pending, its last outcome, debt and result cleared."""
    task.run = run
    set_status(task, TaskStatus.PENDING)
    task.summary = task.result = task.error = task.stop_reason = ""
    task.continuations = 0
    task.finished_at = task.started_at = None
    fields = ["run", "status", "summary", "result", "error", "stop_reason", "continuations"]
    save_task(task, [*fields, "finished_at", "started_at", *more_fields], now)
    drop_debt(task, now)  # the task is no longer finished: its next ending owes afresh
    TaskResult.objects.filter(task_id=task.id).delete()


def requeue_paused(log: Log, run: Run, now: datetime, task: Task | None = None) -> None:
    """Queue a paused run again under its own id (an answer or a settled child resumed it)."""
    run.status, run.queued_at = RunStatus.QUEUED, now
    run.requeues, run.requeue_at = 0, None
    run.save(update_fields=["status", "queued_at", "requeues", "requeue_at"])
    if task is not None:
        set_status(task, TaskStatus.PENDING)
        save_task(task, ["status"], now)
        task_status(log, task, TaskStatus.WAITING_FOR_INPUT)


def end_run(log: Log, run: Run, status: str, now: datetime, error: str = "") -> None:
    """End a run that is not executing (queued or paused), closing its open actions."""
    if run.status == RunStatus.PAUSED:
        cancel_open_actions(log, run, now)
    run.status, run.ended_at, run.error = status, now, error
    run.save(update_fields=["status", "ended_at", "error"])
    run_finished(log, run)


def result_fields(result: dict[str, Any], *, partial: bool = False) -> dict[str, Any]:
    """Return the TaskResult fields of a runtime's result dict."""
    return {
        "content": result.get("content") or "",
        "partial": partial or bool(result.get("partial", False)),
        "files": result.get("files") or [],
        "metadata": result.get("metadata") or {},
        "usage": result.get("usage"),
    }


def write_result(task: Task, run_id: str, result: dict[str, Any], *, partial: bool = False) -> None:
    """Write the task's one result, replacing an older one (one upsert statement)."""
    row = TaskResult(
        task_id=task.id,
        run_id=run_id,
        created_at=timezone.now(),
        **result_fields(result, partial=partial),
    )
    TaskResult.objects.bulk_create(
        [row], update_conflicts=True, unique_fields=["task"], update_fields=RESULT_FIELDS
    )


def create_actions(
    log: Log, run: Run, requests: Iterable[ActionRequest], now: datetime
) -> list[PendingAction]:
    """Create the approvals and questions a pausing run asks, each with its event."""
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


def resolve_action(
    log: Log, action: PendingAction, resolution: dict[str, Any], now: datetime
) -> None:
    """Settle a locked open action with `resolution` (its status and what was decided)."""
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


def cancel_open_actions(log: Log, run: Run, now: datetime, reason: str = "") -> None:
    """Close every open action of a run that ends (nothing is left to answer), saying `reason`."""
    actions = list(PendingAction.objects.open().filter(run_id=run.id))
    for action in actions:
        action.status, action.decided_at = ActionStatus.CANCELLED, now
        data = {"actionId": action.id, "kind": action.kind, "status": ActionStatus.CANCELLED}
        if reason:
            data["reason"] = reason
        log.add(
            action.conversation_id,
            "action.resolved",
            data,
            run_id=run.id,
            task_id=action.task_id or "",
        )
    if actions:
        PendingAction.objects.bulk_update(actions, ["status", "decided_at"])


def add_comment(
    task: Task,
    run_id: str,
    role: str,
    content: str,
    metadata: dict[str, Any] | None,
    author: Any = None,
) -> Comment:
    """Record a comment on a task (a user's, or the agent's legacy clarification)."""
    return Comment.objects.create(
        task=task, role=role, content=content, metadata=metadata, run_id=run_id, author=author
    )
