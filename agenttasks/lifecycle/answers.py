"""Answers to approvals and questions: the REST answer body, checked and normalized.

One set of rules for every door: REST (`api.serializers`), site code (`lifecycle.resolve_action`)
and the admin. A refusal is an `AnswerError` (a ValueError) naming the field at fault, with the
exact messages of docs/rest.md#approvals-and-questions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..models import PendingAction

APPROVAL_KEYS = frozenset({"approved", "comment"})
QUESTION_KEYS = frozenset({"answers"})
SHAPES = '{"approved": bool, "comment"?: str} for an approval, {"answers": {...}} for a question'


class AnswerError(ValueError):
    """An answer body that is refused; `field` is the request path at fault."""

    def __init__(self, message: str, field: str = "") -> None:
        super().__init__(message)
        self.message, self.field = message, field


def unstorable(value: object, path: str) -> str | None:
    """Return the path of the first text a database cannot store (NUL, lone surrogate), or None."""
    if isinstance(value, str):
        if "\x00" in value:
            return path
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return path
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            found = unstorable(key, path) or unstorable(item, f"{path}.{key}")
            if found:
                return found
    if isinstance(value, list):
        for i, item in enumerate(value):
            found = unstorable(item, f"{path}[{i}]")
            if found:
                return found
    return None


def _storable(value: object, path: str) -> None:
    bad = unstorable(value, path)
    if bad:
        raise AnswerError(f"{bad} must not contain NUL characters or unpaired surrogates", bad)


def resolution(action: PendingAction, body: Any) -> dict[str, Any]:
    """Check a REST answer body strictly (no other keys) and return the store's resolution."""
    if not isinstance(body, dict):
        raise AnswerError(f"An answer must be a dict: {SHAPES}")
    allowed = APPROVAL_KEYS if action.kind == "approval" else QUESTION_KEYS
    unexpected = sorted(set(body) - allowed)
    if unexpected:
        raise AnswerError(
            f"Unexpected answer keys for a {action.kind}: {', '.join(map(str, unexpected))}; "
            f"expected {SHAPES}",
            str(unexpected[0]),
        )
    return checked(action, body)


def checked(action: PendingAction, body: dict[str, Any]) -> dict[str, Any]:
    """Check an answer body (other keys ignored, as REST does) and normalize it."""
    if action.kind == "approval":
        return approval(body)
    return question_answers(action, body)


def approval(data: dict[str, Any]) -> dict[str, Any]:
    approved = data.get("approved")
    if not isinstance(approved, bool):
        raise AnswerError("approved must be a boolean", "approved")
    out = {"status": "approved" if approved else "denied"}
    comment = data.get("comment")
    if comment is not None:
        if not isinstance(comment, str):
            raise AnswerError("comment must be a string", "comment")
        if len(comment) > 2000:
            raise AnswerError("comment must be at most 2000 characters", "comment")
        _storable(comment, "comment")
        if comment:
            out["comment"] = comment
    return out


def _answer(value: object, at: str) -> dict[str, Any] | None:
    """Normalize one answer to {"values": [...], "freeText"?}; None when malformed."""
    if isinstance(value, str):
        return {"values": [value] if value else []}
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return {"values": [v for v in value if v]}
    if isinstance(value, dict):
        values = value.get("values", [])
        free = value.get("freeText")
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            return None
        if free is not None and not isinstance(free, str):
            return None
        out: dict[str, Any] = {"values": [v for v in values if v]}
        if free:
            out["freeText"] = free
        return out
    return None


def question_answers(action: PendingAction, data: dict[str, Any]) -> dict[str, Any]:
    answers = data.get("answers")
    if not isinstance(answers, dict):
        raise AnswerError("answers is required", "answers")
    questions = {q["id"]: q for q in action.questions or []}
    for qid in answers:
        if qid not in questions:
            raise AnswerError(f"answers.{qid}: unknown question", f"answers.{qid}")
    _storable(answers, "answers")
    normalized = {}
    for qid, q in questions.items():
        at = f"answers.{qid}"
        answer = _answer(answers[qid], at) if qid in answers else {"values": []}
        if answer is None:
            raise AnswerError(
                f"{at} must be a value, a list of values or an object with values", at
            )
        values, free = answer["values"], answer.get("freeText")
        if not values and not free:
            if q.get("required", True):
                raise AnswerError(f"{at} is required", at)
            continue
        options = [o.get("value", o.get("label")) for o in q.get("options") or []]
        if options and not q.get("allowFreeText", not options):
            for value in values:
                if value not in options:
                    raise AnswerError(f'{at}: "{value}" is not an option', at)
            if free:
                raise AnswerError(f"{at} takes no free text", at)
        if len(values) > 1 and not q.get("multiSelect", False):
            raise AnswerError(f"{at} takes one value", at)
        normalized[qid] = answer
    return {"status": "answered", "answers": normalized}
