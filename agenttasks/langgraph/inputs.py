"""What a LangGraph request asks, read and checked: a run's input messages, its resume value,
its stream modes, paging and metadata. A value that cannot be used is a 422 `{"detail"}`."""

from typing import Any

from .. import lifecycle
from ..lifecycle import answers
from ..models import Conversation, Run
from ..store import pending_actions_below
from ..toolkit import checks, errors
from . import shapes

STREAM_MODES = ("values", "updates", "messages-tuple", "messages", "custom", "events", "debug")
# Parameters of a run that agenttasks has nothing to map onto (docs/langgraph.md#not-supported).
UNSUPPORTED = {
    "interrupt_before": "interrupt_before",
    "interrupt_after": "interrupt_after",
    "checkpoint": "Running from a checkpoint",
    "checkpoint_id": "Running from a checkpoint",
}


def invalid(message: str) -> errors.ApiError:
    return errors.ApiError(422, "VALIDATION_ERROR", message)


def page(body: dict, default: int = 10) -> tuple[int, int]:
    """Return (offset, limit) of a search body: limit 1–1000 (default 10), offset ≥ 0."""
    limit, offset = body.get("limit", default), body.get("offset", 0)
    if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= 1000:
        raise invalid("limit must be an integer from 1 to 1000")
    if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
        raise invalid("offset must be a non-negative integer")
    return offset, limit


def metadata(body: dict) -> dict:
    """Return a body's metadata, checked as REST checks metadata."""
    value = body.get("metadata")
    if value is None:
        return {}
    try:
        return checks.metadata(value)
    except errors.ApiError as exc:
        raise invalid(exc.message) from None


def unsupported(body: dict, head: str | None = None) -> str | None:
    """Name the first parameter of a run's body that agenttasks cannot honour, if any. A
    checkpoint that is the thread's head (`head`, its latest) asks for nothing else: clients
    send it to run on from where the thread is."""
    for key, what in UNSUPPORTED.items():
        value = body.get(key)
        if isinstance(value, dict):
            value = value.get("checkpoint_id") or None
        if value and not (key.startswith("checkpoint") and value == head):
            return what
    return None


def text(value: Any) -> str:
    """Return the user message a run's input makes: the text of its human messages, joined."""
    if not isinstance(value, dict) or not isinstance(value.get("messages"), list):
        raise invalid('input must be {"messages": [...]}, or give command.resume')
    parts = []
    for item in value["messages"]:
        if isinstance(item, str):
            parts.append(item)
            continue
        if not isinstance(item, dict):
            raise invalid("each message is an object with a type (or role) and content")
        kind = item.get("type") or item.get("role")
        if kind not in ("human", "user"):
            raise invalid(f"only human messages can be sent, not {kind!r}")
        parts.append(content_text(item.get("content")))
    joined = "\n\n".join(p for p in parts if p)
    try:
        return checks.text(joined, "input", required_message="input has no text")
    except errors.ApiError as exc:
        raise invalid(exc.message) from None


def content_text(content: Any) -> str:
    """A message's content as text: a string, or the text of its `{"type": "text"}` parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part.get("text", "")
            for part in content
            if isinstance(part, dict) and part.get("type") == "text"
        )
    raise invalid("a message's content is a string or a list of text parts")


def stream_modes(value: Any) -> list[str]:
    """Return the stream modes asked (default `values`), each one agenttasks streams."""
    modes = [value] if isinstance(value, str) else list(value or ["values"])
    for mode in modes:
        if mode not in STREAM_MODES:
            raise invalid(
                f"stream_mode {mode!r} is not supported: one of {', '.join(STREAM_MODES)}"
            )
    return ["messages-tuple" if m == "messages" else m for m in modes]


def last_event_id(request) -> int | None:
    raw = request.headers.get("Last-Event-ID")
    if raw is None:
        return None
    try:
        return max(int(raw), 0)
    except ValueError:
        raise invalid("Last-Event-ID must be an event id this stream sent") from None


def resume(conversation: Conversation, value: Any, user) -> Run:
    """Answer the thread's interrupts with `Command(resume=value)`, with REST's checks; return
    the run that goes on. One interrupt takes the value itself; several take a dict keyed by
    interrupt id."""
    pending = list(pending_actions_below(conversation.id))
    if not pending:
        raise errors.ApiError(
            409, "conflict", f"Thread {conversation.id} has no interrupt to resume"
        )
    by_id = {a.id: a for a in pending}
    if isinstance(value, dict) and value and set(value) <= set(by_id):
        chosen = [(by_id[k], v) for k, v in value.items()]
    elif len(pending) == 1:
        chosen = [(pending[0], value)]
    else:
        raise invalid("several interrupts are pending: resume with a dict keyed by interrupt id")
    for action, answer in chosen:
        body = answer_body(action, answer)
        if not isinstance(body, dict):
            raise invalid(f"cannot resume interrupt {action.id} with {answer!r}")
        try:
            resolution = answers.checked(action, body)
        except answers.AnswerError as exc:
            raise invalid(exc.message) from None
        lifecycle.resolve_as_person(action.id, {**resolution, "decided_by": user})
    latest = shapes.latest_run_id(conversation.id)
    return Run.objects.get(pk=latest)


def answer_body(action, value: Any) -> Any:
    """The REST answer body a resume value stands for: REST's own body, a plain value, or
    LangGraph's human-in-the-loop responses (`[{"type": "accept" | "ignore" | "response",
    "args"}]`, what Agent Chat UI sends)."""
    if isinstance(value, list) and value and isinstance(value[0], dict) and "type" in value[0]:
        return human_response(action, value[0])
    if action.kind == "approval":
        if isinstance(value, bool):
            return {"approved": value}
        if isinstance(value, str) and value.lower() in ("yes", "approve", "approved", "no", "deny"):
            return {"approved": value.lower() in ("yes", "approve", "approved")}
        return value
    if isinstance(value, dict) and "answers" not in value:
        return {"answers": value}
    questions = action.questions or []
    if isinstance(value, str) and len(questions) == 1:
        return {"answers": {questions[0]["id"]: value}}
    return value


def cron(value: Any) -> str:
    """LangGraph's cron expression (5 fields) as a schedule's (6: seconds first, here 0)."""
    if not isinstance(value, str) or len(value.split()) != 5:
        raise invalid("schedule must be a cron expression of 5 fields")
    return "0 " + " ".join(value.split())


def human_response(action, response: dict) -> Any:
    """The REST answer body of one of LangGraph's human-in-the-loop responses."""
    kind, args = response.get("type"), response.get("args")
    if action.kind == "approval":
        if kind == "accept":
            return {"approved": True}
        if kind == "ignore":
            return {"approved": False}
        if kind == "response" and isinstance(args, str):
            return {"approved": False, "comment": args}
    elif kind == "response":
        questions = action.questions or []
        if isinstance(args, str) and len(questions) == 1:
            return {"answers": {questions[0]["id"]: args}}
        if isinstance(args, dict):
            return {"answers": args}
    raise invalid(f"cannot answer interrupt {action.id} with a {kind!r} response")
