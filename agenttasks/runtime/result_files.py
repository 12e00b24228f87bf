"""A callable reply's files (`Reply(files=…)`): checked, stored, and listed on the result.

Each item is a dict `{"name": str, "mimeType": str, "content": bytes | str}` (a str is stored as
UTF-8). The files are stored like uploads (FILE_STORAGE, the agent's `retentionDays`) as File rows
of the task's conversation, owned by the task's owner, so `GET /files/{id}` serves them to that
owner and they go with the conversation (a delete, or `agenttasks_prune`). The result lists them as FileRefs (docs/rest.md#files).
"""

from django.db import transaction

from ..store import files

MAX_NAME = 255


class ReplyFileError(ValueError):
    """A reply file that cannot be kept; the run fails with this message."""


def upload(index: int, item, max_size: int) -> files.Upload:
    """Check one reply file and return it as an Upload."""
    at = f"Reply.files[{index}]"
    if not isinstance(item, dict):
        raise ReplyFileError(f"{at} must be a dict with name, mimeType and content")
    name = item.get("name")
    if not isinstance(name, str) or not files.clean_name(name):
        raise ReplyFileError(f"{at}.name is required")
    name = files.clean_name(name)
    if len(name) > MAX_NAME:
        raise ReplyFileError(f"{at}.name must be at most {MAX_NAME} characters")
    raw_type = item.get("mimeType", item.get("mime_type"))
    mime_type = files.clean_mime_type(raw_type) if isinstance(raw_type, str) else None
    if mime_type is None:
        raise ReplyFileError(f"{at}.mimeType must look like type/subtype")
    content = item.get("content")
    if isinstance(content, str):
        content = content.encode("utf-8", "surrogatepass")
    if not isinstance(content, (bytes, bytearray)):
        raise ReplyFileError(f"{at}.content must be bytes or a string")
    if len(content) > max_size:
        raise ReplyFileError(f"File {name} is {len(content)} bytes; the limit is {max_size} bytes")
    return files.Upload(index=index, name=name, mime_type=mime_type, content=bytes(content))


def store(ctx, items) -> list[dict]:
    """Check and store a reply's files; return their FileRefs (none: [])."""
    if not items:
        return []
    if not isinstance(items, (list, tuple)):
        raise ReplyFileError("Reply.files must be a list")
    rules = files.policy(ctx.agent)
    uploads = [upload(i, item, int(rules["maxSize"])) for i, item in enumerate(items)]
    with files.kept_only_on_success() as written, transaction.atomic():
        rows = files.save(
            uploads,
            conversation_id=ctx.conversation.id,
            owner=ctx.user,
            rules=rules,
            task_id=None,  # a task's own files are its input files (Task.files)
            written=written,
        )
    return [row.ref() for row in rows]
