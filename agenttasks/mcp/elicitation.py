"""Questions and approvals as MCP elicitations, and the person's answers back as REST answers.

A pending action becomes one form elicitation (`elicitation/create`, mode `form`): a question's
options become an enum (several, when it takes several values), a free-text answer a string, an
approval a boolean `approved` with a `comment`. The client's ElicitResult becomes the REST answer
body of the action (docs/rest.md#approvals-and-questions), which `lifecycle.answer` checks and
applies as it does for REST. Where the client cannot be asked, `describe` says in words what is
asked and how `task_answer` answers it.

On 2026-07-28 the elicitations travel in an `InputRequiredResult`, whose `requestState` is
sealed here: signed with SECRET_KEY, bound to the caller, the tool and the task, and short-lived.
"""

import json
from dataclasses import dataclass
from typing import Any

from django.core import signing
from mcp_types import ElicitResult  # the version-free type: every version's shape
from pydantic import ValidationError

from ..models import PendingAction
from . import protocol

STATE_SALT = "agenttasks.mcp.state"
STATE_MAX_AGE = 24 * 3600  # seconds a requestState is honoured
ANSWER_HINT = (
    'Answer with task_answer: {"action_id": "<id>", "answer": {"answers": {"<question id>": '
    '"<value>"}}} for a question, {"action_id": "<id>", "answer": {"approved": true, '
    '"comment": "<optional>"}} for an approval.'
)


# --- actions as forms --------------------------------------------------------------------------


def approval_text(action: PendingAction) -> str:
    if action.prompt:
        return action.prompt
    args = json.dumps(action.args, ensure_ascii=False) if action.args else ""
    return f"Approve {action.tool_name}{' ' + args if args else ''}?"


def _question_schema(q: dict) -> dict:
    """One question as a property: an enum (of one or several values) or a string."""
    title = q.get("header") or q.get("question") or q["id"]
    options = q.get("options") or []
    schema: dict[str, Any] = {"title": title, "description": q.get("question", "")}
    values = [str(o.get("value", o.get("label"))) for o in options]
    labelled = any(o.get("label") not in (None, o.get("value")) for o in options)
    if options and not q.get("allowFreeText", False):
        choices = (
            {
                "oneOf": [
                    {"const": v, "title": str(o["label"])}
                    for v, o in zip(values, options, strict=True)
                ]
            }
            if labelled
            else {"enum": values}
        )
        if q.get("multiSelect"):
            items = {"anyOf": choices["oneOf"]} if labelled else {"type": "string", **choices}
            return {**schema, "type": "array", "items": items}
        return {**schema, "type": "string", **choices}
    if options:  # free text, with the options as suggestions
        schema["description"] += f" (for example: {', '.join(values)})"
    return {**schema, "type": "string"}


def form(action: PendingAction) -> tuple[str, dict]:
    """Return the message and the requested schema of an action's elicitation."""
    if action.kind == "approval":
        schema = {
            "type": "object",
            "properties": {
                "approved": {
                    "type": "boolean",
                    "title": "Approve",
                    "description": approval_text(action),
                },
                "comment": {
                    "type": "string",
                    "title": "Comment",
                    "description": "Why, for the agent (optional)",
                    "maxLength": 2000,
                },
            },
            "required": ["approved"],
        }
        return approval_text(action), schema
    questions = action.questions or []
    properties = {q["id"]: _question_schema(q) for q in questions}
    required = [q["id"] for q in questions if q.get("required", True)]
    schema = {"type": "object", "properties": properties, "required": required}
    message = action.prompt or "\n".join(q.get("question", "") for q in questions)
    return message, schema


def elicit_params(action: PendingAction) -> dict:
    message, schema = form(action)
    return {"mode": "form", "message": message, "requestedSchema": schema}


def input_requests(actions: list[PendingAction]) -> dict:
    """Return the `inputRequests` of an InputRequiredResult: one elicitation per action, by its id."""
    return {a.id: {"method": "elicitation/create", "params": elicit_params(a)} for a in actions}


# --- answers back ------------------------------------------------------------------------------

ACCEPT, DECLINE, CANCEL = "accept", "decline", "cancel"


@dataclass
class Reply:
    """What the person did with one elicitation: the REST answer body, or why there is none."""

    action: str  # accept, decline or cancel
    body: dict | None = None


def read_result(action: PendingAction, result: Any) -> Reply:
    """Read an ElicitResult for an action (INVALID_PARAMS when it is not one)."""
    try:
        parsed = ElicitResult.model_validate(result)
    except ValidationError:
        raise protocol.invalid_params(f"Not an elicitation result for action {action.id}") from None
    content = parsed.content or {}
    if action.kind == "approval":
        if parsed.action == DECLINE:
            return Reply(DECLINE, {"approved": False})
        if parsed.action == CANCEL:
            return Reply(CANCEL)
        body: dict[str, Any] = {"approved": content.get("approved")}
        if content.get("comment"):
            body["comment"] = content["comment"]
        return Reply(ACCEPT, body)
    if parsed.action != ACCEPT:
        return Reply(parsed.action)
    answers = {k: v for k, v in content.items() if v not in (None, "", [])}
    return Reply(ACCEPT, {"answers": answers})


# --- in words ----------------------------------------------------------------------------------


def _question_line(action: PendingAction, q: dict) -> str:
    line = f"- {action.id} (question {q['id']}): {q.get('question', '')}"
    options = [str(o.get("value", o.get("label"))) for o in q.get("options") or []]
    if options:
        line += f" Options: {', '.join(options)}."
    if q.get("multiSelect"):
        line += " (several values)"
    return line


def describe(actions: list[PendingAction]) -> str:
    """Return what the actions ask, one line each, and how task_answer answers them."""
    lines = ["waiting for input:"]
    for action in actions:
        if action.kind == "approval":
            lines.append(f"- {action.id} (approval): {approval_text(action)}")
        else:
            lines.extend(_question_line(action, q) for q in action.questions or [])
    lines.append(ANSWER_HINT)
    return "\n".join(lines)


# --- requestState ------------------------------------------------------------------------------


@dataclass
class State:
    """What a 2026-07-28 tools/call that asked for input resumes: its task and what it asked."""

    task_id: str
    tool: str
    action_ids: list[str]


def seal(session, tool: str, task_id: str, action_ids: list[str]) -> str:
    payload = {
        "t": task_id,
        "n": tool,
        "a": action_ids,
        "c": session.conversation_id,
        "u": session.caller.owner_id,
    }
    return signing.dumps(payload, salt=STATE_SALT, compress=True)


def unseal(session, tool: str, token: Any) -> State:
    """Open the state a retried call echoes; INVALID_PARAMS unless this server sealed it for it."""
    refused = protocol.invalid_params("requestState is not one this server gave for this call")
    if not isinstance(token, str):
        raise refused
    try:
        payload = signing.loads(token, salt=STATE_SALT, max_age=STATE_MAX_AGE)
    except signing.BadSignature:  # SignatureExpired included
        raise refused from None
    if (
        not isinstance(payload, dict)
        or payload.get("n") != tool
        or payload.get("c") != session.conversation_id
        or payload.get("u") != session.caller.owner_id
    ):
        raise refused
    return State(payload["t"], tool, list(payload.get("a") or []))
