"""An agent's tool: run the agent as a task of the client's conversation and answer with it.

The call spawns the task (`lifecycle.spawn`, with the caller's input, label and metadata) and
follows its own conversation's log the way the REST events stream does (api/streams.py: the
in-process hub, fed by PostgreSQL NOTIFY too, and a poll), holding no transaction and giving
its database connection back between reads. While it follows:

- a `task.progress` becomes `notifications/progress`, when the client sent a progress token;
- a question or an approval reaches the person: on 2026-07-28 the call answers with an
  `InputRequiredResult` and the client's retry (its `requestState`, its `inputResponses`)
  answers the actions and follows on; on 2025-11-25 an `elicitation/create` goes to the client
  on the call's stream, and its answer (a POST of its own) resumes the task; otherwise the
  call answers with what is asked, for `task_answer`;
- the ending is the call's result (its text, and each result file as a resource link), and the
  model has it (the wake-up it owed is consumed);
- past MCP_CALL_TIMEOUT the call answers with the task as it is and how to follow it; the task
  goes on, and its ending is owed to the conversation like any other task's.

A 2026-07-28 call over HTTP is cancelled by closing its stream; a 2025-11-25 one (and any over
stdio) by `notifications/cancelled`, which stops the task (`dispatch.cancel`).
"""

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .. import lifecycle, store
from ..conf import app_settings
from ..exceptions import AlreadyFinal, TaskError, TaskNotFound
from ..lifecycle import answers
from ..models import PendingAction, Task, TaskResult
from ..runtime import task_tools as tt
from ..runtime.base import release_connection
from ..states import TERMINAL, RunStatus, TaskStatus
from ..toolkit import caps, checks, errors
from ..toolkit.streams import Follower
from . import elicitation, protocol
from .sessions import Session
from .tools import TaskTools, check_label, error_result, rest_checked, text_result, waiting_text

logger = logging.getLogger(__name__)

# Appended to the followed task's log when the person declines or dismisses an elicitation
# (2025-11-25: the answer comes in a request of its own, maybe to another process).
ELICITATION_EVENT = "mcp.elicitation"
WATCHED = ("task.progress", ELICITATION_EVENT)
DECLINED = "The person declined to answer (or dismissed the question); the task still waits."
FOLLOW = (
    "The task goes on in the background: this call waited {seconds} s (MCP_CALL_TIMEOUT). "
    "Follow it with task_status (its task_id, and wait_seconds), answer its questions with "
    "task_answer, stop it with task_stop; task_status without a task_id lists it once it ends."
)


def call_timeout() -> float:
    """MCP_CALL_TIMEOUT, kept inside a stream's STREAM_MAX_SECONDS so the call answers first."""
    return max(1.0, min(float(app_settings.MCP_CALL_TIMEOUT), app_settings.STREAM_MAX_SECONDS - 1))


@dataclass
class Exchange:
    """One tools/call, and how what it sends travels.

    `frame(message)` writes a JSON-RPC message as the transport carries it ("" leaves it out: a
    plain JSON answer carries only the response). `streaming`: messages can go before the
    response (an SSE stream, stdio). `cancel_on_close`: a 2026-07-28 call over HTTP, cancelled
    by closing its stream. `take(kind)` takes one of the caller's places under the REST API's
    caps (toolkit.caps), over HTTP; `client_fd` tells when a WSGI client has gone.
    """

    session: Session
    message: protocol.Message
    frame: Callable[[dict], str]
    streaming: bool = False
    cancel_on_close: bool = False
    take: Callable[[str], caps.Held] | None = None
    client_fd: int | None = None
    held: caps.Held | None = None
    name_header: str | None = None  # Mcp-Name as sent over HTTP (tasks/* checks it)

    @property
    def progress_token(self) -> Any:
        return self.message.meta.get("progressToken")

    def hold(self, kind: str) -> None:
        """Take a place of `kind` for the call (429 when the caller holds them all)."""
        if self.take is not None and self.held is None:
            self.held = self.take(kind)

    def release(self) -> None:
        if self.held is not None:
            self.held.release()

    def answer(self, result: dict) -> str:
        shaped = protocol.shape("tools/call", self.session.version, result)
        return self.frame(protocol.response(self.message.id, shaped))


