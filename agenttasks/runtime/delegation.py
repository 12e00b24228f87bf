"""The `task {agent, prompt}` delegation tool (docs/delegation.md#the-task-tool).

A call starts (or reattaches to) a hidden `delegate` task of a team member and executes its run
inline, in the calling thread: claimed, heartbeated and finished like a worker's run, never
enqueued. The caller gets one tool message per call: the child's final text, a `[status]`
result, or, when the child pauses for a person, the escalation of its pending action.
"""

import hashlib
import logging
import threading
import time
from dataclasses import dataclass

from django.db import IntegrityError, connection, transaction

from .. import lifecycle, registry, store
from ..conf import app_settings
from ..exceptions import TaskError
from ..lifecycle.escalation import escalation_path
from ..models import PendingAction, Run, Task
from ..states import TERMINAL, RunStatus, StopReason, TaskStatus
from ..tools import ToolResult, ToolSpec
from .base import RunStopped
from .budget import BUDGET_PATTERN, CallerLink
from .chain import DELEGATE

logger = logging.getLogger(__name__)


def delegation_key(agent: str, prompt: str) -> str:
    """Return the SHA-256 key that makes identical `task` calls reattach."""
    return hashlib.sha256(f"{agent}:{prompt}".encode()).hexdigest()


DESCRIPTION_HEAD = (
    "Delegate a subtask to an isolated subagent (it runs on a fresh transcript and returns only "
    "its final answer). Available agents — "
)
PARAMETERS = {
    "type": "object",
    "properties": {
        "agent": {"type": "string", "description": "Team agent to delegate to"},
        "prompt": {"type": "string", "description": "The subtask prompt"},
    },
    "required": ["agent", "prompt"],
}
EMPTY_PROMPT = 'invalid arguments for task: property "prompt" must not be empty'
NOT_STARTED = "; the subtask was not started"
CLOSED_REASONS = (StopReason.WHILE_QUEUED, StopReason.WHILE_AWAITING_INPUT)

# Delegate tasks executing inline in this process, so a sibling call can join the execution.
_inline: dict[str, threading.Event] = {}
_inline_lock = threading.Lock()


@dataclass
class CallResult:
    """What one `task` call returns: its tool result, the child, and whether it escalated."""

    result: ToolResult
    task_id: str | None = None
    escalated: bool = False


def description(team) -> str:
    """Return the tool description: the team, sorted by id, with each registered member's `does`."""
    entries = []
    for member in sorted(set(team)):
        try:
            does = registry.get(member).does
        except registry.UnknownAgent:
            does = ""
        entries.append(f"{member}: {does}" if does else member)
    return DESCRIPTION_HEAD + "; ".join(entries)


def _run_by_dispatcher(ctx, args):
    raise RuntimeError("the task tool is run by the chat runtime's delegation dispatcher")


def task_spec(team) -> ToolSpec:
    """Return the `task` tool of an agent with this team."""
    return ToolSpec("task", description(team), PARAMETERS, _run_by_dispatcher)


def _refused(text: str) -> CallResult:
    return CallResult(ToolResult(text, is_error=True))


# --- chains and children --------------------------------------------------------------------


def stop_children(task_ids) -> None:
    """Stop delegate children through the lifecycle (their caller is stopping)."""
    for task_id in task_ids:
        try:
            lifecycle.stop(task_id)
        except TaskError:
            pass


# --- one call --------------------------------------------------------------------------------


def call(ctx, budget, call_id: str, args: dict, *, replay: bool = False) -> CallResult:
    """Run one `task` call of the caller run `ctx` (docs/delegation.md#what-a-call-does): refuse, reattach, or start a child."""
    agent_id, prompt = args["agent"], args["prompt"]
    if not prompt.strip():
        return _refused(EMPTY_PROMPT)
    team = ctx.agent.team
    if agent_id not in team:
        _log_refused(ctx, agent_id, "not_in_team")
        listed = ", ".join(sorted(team)) or "none"
        return _refused(f'agent "{agent_id}" is not in this agent\'s team (available: {listed})')
    key = delegation_key(agent_id, prompt)
    child = _find(ctx.conversation_id, key)
    if child is not None:
        return _reattach(ctx, budget, call_id, child, replay)
    try:
        definition = registry.get(agent_id)
    except registry.UnknownAgent:
        _log_refused(ctx, agent_id, "not_registered")
        return _refused(f'agent "{agent_id}" is in this agent\'s team but is not registered')
    limit = int(app_settings.DELEGATION_MAX_DEPTH)
    if ctx.depth + 1 > limit:
        _log_refused(ctx, agent_id, "depth")
        return _refused(f"maxDepth {limit} exceeded")
    message = budget.exhausted()
    if message:
        _log_refused(ctx, agent_id, "budget")
        return _refused(message + NOT_STARTED)
    try:
        child = lifecycle.delegate(
            conversation_id=ctx.conversation_id,
            run_id=ctx.run_id,
            owner=ctx.user,
            definition=definition,
            prompt=prompt,
            depth=ctx.depth + 1,
            key=key,
            call_id=call_id,
        )
    except IntegrityError:
        # An identical call won the race for the key: this one reattaches to its child.
        child = _find(ctx.conversation_id, key)
        if child is None:
            raise
        return _reattach(ctx, budget, call_id, child, replay)
    logger.info(
        "delegation.start caller_run=%s task=%s agent=%s depth=%d",
        ctx.run_id,
        child.id,
        agent_id,
        ctx.depth + 1,
    )
    return _follow(ctx, budget, child.id)


