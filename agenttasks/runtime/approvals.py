"""Approvals and questions of the chat runtime: the `ask_user` tool and how answers settle calls.

A tool that needs approval and an `ask_user` call do not run when the model calls them: the run
pauses on a PendingAction (docs/delegation.md#approvals, #questions-ask_user). When the run resumes, the recorded
answer settles the call with the texts below.
"""

import json

from ..tools import ToolResult, tool
from ..types import ActionRequest
from .base import normalize_questions

ASK_USER_DESCRIPTION = (
    "Ask the person a question and wait for the answer. Use it only when you cannot continue "
    "without their input; your work pauses until they answer."
)
ASK_USER_PARAMETERS = {
    "type": "object",
    "properties": {
        "question": {"type": "string", "description": "The question for the person"},
        "options": {
            "type": "array",
            "items": {"type": "string"},
            "description": "Suggested answers the person can pick from (optional)",
        },
    },
    "required": ["question"],
}
EMPTY_QUESTION = 'invalid arguments for ask_user: property "question" must not be empty'
DENIED = "Tool call denied by the user"
APPROVAL_LAPSED = "Tool call denied: no answer before the approval deadline"
QUESTION_LAPSED = "No answer: the question was not answered before its deadline"


@tool(name="ask_user", description=ASK_USER_DESCRIPTION, parameters=ASK_USER_PARAMETERS)
def ask_user(ctx, args):
    """Ask the person a question (the chat runtime pauses the run instead of calling this)."""
    raise RuntimeError("ask_user is answered by a person through the chat runtime's pause")


def approval_prompt(spec, args: dict) -> str:
    """Return the prompt of an approval: the tool's own template when it formats, else the default."""
    if spec.approval_prompt:
        try:
            return spec.approval_prompt.format_map(args)
        except (KeyError, IndexError, ValueError, AttributeError, TypeError):
            pass
    dumped = json.dumps(args, ensure_ascii=False, sort_keys=True)
    return f"Allow {spec.name} with arguments {dumped}?"


def approval_request(spec, call_id: str, args: dict, deadline: dict) -> ActionRequest:
    """Return the PendingAction a call of a tool that needs approval asks for."""
    return ActionRequest(
        kind="approval",
        tool_name=spec.name,
        tool_call_id=call_id,
        args=args,
        prompt=approval_prompt(spec, args),
        **deadline,
    )


def question_request(call_id: str, args: dict, deadline: dict) -> ActionRequest:
    """Return the PendingAction an `ask_user` call asks for."""
    options = [str(option) for option in args.get("options") or []]
    question = {"question": args["question"], "options": options}
    return ActionRequest(
        kind="question",
        tool_name="ask_user",
        tool_call_id=call_id,
        questions=normalize_questions([question]),
        prompt=args["question"],
        **deadline,
    )


def denial(action) -> ToolResult | None:
    """Return the result of an approval that was not given, or None when it was approved."""
    if action.status == "approved":
        return None
    if action.status == "expired":
        return ToolResult(APPROVAL_LAPSED, is_error=True)
    comment = (action.resolution or {}).get("comment") or ""
    return ToolResult(f"{DENIED}: {comment}" if comment else DENIED, is_error=True)


def answer(action) -> ToolResult:
    """Return the result of an answered (or lapsed) question: the answer text, verbatim."""
    if action.status == "expired":
        return ToolResult(QUESTION_LAPSED, is_error=True)
    answers = (action.resolution or {}).get("answers") or {}
    parts = []
    for value in answers.values():
        if isinstance(value, str):
            parts.append(value)
        elif isinstance(value, list):
            parts.extend(str(v) for v in value)
        elif isinstance(value, dict):
            parts.extend(str(v) for v in value.get("values") or [])
            if value.get("freeText"):
                parts.append(str(value["freeText"]))
    return ToolResult(", ".join(parts))


def approved_args(action) -> dict:
    """Return the arguments an approved call runs with: the replacement the answer carries, if any."""
    replacement = (action.resolution or {}).get("args")
    return replacement if isinstance(replacement, dict) else dict(action.args or {})
