"""The chat runtime: an OpenAI-compatible chat-completions loop over httpx.

docs/delegation.md#the-chat-runtime is the contract. A run reads its transcript from the conversation's
event log, calls the model, appends what the model said and what its tools returned, and ends
completed, failed, paused or cancelled. No transaction or row lock is held while the model thinks
or a tool runs; every event is appended in its own short transaction. The model server's client
is model_client.py.
"""

import json
import logging
from dataclasses import dataclass, field

from .. import store
from ..broker import deltas
from ..models import PendingAction, Run
from ..registry import ASK_USER_PATH
from ..states import ActionStatus, OutcomeStatus, StopRequest, TaskKind
from ..store.faults import reconnecting
from ..tools import InvalidArguments, ToolResult, ToolSpec, check_arguments, decode_arguments
from ..types import ActionRequest, RunOutcome
from . import approvals, delegation
from . import task_tools as background
from .base import RunContext, RunStopped
from .budget import BudgetExceeded
from .content import user_content
from .model_client import POLL, ModelClient, ModelError, Parked, Response

logger = logging.getLogger(__name__)

INTERRUPTED = "Tool call interrupted: the run ended before it returned a result"
TRANSCRIPT_TYPES = ("message.user", "message.assistant", "tool.result", "task.notification")
# The events only a chat run writes with its own run id, while it runs.
WRITTEN = ("message.user", "message.assistant", "tool.call", "tool.result", "task.escalated")


def execute(ctx: RunContext) -> RunOutcome:
    """Run the chat loop for one run and report how it ended."""
    return ChatRun(ctx).execute()


# --- the toolset (docs/delegation.md#the-toolset) ---------------------------------------------


def toolset(ctx: RunContext) -> dict[str, ToolSpec]:
    """Build a run's tools in wire order: own tools, background-task tools, then `task`."""
    tools = {spec.name: spec for spec in ctx.agent.tools}
    # A task's own run never gets the four tools (delegates never; others per MAX_DEPTH).
    is_delegate = ctx.task is not None and ctx.task.kind == TaskKind.DELEGATE
    if not is_delegate and background.attachable(ctx.conversation, task=ctx.task):
        for spec in background.task_tools(ctx.conversation, ctx.run, stop_check=ctx.stop_now):
            tools[spec.name] = spec
    if ctx.agent.team:
        tools["task"] = delegation.task_spec(ctx.agent.team)
    return tools


def checked_arguments(name: str, raw, parameters: dict) -> tuple[dict, str]:
    """Decode and check a call's arguments (docs/delegation.md#executing-a-responses-calls): (args, "") or ({}, the error text)."""
    try:
        return check_arguments(decode_arguments(raw), parameters), ""
    except InvalidArguments as exc:
        return {}, exc.chat_text(name)


# --- the transcript (docs/delegation.md#the-transcript) ---------------------------------------


@dataclass
class Outstanding:
    """A recorded tool call without a result, and the run whose assistant message made it."""

    run_id: str
    call: dict


def transcript(conversation_id: str, system_prompt: str) -> tuple[list[dict], list[Outstanding]]:
    """Build the request's messages from the event log, and list the calls still outstanding."""
    entries: list = []  # a message, or an assistant slot: (message, run_id, calls, results)
    slot_of: dict[str, tuple[dict, str, list, dict]] = {}
    for kind, data, run_id in store.read_log(conversation_id, TRANSCRIPT_TYPES):
        data = data or {}
        if kind == "message.user" and data.get("files"):
            # Files reach the model as content parts (docs/delegation.md#files).
            entries.append(
                {"role": "user", "content": user_content(data.get("content", ""), data["files"])}
            )
        elif kind in ("message.user", "task.notification"):
            entries.append({"role": "user", "content": data.get("content", "")})
        elif kind == "message.assistant":
            message = {"role": "assistant", "content": data.get("content")}
            calls = data.get("toolCalls") or []
            if calls:
                message["tool_calls"] = calls
                slot: tuple[dict, str, list, dict] = (message, run_id or "", calls, {})
                entries.append(slot)
                for call in calls:
                    slot_of[call["id"]] = slot
            else:
                entries.append(message)
        else:  # tool.result: it goes after its assistant message, whenever it was appended
            owner = slot_of.get(data.get("toolCallId") or "")
            if owner is not None:
                owner[3].setdefault(
                    data["toolCallId"],
                    {
                        "role": "tool",
                        "tool_call_id": data["toolCallId"],
                        "content": data.get("content", ""),
                    },
                )
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    outstanding = []
    for entry in entries:
        if isinstance(entry, dict):
            messages.append(entry)
            continue
        message, run_id, calls, results = entry
        messages.append(message)
        for call in calls:
            if call["id"] in results:
                messages.append(results[call["id"]])
            else:
                outstanding.append(Outstanding(run_id, call))
    return messages, outstanding