def _log_refused(ctx, agent_id: str, reason: str) -> None:
    logger.info("delegation.refused caller_run=%s agent=%s reason=%s", ctx.run_id, agent_id, reason)


def _find(conversation_id: str, key: str) -> Task | None:
    return (
        Task.objects.select_related("run")
        .filter(parent_conversation_id=conversation_id, kind=DELEGATE, delegation_key=key)
        .first()
    )


def _reattach(ctx, budget, call_id: str, child: Task, replay: bool) -> CallResult:
    data = {
        "taskId": child.id,
        "agent": child.agent,
        "toolCallId": call_id,
        "runId": ctx.run_id,
        "childStatus": child.status,
        "replay": replay,
    }
    store.append_events(ctx.conversation_id, [("task.reattached", data, ctx.run_id, child.id)])
    logger.info(
        "delegation.reattach caller_run=%s task=%s status=%s replay=%s",
        ctx.run_id,
        child.id,
        child.status,
        replay,
    )
    return _follow(ctx, budget, child.id)


def _follow(ctx, budget, task_id: str) -> CallResult:
    """Drive the child to an ending or a pause (docs/delegation.md#delegation-keys-and-reattaching), then build the call's result."""
    links = [CallerLink(budget.own, ctx.stop), *ctx.callers]
    wait = float(app_settings.DELEGATION_WAIT_TIMEOUT)
    left, _ = budget.wall_deadline()
    if left is not None:
        wait = max(min(wait, left), 0.0)
    deadline = time.monotonic() + wait
    while True:
        child = Task.objects.select_related("run").get(pk=task_id)
        action = None
        if child.status in TERMINAL:
            break
        if child.status == TaskStatus.WAITING_FOR_INPUT:
            action = store.pending_actions_below(child.conversation_id).first()
            if action is not None:
                break
        with _inline_lock:
            joined = _inline.get(task_id)
        if joined is not None:  # a sibling call executes it in this process: join it
            while not joined.wait(0.05):
                if ctx.stop_now():
                    raise RunStopped()
            continue
        if (
            child.status == TaskStatus.PENDING
            and child.run.status == RunStatus.QUEUED
            and _execute_inline(ctx, child, links)
        ):
            continue
        if ctx.stop_now():
            raise RunStopped()
        if time.monotonic() >= deadline:
            _absorb(ctx, budget, child)
            still = "running" if child.status == TaskStatus.RUNNING else "pending"
            text = f"[timeout] gave up waiting for the subtask after {format(wait, 'g')}s; it is still {still}"
            return CallResult(ToolResult(text, True, _metadata(child)), child.id)
        time.sleep(
            min(float(app_settings.DELEGATION_WAIT_POLL), max(deadline - time.monotonic(), 0))
        )
    _absorb(ctx, budget, child)
    return _result(ctx, child, action)


def _execute_inline(ctx, child: Task, links: list[CallerLink]) -> bool:
    """Claim the child's queued run and execute it in this thread; False if another claimed it."""
    done = threading.Event()
    with _inline_lock:
        if child.id in _inline:
            return False
        _inline[child.id] = done
    try:
        ran = ctx.execute_inline(child.run_id, depth=ctx.depth + 1, callers=links)
        if ran and _runtime_of(child.agent) == "callable":
            Run.objects.filter(pk=child.run_id, turns=0).update(turns=1)  # handle() is one turn
        return ran
    finally:
        with _inline_lock:
            _inline.pop(child.id, None)
        done.set()


def _runtime_of(agent_id: str) -> str:
    try:
        return registry.get(agent_id).runtime
    except registry.UnknownAgent:
        return ""


