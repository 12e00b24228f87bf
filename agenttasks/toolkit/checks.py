"""Checks of request values, each raising the refusal docs/rest.md gives (`errors.ApiError`).

REST's request bodies (`api/serializers/requests.py`) apply them field by field; A2A and MCP apply
the same checks to what their messages and tool arguments carry.
"""

import json
from datetime import datetime

from django.utils.dateparse import parse_datetime

from ..conf import app_settings
from ..lifecycle import priorities
from ..lifecycle.answers import AnswerError, checked, unstorable
from ..models import RESERVED_METADATA
from ..store import files
from . import errors


def storable(value, path: str) -> None:
    """Refuse text the database cannot store, rather than failing with a 500 later."""
    bad = unstorable(value, path)
    if bad:
        raise errors.validation(
            f"{bad} must not contain NUL characters or unpaired surrogates", bad
        )


def blank(value) -> bool:
    return value is None or (isinstance(value, str) and not value.strip())


def metadata(value, path: str = "metadata") -> dict:
    """Check a JSON object within MAX_METADATA_BYTES, measured as compact UTF-8 JSON."""
    if not isinstance(value, dict):
        raise errors.validation(f"{path} must be a JSON object", path)
    storable(value, path)
    limit = int(app_settings.MAX_METADATA_BYTES)
    size = len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8"))
    if size > limit:
        raise errors.validation(f"{path} must be at most {limit} bytes", path)
    return value


def priority(value, name: str = "priority") -> int:
    """Check a task priority: an integer from -100 to 100 (lifecycle.priorities).

    A whole float (`5.0`) counts: A2A's clients send metadata numbers as protobuf doubles.
    """
    low, high = priorities.LOWEST, priorities.HIGHEST
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise errors.validation(f"{name} must be an integer from {low} to {high}", name)
    return value


def moment(value, name: str = "notBefore") -> datetime:
    """Check an ISO 8601 date and time with its offset (`2026-12-05T09:00:00Z`)."""
    try:
        parsed = parse_datetime(value) if isinstance(value, str) else None
    except ValueError:  # well formed, but no such day or hour
        parsed = None
    if parsed is None or parsed.tzinfo is None:
        raise errors.validation(
            f"{name} must be an ISO 8601 date and time with an offset, "
            "such as 2026-12-05T09:00:00Z",
            name,
        )
    return parsed


def reserved_free(value: dict) -> None:
    """Refuse client metadata that names the server's own keys."""
    offending = [f"metadata.{k}" for k in RESERVED_METADATA if k in value]
    if offending:
        raise errors.validation("metadata.source and metadata.taskId are reserved", *offending)


def text(value, name: str, *, required_message: str, code: str = "VALIDATION_ERROR") -> str:
    """Check a required non-blank string of at most MAX_INPUT_CHARS characters."""
    if not isinstance(value, str) or not value.strip():
        if code == "VALIDATION_ERROR":
            raise errors.validation(required_message, name)
        raise errors.ApiError(400, code, required_message)
    limit = int(app_settings.MAX_INPUT_CHARS)
    if len(value) > limit:
        raise errors.validation(f"{name} must be at most {limit} characters", name)
    storable(value, name)
    return value


def uploads(value) -> list[files.Upload]:
    """Check FileInput entries (the structure of docs/rest.md#files) and decode them."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise errors.validation("files must be a list", "files")
    out = []
    for i, item in enumerate(value):
        at = f"files[{i}]"
        if not isinstance(item, dict):
            raise errors.validation(f"{at} must be an object", at)
        raw_name = item.get("name")
        name = files.clean_name(raw_name) if isinstance(raw_name, str) else ""
        if not name:
            raise errors.validation(f"{at}.name is required", f"{at}.name")
        if len(name) > files.MAX_NAME:
            raise errors.validation(
                f"{at}.name must be at most {files.MAX_NAME} characters", f"{at}.name"
            )
        storable(name, f"{at}.name")
        raw_type = item.get("mimeType")
        mime_type = files.clean_mime_type(raw_type) if isinstance(raw_type, str) else None
        if mime_type is None:
            raise errors.validation(f"{at}.mimeType must look like type/subtype", f"{at}.mimeType")
        content = item.get("content")
        data = files.decode(content) if isinstance(content, str) else None
        if data is None:
            raise errors.validation(f"{at}.content is not valid base64", f"{at}.content")
        out.append(files.Upload(index=i, name=name, mime_type=mime_type, content=data))
    return out


def answer(action, body) -> dict:
    """Check an answer to an approval or a question by the lifecycle's rules, refusing as REST does."""
    try:
        return checked(action, body if isinstance(body, dict) else {})
    except AnswerError as exc:
        raise errors.validation(exc.message, *([exc.field] if exc.field else [])) from None