# --- one response's calls -------------------------------------------------------------


@dataclass
class Batch:
    """What executing one response's calls produced, by call id."""

    results: dict = field(default_factory=dict)  # call id -> ToolResult
    escalated: dict = field(default_factory=dict)  # call id -> delegation.CallResult
    outstanding: list = field(default_factory=list)  # call ids without a final result
    actions: list = field(default_factory=list)  # ActionRequests the pause creates


# --- the loop (docs/delegation.md#the-loop) ---------------------------------------------------


class ChatRun:
    """One execution of a chat agent's run."""

    def __init__(self, ctx: RunContext):
        self.ctx = ctx
        self.run = ctx.run
        self.agent = ctx.agent
        self.budget = ctx.budget
        self.pieces: list[str] = []  # the reply being streamed in this turn

    def execute(self) -> RunOutcome:
        try:
            return self._loop()
        except RunStopped:
            self._keep_interrupted_reply()
            return self._outcome(OutcomeStatus.CANCELLED)
        except BudgetExceeded as exc:
            return self._outcome(OutcomeStatus.FAILED, error=str(exc))
        except ModelError as exc:
            return self._outcome(OutcomeStatus.FAILED, error=str(exc), retryable=exc.transient)
        except Parked as exc:
            self.budget.own.turns -= 1  # the turn is taken when the parked run comes back
            return self._outcome(
                OutcomeStatus.PARKED, limited_since=exc.since, parked_until=exc.until
            )
        finally:
            self._save_usage()

    def _outcome(self, status: str, **fields) -> RunOutcome:
        return RunOutcome(
            self.run.id, status, usage=self.budget.own.usage(), append_message=False, **fields
        )

    def _save_usage(self) -> None:
        # Written before the ending is recorded, so a resume continues the window's totals and
        # a caller absorbing this run reads what it spent.
        own = self.budget.own
        reconnecting(
            lambda: Run.objects.filter(pk=self.run.id).update(
                turns=own.turns,
                tool_calls=own.tool_calls,
                prompt_tokens=own.prompt_tokens,
                completion_tokens=own.completion_tokens,
                total_tokens=own.total_tokens,
                usage_known=True,
                exec_seconds=own.wall(),
            )
        )

    def _loop(self) -> RunOutcome:
        self.client = ModelClient(self.ctx, self.budget)
        self.tools = toolset(self.ctx)
        messages: list[dict] | None
        messages, outstanding = self._transcript()
        # A turn boundary reads the stop request exactly; the first has the one the claim read.
        stop = self.ctx.stop.value
        if outstanding:
            paused = self._settle(outstanding)
            if paused is not None:
                return paused
            messages, stop = None, self._read_stop_request()  # the results are in the log
        while True:
            self._check_stop()
            if stop == "after_turn":
                return self._outcome(OutcomeStatus.COMPLETED, graceful_stop=True)
            message = self.budget.before_call()
            if message:
                raise BudgetExceeded(message)
            if self._take_steers() or messages is None:
                messages, _ = self._transcript()
            self.budget.spend(turns=1)
            self.pieces = []
            response = self.client.complete(
                messages,
                [spec.schema() for spec in self.tools.values()],
                self.agent.model_params or {},
                on_delta=self._publish_delta if self.agent.stream else None,
            )
            if self.agent.stream:
                deltas.end_reply(self.run.id)  # its pieces go before its message.assistant
            usage = response.usage
            self.budget.spend(
                prompt=usage["prompt_tokens"],
                completion=usage["completion_tokens"],
                total=usage["total_tokens"],
            )
            self._append_assistant(response)
            if not response.calls and self._take_steers():
                messages = None  # a message steered meanwhile: answer it in another turn
                continue
            if not response.calls:
                text = response.content or ""
                return self._outcome(
                    OutcomeStatus.COMPLETED, text=text, graceful_stop=self.ctx.stop.after_turn
                )
            self._check_stop()
            message = self.budget.before_tools(len(response.calls))
            if message:
                raise BudgetExceeded(message)
            self.budget.spend(tool_calls=len(response.calls))
            batch = self._execute(response.calls)
            self._append_results(response.calls, batch)
            if batch.outstanding:
                return self._pause(batch)
            messages, stop = None, self._read_stop_request()

    # stops --------------------------------------------------------------------------------
    def _check_stop(self) -> None:
        if self.ctx.stop_now():
            raise RunStopped()

    # The reads and compare-and-sets between turns are tried again while the database is away
    # (a restart, a terminated connection), as the run's ending and its appends are.
    def _transcript(self) -> tuple[list[dict], list[Outstanding]]:
        return reconnecting(lambda: transcript(self.ctx.conversation_id, self.agent.system_prompt))

    def _read_stop_request(self) -> str:
        return reconnecting(self.ctx.read_stop_request)

    def _take_steers(self) -> bool:
        """Take in the messages steered to this run since its last turn (docs/lifecycle.md).

        A try whose commit went through just before its connection broke shows in the run's
        count of the messages it took, which only the run itself moves while it runs.
        """
        before = self.run.steers_taken

        def landed() -> int | None:
            taken = store.steers_taken(self.run.id)
            return taken if taken > before else None

        self.run.steers_taken = reconnecting(
            lambda: before + len(store.take_steers(self.run.id)), landed=landed
        )
        return self.run.steers_taken > before

    def _keep_interrupted_reply(self) -> None:
        """Keep what was streamed of a reply a newer message interrupted, marked interrupted
        (the next run reads it in the transcript: docs/lifecycle.md#busy-conversations)."""
        if self.pieces and self.ctx.stop.value == StopRequest.INTERRUPT:
            data = {"content": "".join(self.pieces), "interrupted": True}
            self._append([("message.assistant", data, "")])

    # the log ------------------------------------------------------------------------------
    def _append(self, events: list[tuple[str, dict, str]]) -> None:
        """Append events of this run in one transaction, tried again while the database is away.

        A try whose commit went through just before its connection broke shows as the latest
        event this run wrote: a batch's last event differs from the one before it (a reply, a
        call or a result by its call id, with the steered messages taken between two replies),
        so it is not written twice.
        """
        task_id = self.ctx.task_id or ""
        conversation_id = self.ctx.conversation_id
        rows = [(kind, data, self.run.id, other or task_id) for kind, data, other in events]
        last = (rows[-1][0], json.loads(json.dumps(rows[-1][1])))  # as the log reads it back

        def landed() -> bool | None:
            return store.last_of_run(conversation_id, self.run.id, WRITTEN) == last or None

        reconnecting(lambda: store.append_events(conversation_id, rows), landed=landed)

    def _publish_delta(self, piece: str) -> None:
        """Hand a piece of the reply being written to the conversation's live readers."""
        self.pieces.append(piece)
        deltas.publish(self.ctx.conversation_id, self.run.id, piece)

    def _append_assistant(self, response: Response) -> None:
        usage = response.usage
        data = {
            "role": "assistant",
            # A turn that only calls tools has no message: null, whatever "" the server sent.
            "content": response.content if response.content or not response.calls else None,
            "toolCalls": response.calls,
            "model": self.client.config.model,
            # camelCase as the chat spec names it, plus the REST Usage names of the same values.
            "usage": {
                "promptTokens": usage["prompt_tokens"],
                "completionTokens": usage["completion_tokens"],
                "totalTokens": usage["total_tokens"],
                "inputTokens": usage["prompt_tokens"],
                "outputTokens": usage["completion_tokens"],
            },
        }
        events = [("message.assistant", data, "")]
        for call in response.calls:
            args, _ = checked_arguments(call["function"]["name"], call["function"]["arguments"], {})
            events.append(
                (
                    "tool.call",
                    {
                        "toolCallId": call["id"],
                        "toolName": call["function"]["name"],
                        "args": args if args is not None else {},
                    },
                    "",
                )
            )
        self._append(events)

    def _append_results(self, calls: list[dict], batch: Batch) -> None:
        events = []
        for call in calls:
            call_id, name = call["id"], call["function"]["name"]
            if call_id in batch.results:
                result = batch.results[call_id]
                data = {
                    "toolCallId": call_id,
                    "toolName": name,
                    "name": name,
                    "content": result.text,
                    "isError": result.is_error,
                    "metadata": result.details,
                }
                events.append(("tool.result", data, ""))
            elif call_id in batch.escalated:
                escalation = batch.escalated[call_id]
                data = {
                    "taskId": escalation.task_id,
                    "toolCallId": call_id,
                    "runId": self.run.id,
                    "output": escalation.result.text,
                    "isError": True,
                    "metadata": escalation.result.details,
                }
                events.append(("task.escalated", data, escalation.task_id))
        if events:
            self._append(events)

    # settling and pausing (docs/delegation.md#pausing-resuming-and-replay) ----------------
    def _settle(self, outstanding: list[Outstanding]) -> RunOutcome | None:
        """Replay this run's own outstanding calls (a resume); close any other run's."""
        others = [o.call for o in outstanding if o.run_id != self.run.id]
        if others:
            batch = Batch(results={c["id"]: ToolResult(INTERRUPTED, is_error=True) for c in others})
            self._append_results(others, batch)
        mine = [o.call for o in outstanding if o.run_id == self.run.id]
        if not mine:
            return None
        batch = self._execute(mine, replay=True)
        self._append_results(mine, batch)
        return self._pause(batch) if batch.outstanding else None

    def _pause(self, batch: Batch) -> RunOutcome:
        escalated = [e.task_id for e in batch.escalated.values()]
        if self._read_stop_request() == "after_turn" or self.ctx.stop_now():
            # A run told to stop never pauses for a person; the children it waits on go too.
            delegation.stop_children(escalated)
            if self.ctx.stop.now:
                raise RunStopped()
            return self._outcome(OutcomeStatus.COMPLETED, graceful_stop=True)
        for task_id in escalated:
            logger.info("chat.paused_on_child run=%s task=%s", self.run.id, task_id)
        return self._outcome(OutcomeStatus.INPUT_REQUIRED, actions=tuple(batch.actions))

    # executing calls ----------------------------------------------------------------------
    def _execute(self, calls: list[dict], *, replay: bool = False) -> Batch:
        batch = Batch()
        ordinary = []  # (call id, thunk), run in this thread in call order
        groups: dict[str, list] = {}  # identical task calls share one thread, in call order
        recorded = self._recorded_actions(calls) if replay else {}
        for call in calls:
            call_id, name = call["id"], call["function"]["name"]
            tool = self.tools.get(name)
            if tool is None:
                batch.results[call_id] = ToolResult(f"Unknown tool: {name}", is_error=True)
                continue
            args, problem = checked_arguments(name, call["function"]["arguments"], tool.parameters)
            if problem:
                batch.results[call_id] = ToolResult(problem, is_error=True)
                continue
            if name == "task":
                key = delegation.delegation_key(str(args["agent"]), str(args["prompt"]))
                groups.setdefault(key, []).append((call_id, args))
            elif tool.path == ASK_USER_PATH:
                if not args["question"].strip():
                    batch.results[call_id] = ToolResult(approvals.EMPTY_QUESTION, is_error=True)
                elif replay:
                    self._settle_question(batch, call_id, recorded.get(call_id))
                else:
                    request = approvals.question_request(call_id, args, self.ctx._deadline())
                    self._ask(batch, call_id, request)
            elif tool.needs_approval:
                if replay:
                    action = recorded.get(call_id)
                    thunk = self._settle_approval(batch, call_id, tool, action)
                    if thunk is not None:
                        ordinary.append((call_id, thunk))
                else:
                    request = approvals.approval_request(tool, call_id, args, self.ctx._deadline())
                    self._ask(batch, call_id, request)
            elif replay:
                # Re-running a side-effecting tool after an interruption is never automatic.
                batch.results[call_id] = ToolResult(INTERRUPTED, is_error=True)
            else:
                ordinary.append((call_id, self._thunk(tool, call_id, args)))
        dispatcher = (
            delegation.Dispatcher(self.ctx, self.budget, groups, replay) if groups else None
        )
        if dispatcher is not None:
            dispatcher.start()
        try:
            for call_id, thunk in ordinary:
                self._check_stop()
                batch.results[call_id] = thunk()
        finally:
            if dispatcher is not None:
                self._join(dispatcher)
        self._check_stop()
        if dispatcher is not None:
            for call_id, outcome in dispatcher.outcomes.items():
                if outcome.escalated:
                    batch.escalated[call_id] = outcome
                    batch.outstanding.append(call_id)
                else:
                    batch.results[call_id] = outcome.result
        return batch

    def _join(self, dispatcher) -> None:
        stopped = False
        while not dispatcher.finished.wait(POLL):
            if not stopped and self.ctx.stop_now():
                stopped = True
                dispatcher.stop()  # an immediate stop reaches every inline child
        dispatcher.join()

    def _ask(self, batch: Batch, call_id: str, request: ActionRequest) -> None:
        batch.actions.append(request)
        batch.outstanding.append(call_id)

    def _recorded_actions(self, calls: list[dict]) -> dict:
        ids = [c["id"] for c in calls]
        actions = PendingAction.objects.filter(run_id=self.run.id, tool_call_id__in=ids)
        return {a.tool_call_id: a for a in actions.order_by("created_at", "id")}

    def _settle_question(self, batch: Batch, call_id: str, action) -> None:
        if action is None or action.status == ActionStatus.CANCELLED:
            batch.results[call_id] = ToolResult(INTERRUPTED, is_error=True)
        elif action.status == "pending":
            batch.outstanding.append(call_id)  # still asked: the run pauses on it again
        else:
            batch.results[call_id] = approvals.answer(action)

    def _settle_approval(self, batch: Batch, call_id: str, tool: ToolSpec, action):
        if action is None or action.status == ActionStatus.CANCELLED:
            batch.results[call_id] = ToolResult(INTERRUPTED, is_error=True)
            return None
        if action.status == "pending":
            batch.outstanding.append(call_id)
            return None
        refused = approvals.denial(action)
        if refused is not None:
            batch.results[call_id] = refused
            return None
        # The person's answer may carry replacement arguments: they run as given.
        return self._thunk(tool, call_id, approvals.approved_args(action), checked=True)

    def _thunk(self, tool: ToolSpec, call_id: str, args: dict, *, checked: bool = False):
        return lambda: self._call(tool, call_id, args, checked)

    def _call(self, tool: ToolSpec, call_id: str, args: dict, checked: bool) -> ToolResult:
        try:
            if checked:
                return tool.run(args, call_id, ctx=self.ctx)
            return tool.call(args, call_id, ctx=self.ctx)
        except (RunStopped, BudgetExceeded):
            raise
        except Exception as exc:
            logger.exception("chat.tool_failed run=%s tool=%s", self.run.id, tool.name)
            return ToolResult(
                f"tool {tool.name} failed: {type(exc).__name__}: {exc}", is_error=True
            )
