"""A user message's files as OpenAI-compatible content parts (docs/delegation.md#files).

Images (`image/png`, `image/jpeg`, `image/gif`, `image/webp`) go as `image_url` parts holding a
data URL; `text/*` and `application/json` are inlined as text parts headed by the file's name and
cut at FILE_TEXT_CHARS characters; anything else, and a file whose bytes are gone, is a one-line
note with its name, type and size. A message without files keeps its plain string content.
"""

import base64

from ..models import File
from ..store.files import open_bytes

IMAGE_TYPES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})
FILE_TEXT_CHARS = 20_000
CUT_MARK = "\n[… cut at {n} characters]"


def _inlined(mime_type: str) -> bool:
    return mime_type.startswith("text/") or mime_type == "application/json"


def note(ref: dict, why: str = "") -> dict:
    """Return the one-line note of a file the model cannot read here."""
    text = f"[Attached file: {ref.get('name')} ({ref.get('mimeType')}, {ref.get('size')} bytes)"
    return {"type": "text", "text": text + (f"; {why}]" if why else "]")}


def part(ref: dict, row: File | None) -> dict:
    """Return one file's content part."""
    mime_type = (ref.get("mimeType") or "").lower()
    if row is None or not (mime_type in IMAGE_TYPES or _inlined(mime_type)):
        return note(ref, "" if row is not None else "no longer available")
    try:
        with open_bytes(row) as handle:
            data = handle.read()
    except FileNotFoundError:
        return note(ref, "no longer available")
    if mime_type in IMAGE_TYPES:
        url = f"data:{mime_type};base64,{base64.b64encode(data).decode('ascii')}"
        return {"type": "image_url", "image_url": {"url": url}}
    text = data.decode("utf-8", errors="replace")
    if len(text) > FILE_TEXT_CHARS:
        text = text[:FILE_TEXT_CHARS] + CUT_MARK.format(n=FILE_TEXT_CHARS)
    return {"type": "text", "text": f"File: {ref.get('name')}\n{text}"}


def user_content(content: str, refs: list) -> str | list[dict]:
    """Return a user message's content: the text, then one part per file (the text alone without)."""
    refs = [r for r in refs or [] if isinstance(r, dict)]
    if not refs:
        return content
    rows = File.objects.in_bulk([r.get("id") for r in refs])
    parts = [{"type": "text", "text": content}] if content else []
    return parts + [part(ref, rows.get(ref.get("id"))) for ref in refs]