def start(exchange: Exchange, agent_id: str, args: dict) -> "dict | CallFollower":
    """Run the agent: a follower of its new task, or (refused) the tool result at once."""
    params = exchange.message.params
    if "requestState" in params or "inputResponses" in params:
        return resume(exchange, agent_id, params)
    text = rest_checked(checks.text, args["input"], "input", required_message="input is required")
    label = args.get("label") or ""
    check_label(label)
    metadata = rest_checked(checks.metadata, args.get("metadata") or {}, "metadata")
    priority = rest_checked(checks.priority, args.get("priority", 0), "priority")
    not_before = args.get("notBefore")
    if not_before is not None:
        not_before = rest_checked(checks.moment, not_before, "notBefore")
    session = exchange.session
    try:
        session.conversation()
        info = lifecycle.spawn(
            session.conversation_id,
            agent_id,
            text,
            label=label,
            tool_call_id=call_id(exchange.message.id),
            metadata=metadata,
            not_before=not_before,
            priority=priority,
        )
    except TaskError as exc:
        return error_result(exc)
    task = Task.objects.select_related("run").get(pk=info.task_id)
    return CallFollower(exchange, agent_id, task, after=0)


def call_id(request_id: Any) -> str:
    """Return the tool_call_id of an agent call's task: its request's id, so a cancel finds it."""
    return f"mcp-call:{request_id}"


def resume(exchange: Exchange, agent_id: str, params: dict) -> "dict | CallFollower":
    """Resume a 2026-07-28 retry: answer what the call asked with the client's responses, follow on."""
    session = exchange.session
    state = elicitation.unseal(session, agent_id, params.get("requestState"))
    responses = params.get("inputResponses") or {}
    if not isinstance(responses, dict):
        raise protocol.invalid_params("inputResponses must be an object")
    try:
        task = TaskTools(session, exchange.message.id).owned(state.task_id)
    except TaskNotFound as exc:
        return error_result(exc)
    after = task.conversation.last_seq
    # Every response is read before any is applied: a malformed one refuses the whole retry.
    replies = [
        (action, elicitation.read_result(action, responses.get(action.id, {"action": "cancel"})))
        for action in PendingAction.objects.filter(pk__in=state.action_ids).open()
    ]
    declined, notes = set(), []
    for action, reply in replies:
        fault = apply(action, reply.body, session) if reply.body is not None else DECLINED
        if fault:
            declined.add(action.id)
            if fault not in notes:
                notes.append(fault)
    note = "\n".join(notes)
    return CallFollower(exchange, agent_id, task, after=after, declined=declined, note=note)


def apply(action: PendingAction, body: dict, session: Session) -> str:
    """Answer an action with a REST answer body; "" when done, else why not (REST's words)."""
    try:
        resolution = answers.checked(action, body)
        lifecycle.resolve_as_person(action.id, {**resolution, "decided_by": session.caller.user})
    except answers.AnswerError as exc:
        return f"{action.id}: {exc.message}"
    except TaskError as exc:
        logger.info("mcp.answer_refused action=%s: %s", action.id, exc)
        return f"{action.id}: {errors.refusal(exc).message}"
    return ""


def outcome(task: Task, mount_url: str) -> dict:
    """Return a task's ending as the call's result: its text and result files, or the card on
    failure."""
    info = lifecycle.info(task)
    structured: dict[str, Any] = {"taskId": task.id, "status": task.status}
    if task.status != TaskStatus.COMPLETED:
        if task.error:
            structured["error"] = task.error
        return text_result(tt.describe(tt.unnamed(info)), is_error=True, structured=structured)
    result = TaskResult.objects.filter(task_id=task.id).first()
    text = (result.content if result is not None else "") or task.result
    structured["result"] = text
    content: list[dict] = [{"type": "text", "text": text}]
    files = []
    for ref in (result.files if result is not None else None) or []:
        if not isinstance(ref, dict) or not ref.get("id"):
            continue
        uri = (
            f"{mount_url}/files/{ref['id']}/content"
            if mount_url
            else f"agenttasks://files/{ref['id']}"
        )
        link = {"type": "resource_link", "uri": uri, "name": ref.get("name") or ref["id"]}
        if ref.get("mimeType"):
            link["mimeType"] = ref["mimeType"]
        if isinstance(ref.get("size"), int):
            link["size"] = ref["size"]
        content.append(link)
        files.append({"id": ref["id"], **{k: v for k, v in link.items() if k != "type"}})
    if files:
        structured["files"] = files
    return {"content": content, "isError": False, "structuredContent": structured}


