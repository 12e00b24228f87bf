"""Request bodies (docs/rest.md#requests): JSON objects only, size decided before parsing, depth
right after.

The app reads the body itself instead of through DRF's parsers so that the size limit is its own
(MAX_REQUEST_BYTES, not DATA_UPLOAD_MAX_MEMORY_SIZE), a body without a content type is read as
JSON, and JSON the database cannot store (NaN, Infinity) is malformed here rather than a 500 later.
A body nested deeper than MAX_JSON_DEPTH is refused before any code walks it recursively (the
checks, the serializers and the database adapters all recurse).
"""

import json
from collections.abc import Iterable
from typing import Any

from rest_framework.parsers import BaseParser

from ..conf import app_settings
from . import errors

CHUNK = 1 << 16


class Unread(BaseParser):
    """DRF's parser slot, filled without reading the body (`parse` below reads it).

    Session authentication runs Django's CSRF check on DRF's request, and that check reads
    `request.POST`: with no parser at all DRF would answer 415 to every JSON write of a logged-in
    browser. This parser yields empty data for any content type and leaves the stream unread.
    Its media type is what the OpenAPI document lists for request bodies.
    """

    media_type = "application/json"

    def parse(self, stream, media_type=None, parser_context=None):
        return {}


def _constant(name):
    raise ValueError(f"{name} is not JSON")


def _float(text):
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError("number out of range")
    return value


def _declared_type(django_request) -> str:
    return (django_request.META.get("CONTENT_TYPE") or "").strip()


def _is_json(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media in ("", "application/json") or (
        media.startswith("application/") and media.endswith("+json")
    )


def _length(django_request) -> int:
    try:
        return max(int(django_request.META.get("CONTENT_LENGTH") or 0), 0)
    except ValueError:
        return 0


def _read(django_request, limit: int) -> bytes:
    if hasattr(django_request, "_body"):  # already read (a CSRF check parsed a form)
        return django_request._body
    chunks, size = [], 0
    while size <= limit:
        chunk = django_request.read(min(CHUNK, limit + 1 - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def parse(request):
    """Return the request's JSON object, or None for an empty body; raise the refusals of docs/rest.md#requests."""
    django_request = getattr(request, "_request", request)
    limit = int(app_settings.MAX_REQUEST_BYTES)
    length = _length(django_request)
    if length > limit:
        raise errors.body_too_large(limit)
    content_type = _declared_type(django_request)
    if length and not _is_json(content_type):
        raise errors.ApiError(
            415, "unsupported_media_type", f'Unsupported media type "{content_type}" in request.'
        )
    raw = _read(django_request, limit) if length else b""
    if len(raw) > limit:
        raise errors.body_too_large(limit)
    if not raw.strip():
        return None
    try:
        # Decoded strictly first: json.loads would guess UTF-16 or UTF-32 from the bytes, and a
        # decoded text that starts with a byte order mark does not parse.
        data = json.loads(raw.decode("utf-8"), parse_constant=_constant, parse_float=_float)
    except (ValueError, RecursionError):
        raise errors.validation("Malformed JSON body") from None
    if not isinstance(data, dict):
        raise errors.validation("The request body must be a JSON object")
    check_depth(data, int(app_settings.MAX_JSON_DEPTH))
    return data


def too_deep(data: dict, limit: int) -> str | None:
    """Return the top-level key under which the body nests deeper than `limit`, or None.

    The body itself is level 1. Iterative, so any depth the parser accepted can be measured.
    """
    stack = [(value, 2, key) for key, value in data.items()]
    while stack:
        value, depth, key = stack.pop()
        children: Iterable[Any]
        if isinstance(value, dict):
            children = value.values()
        elif isinstance(value, list):
            children = value
        else:
            continue
        if depth > limit:
            return key
        stack.extend((child, depth + 1, key) for child in children)
    return None


def check_depth(data: dict, limit: int) -> None:
    """Refuse (400) a body nested deeper than MAX_JSON_DEPTH levels."""
    key = too_deep(data, limit)
    if key is not None:
        raise errors.validation(
            f"The request body must not be nested more than {limit} levels deep", key
        )