def _absorb(ctx, budget, child: Task) -> None:
    """Add the child's not yet counted usage and tool calls to the caller's run (docs/delegation.md#the-result)."""
    keys = ("prompt_tokens", "completion_tokens", "total_tokens", "tool_calls")
    with transaction.atomic():
        for run in Run.objects.select_for_update().filter(task_id=child.id).order_by("created_at"):
            if run.counted_in_id not in (None, ctx.run_id):
                continue  # reported to another caller run already
            current = [getattr(run, k) for k in keys]
            counted = [int((run.counted_usage or {}).get(k, 0)) for k in keys]
            delta = [now - seen for now, seen in zip(current, counted, strict=True)]
            if run.counted_in_id == ctx.run_id and not any(delta):
                continue
            run.counted_in_id = ctx.run_id
            run.counted_usage = dict(zip(keys, current, strict=True))
            run.save(update_fields=["counted_in", "counted_usage"])
            budget.own.absorb(run.id, *delta)


def _metadata(child: Task) -> dict:
    last = Run.objects.filter(task_id=child.id).order_by("-created_at", "-id").first()
    turns, tokens = (last.turns, last.total_tokens) if last is not None else (0, 0)
    return {"agent": child.agent, "turns": turns, "totalTokens": tokens}


def _result(ctx, child: Task, action: PendingAction | None) -> CallResult:
    """Map how the child stands to the call's result, or to its escalation (docs/delegation.md#the-result, #escalation)."""
    metadata = _metadata(child)
    if action is not None:
        pending = {
            "id": action.id,
            "kind": action.kind,
            "prompt": action.prompt,
            "path": escalation_path(action.conversation_id),
        }
        logger.info(
            "delegation.escalated caller_run=%s task=%s action=%s", ctx.run_id, child.id, action.id
        )
        result = ToolResult(action.prompt, True, {**metadata, "pending": pending})
        return CallResult(result, child.id, escalated=True)
    if child.status == TaskStatus.COMPLETED:
        return CallResult(ToolResult(child.result, False, metadata), child.id)
    if child.status == TaskStatus.FAILED:
        error = child.error or child.result
        status = "incomplete" if BUDGET_PATTERN.match(error) else "error"
        return CallResult(ToolResult(f"[{status}] {error}", True, metadata), child.id)
    if child.stop_reason == StopReason.INPUT_TIMED_OUT:
        lapsed = (
            PendingAction.objects.filter(conversation_id=child.conversation_id, status="expired")
            .order_by("-decided_at", "-created_at")
            .first()
        )
        kind = lapsed.kind if lapsed is not None else "approval"
        text = f"[timeout] the subtask's {kind} was not answered in time"
    elif child.stop_reason in CLOSED_REASONS:
        text = "[closed] the subtask was cancelled"
    else:
        text = "[interrupted] the subtask was stopped before it finished"
    return CallResult(ToolResult(text, True, metadata), child.id)


# --- the calls of one response ---------------------------------------------------------------


class Dispatcher(threading.Thread):
    """Run the `task` calls of one response, at most DELEGATION_MAX_PARALLEL at a time.

    Identical calls (same agent and prompt) share one thread and run in call order, so the
    second reattaches to the first one's child. Slots are handed out in call order.
    """

    def __init__(self, ctx, budget, groups: dict, replay: bool):
        super().__init__(name=f"delegation-{ctx.run_id}", daemon=True)
        self.ctx = ctx
        self.budget = budget
        self.groups = list(groups.values())
        self.replay = replay
        self.outcomes: dict[str, CallResult] = {}
        self.finished = threading.Event()
        self._slots = threading.Semaphore(max(int(app_settings.DELEGATION_MAX_PARALLEL), 1))
        self._stopping = False
        self._lock = threading.Lock()
        # Read what the threads share before they start, so no thread loads it lazily.
        ctx.depth, ctx.callers, ctx.user  # noqa: B018

    def run(self) -> None:
        threads = []
        try:
            for items in self.groups:
                self._slots.acquire()
                if self._stopping:
                    self._slots.release()
                    break
                thread = threading.Thread(target=self._group, args=(items,), daemon=True)
                thread.start()
                threads.append(thread)
            for thread in threads:
                thread.join()
        finally:
            self.finished.set()

    def _group(self, items) -> None:
        try:
            for call_id, args in items:
                if self._stopping:
                    return
                try:
                    outcome = call(self.ctx, self.budget, call_id, args, replay=self.replay)
                except RunStopped:
                    return
                except Exception as exc:
                    logger.exception("delegation.call_failed caller_run=%s", self.ctx.run_id)
                    text = f"tool task failed: {type(exc).__name__}: {exc}"
                    outcome = CallResult(ToolResult(text, is_error=True))
                with self._lock:
                    self.outcomes[call_id] = outcome
        finally:
            self._slots.release()
            connection.close()

    def stop(self) -> None:
        """Stop, the caller being told to stop now: start nothing more and stop every live child."""
        self._stopping = True
        live = (
            Task.objects.live()
            .filter(parent_conversation_id=self.ctx.conversation_id, kind=DELEGATE)
            .values_list("id", flat=True)
        )
        stop_children(list(live))