class CallFollower(Follower):
    """Follow one task for an agent's tools/call (an toolkit.streams Follower).

    `poll` reads the task's log and row and writes what goes to the client; `done` once the
    call's response is written.
    """

    def __init__(
        self,
        exchange: Exchange,
        tool: str,
        task: Task,
        *,
        after: int,
        declined: set[str] | None = None,
        note: str = "",
    ):
        super().__init__(exchange.held, exchange.client_fd)
        self.exchange, self.session, self.tool = exchange, exchange.session, tool
        self.task_id, self.conversation_id = task.id, task.conversation_id
        self.last = after
        self.timeout = call_timeout()
        self.deadline = time.monotonic() + self.timeout
        self.asked: set[str] = set()  # 2025-11-25: the actions sent as elicitation/create
        self.declined = set(declined or ())
        self.note = note
        self.progress = 0.0

    # --- the driver's side (toolkit.streams.Follower) ---------------------------------------------

    def opening(self) -> list[str]:
        return [self.poll()]

    def poll(self) -> str:
        """Return what to send since the last read; the response once the call is over."""
        try:
            out = self._events()
            task = Task.objects.select_related("run").visible().filter(pk=self.task_id).first()
            if task is None:
                out.append(self._finish(error_result(TaskNotFound())))
            elif task.status in TERMINAL:
                lifecycle.model_has_result(lifecycle.info(task))
                out.append(self._finish(outcome(task, self.session.caller.mount_url)))
            elif task.status == TaskStatus.WAITING_FOR_INPUT:
                out.extend(self._input_needed(task))
            if not self.done and time.monotonic() >= self.deadline:
                out.append(self._finish(self._timed_out(task)))
            return "".join(out)
        finally:
            release_connection()  # held by no wait: back to the pool until the next read

    def keep_place(self) -> None:
        """Renew the place's lease; a call goes on even if it lapsed (it ends by its timeout)."""
        self._renewed = time.monotonic()
        self.held.renew()

    def failed(self, exc: Exception) -> str:
        logger.error("mcp.call_failed task=%s", self.task_id, exc_info=exc)
        self.done = True
        error = protocol.error_response(self.exchange.message.id, protocol.internal_error())
        return self.exchange.frame(error)

    def release(self) -> None:
        """Give the place back; a 2026-07-28 call whose client closed the stream is cancelled."""
        super().release()
        if self.done or not self.exchange.cancel_on_close:
            return
        self.done = True
        try:
            lifecycle.stop(self.task_id)
            logger.info("mcp.call_cancelled task=%s (the client closed the stream)", self.task_id)
        except (AlreadyFinal, TaskNotFound):
            pass

    # --- what it sends -----------------------------------------------------------------------

    def _events(self) -> list[str]:
        out = []
        for event in self.next_events(WATCHED):
            self.last = event.seq
            data = event.data or {}
            if event.type == ELICITATION_EVENT:
                self.declined.add(str(data.get("actionId")))
                self.note = str(data.get("reason") or DECLINED)
            elif event.task_id == self.task_id and self.exchange.progress_token is not None:
                out.append(self._progress(data))
        return out

    def _progress(self, data: dict) -> str:
        state = data.get("state")
        step = state.get("step") if isinstance(state, dict) else None
        of = state.get("of") if isinstance(state, dict) else None
        # Progress only goes up: a step behind the last one sent counts on from it.
        if isinstance(step, (int, float)) and not isinstance(step, bool) and step > self.progress:
            self.progress = float(step)
        else:
            self.progress += 1
        params: dict[str, Any] = {
            "progressToken": self.exchange.progress_token,
            "progress": self.progress,
        }
        if isinstance(of, (int, float)) and not isinstance(of, bool) and of >= self.progress:
            params["total"] = of
        if data.get("progress"):
            params["message"] = data["progress"]
        return self.exchange.frame(protocol.notification("notifications/progress", params))

    def _input_needed(self, task: Task) -> list[str]:
        actions = list(
            PendingAction.objects.filter(pk__in=lifecycle.waiting_on(task)).order_by(
                "created_at", "id"
            )
        )
        if not actions:
            if task.run.status == RunStatus.PAUSED:
                # Read before an answer committed (its actions are settled now, its run about to
                # be queued again), or waiting on children that have not asked yet: follow on.
                return []
            return [self._finish(self._waiting(task))]  # a legacy clarification: REST answers
        if self.declined & {a.id for a in actions}:
            return [self._finish(self._waiting(task, self.note))]
        if self.session.elicitation and self.session.modern:
            ids = [a.id for a in actions]
            result = {
                "resultType": "input_required",
                "inputRequests": elicitation.input_requests(actions),
                "requestState": elicitation.seal(self.session, self.tool, task.id, ids),
            }
            return [self._finish(result)]
        if self.session.elicitation and self.exchange.streaming:
            out = []
            for action in actions:
                if action.id not in self.asked:
                    self.asked.add(action.id)
                    request = protocol.server_request(
                        request_id(task.id, action.id),
                        "elicitation/create",
                        elicitation.elicit_params(action),
                    )
                    out.append(self.exchange.frame(request))
            return out
        return [self._finish(self._waiting(task))]

    def _waiting(self, task: Task, note: str = "") -> dict:
        card = tt.describe(tt.unnamed(lifecycle.info(task)))
        text = "\n".join(part for part in (card, note, waiting_text(task)) if part)
        return text_result(text, structured={"taskId": task.id, "status": task.status})

    def _timed_out(self, task: Task | None) -> dict:
        if task is None:
            return error_result(TaskNotFound())
        info = lifecycle.info(task)
        parts = [tt.describe(tt.unnamed(info)), FOLLOW.format(seconds=format(self.timeout, "g"))]
        if task.status == TaskStatus.WAITING_FOR_INPUT:
            parts.append(waiting_text(task))
        structured = {"taskId": task.id, "status": task.status}
        if info.progress:
            structured["progress"] = info.progress
        return text_result("\n".join(parts), structured=structured)

    def _finish(self, result: dict) -> str:
        self.done = True
        return self.exchange.answer(result)


# --- 2025-11-25: the answers to elicitation/create ---------------------------------------------

REQUEST_PREFIX = "elicit:"


def request_id(task_id: str, action_id: str) -> str:
    """Return the id of the elicitation/create asking an action, naming the task the call follows."""
    return f"{REQUEST_PREFIX}{task_id}:{action_id}"


def answered(session: Session, message: protocol.Message) -> None:
    """Apply a client's answer to an elicitation/create (a JSON-RPC response it posted).

    The action must hold up a task of the session's conversation, as task_answer checks. An
    accepted answer goes through `lifecycle.answer` (the call's stream sees the task resume);
    a declined or dismissed one is recorded in the followed task's log, so the call, wherever
    it runs, answers with what is asked instead of waiting.
    """
    rid = message.id if isinstance(message.id, str) else ""
    if not rid.startswith(REQUEST_PREFIX) or rid.count(":") != 2:
        return  # not ours: nothing else is asked of a client
    _, task_id, action_id = rid.split(":")
    tools = TaskTools(session, message.id)
    action, task = tools.answerable(action_id)
    if action is None or task is None or task.id != task_id:
        logger.info("mcp.elicitation_unknown request=%s", rid)
        return
    result = message.result if message.error is None else {"action": "cancel"}
    reply = elicitation.read_result(action, result)
    fault = apply(action, reply.body, session) if reply.body is not None else DECLINED
    if fault:
        declined_event(task, action.id, reply.action, fault)


def declined_event(task: Task, action_id: str, action: str, why: str) -> None:
    """Tell the call following `task` that an elicitation came back without an answer."""
    data = {"actionId": action_id, "action": action, "reason": why}
    store.append_events(task.conversation_id, [(ELICITATION_EVENT, data, task.run_id, task.id)])
