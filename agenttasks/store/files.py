"""Files: the agent's file policy, base64 uploads, Django storage, retention.

Files arrive base64-encoded inside a task's or a message's JSON body, are checked against the
agent's `files` policy (merged over AGENTTASKS["FILES"]), and are stored with the storage named by
AGENTTASKS["FILE_STORAGE"]. Their rows are written in the request's transaction; bytes written for
a request that then fails are removed, so a failed request keeps nothing.
"""

import base64
import binascii
import fnmatch
import hashlib
import logging
import os
import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import IO, Any

from django.core.exceptions import SuspiciousFileOperation
from django.core.files.base import ContentFile
from django.core.files.storage import Storage, storages
from django.db import transaction
from django.db.models import F, QuerySet
from django.utils import timezone
from django.utils.text import get_valid_filename

from .. import ids
from ..conf import app_settings
from ..models import File

logger = logging.getLogger(__name__)

MIME_RE = re.compile(r"[a-z0-9][a-z0-9!#$&^_.+-]*/[a-z0-9*][a-z0-9!#$&^_.+*-]*")
WHITESPACE = re.compile(rb"[ \t\n\r\f\v]+")
MAX_NAME = 255  # characters of the display name (File.name)
STORED_NAME_BYTES = 100  # bytes of the stored name's last part: file systems allow 255
MAX_EXTENSION_BYTES = 16


def storage() -> Storage:
    """Return the storage files are kept in (AGENTTASKS["FILE_STORAGE"])."""
    return storages[app_settings.FILE_STORAGE]


def remove_stored(names: Iterable[str]) -> None:
    """Delete stored bytes once the current transaction commits."""

    def remove() -> None:
        remove_now(names)

    transaction.on_commit(remove)


def remove_now(names: Iterable[str]) -> None:
    """Delete stored bytes now, logging (not raising) what cannot be deleted."""
    for name in names:
        try:
            storage().delete(name)
        except Exception:
            logger.exception("files.remove_failed name=%s", name)


# --- the policy ------------------------------------------------------------------------------


class FileRefused(Exception):
    """A file the agent's policy refuses; the API answers it with this status and code."""

    def __init__(
        self, status: int, code: str, message: str, details: dict[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.details = status, code, message, details


@dataclass
class Upload:
    """One decoded FileInput of a request, with the id its row will have."""

    index: int
    name: str
    mime_type: str
    content: bytes
    id: str = ""

    def __post_init__(self) -> None:
        self.id = self.id or ids.new_file_id()

    @property
    def size(self) -> int:
        return len(self.content)

    def ref(self) -> dict[str, Any]:
        """Return the FileRef that messages and tasks embed."""
        return {"id": self.id, "name": self.name, "mimeType": self.mime_type, "size": self.size}


def policy(agent: object) -> dict[str, Any]:
    """Return an agent's file policy: its `files` merged over AGENTTASKS["FILES"]."""
    return {**app_settings.FILES, **(getattr(agent, "files", None) or {})}


def clean_name(name: str) -> str:
    """Strip any directory part of an uploaded file's name."""
    return re.split(r"[/\\]", name)[-1].strip()


def clean_mime_type(value: str) -> str | None:
    """Return `type/subtype` in lower case without parameters, or None if it is not one."""
    media = value.split(";", 1)[0].strip().lower()
    return media if MIME_RE.fullmatch(media) else None


def decode(text: str) -> bytes | None:
    """Decode standard base64 (ASCII whitespace ignored, padding required), or None."""
    try:
        raw = WHITESPACE.sub(b"", text.encode("ascii"))
    except UnicodeEncodeError:
        return None
    if len(raw) % 4:
        return None
    try:
        return base64.b64decode(raw, validate=True)
    except (binascii.Error, ValueError):
        return None


def type_allowed(mime_type: str, patterns: Iterable[str]) -> bool:
    """Say whether a type matches `type/subtype`, `type/*` or `*/*` patterns."""
    return any(fnmatch.fnmatchcase(mime_type, str(p).lower()) for p in patterns or ())


def check(agent_id: str, rules: dict[str, Any], uploads: list[Upload], existing: int = 0) -> None:
    """Apply the policy in the order of docs/rest.md#files; raise FileRefused at the first fault."""
    if not uploads:
        return
    if not rules.get("enabled", True):
        raise FileRefused(403, "attachments_disabled", f"Agent {agent_id} does not accept files")
    limit = int(rules.get("maxCount") or 0)
    if limit and existing + len(uploads) > limit:
        raise FileRefused(
            409,
            "too_many_files",
            f"Agent {agent_id} accepts at most {limit} files per conversation",
            {"limit": limit, "existing": existing, "added": len(uploads)},
        )
    max_size = int(rules.get("maxSize") or 0)
    for upload in uploads:
        if not type_allowed(upload.mime_type, rules.get("allowedTypes", ["*/*"])):
            raise FileRefused(
                415,
                "unsupported_media_type",
                f"File type {upload.mime_type} is not allowed for agent {agent_id}",
                {"index": upload.index, "name": upload.name, "mimeType": upload.mime_type},
            )
        if max_size and upload.size > max_size:
            raise FileRefused(
                400,
                "file_too_large",
                f"File {upload.name} is {upload.size} bytes; the limit is {max_size} bytes",
                {
                    "index": upload.index,
                    "name": upload.name,
                    "size": upload.size,
                    "limit": max_size,
                },
            )


# --- storing ---------------------------------------------------------------------------------


@contextmanager
def kept_only_on_success() -> Iterator[list[str]]:
    """Yield a list that `save` fills with stored names; remove them if the block fails."""
    written: list[str] = []
    try:
        yield written
    except BaseException:
        remove_now(written)
        raise


def fit_bytes(name: str, limit: int = STORED_NAME_BYTES) -> str:
    """Cut a file name to at most `limit` UTF-8 bytes, on a character boundary, keeping its
    extension (a CJK character is 3 bytes: 100 of them overflow a file system's 255)."""
    if len(name.encode()) <= limit:
        return name
    stem, extension = os.path.splitext(name)
    if len(extension.encode()) > MAX_EXTENSION_BYTES:
        stem, extension = name, ""
    room = limit - len(extension.encode())
    return stem.encode()[:room].decode("utf-8", "ignore") + extension


def _storage_name(conversation_id: str, upload: Upload) -> str:
    try:
        safe = get_valid_filename(upload.name)
    except SuspiciousFileOperation:
        safe = "file"
    return f"agenttasks/{conversation_id}/{upload.id}/{fit_bytes(safe) or 'file'}"


def save(
    uploads: Iterable[Upload],
    *,
    conversation_id: str,
    owner: Any,
    rules: dict[str, Any],
    task_id: str | None = None,
    written: list[str] | None = None,
) -> list[File]:
    """Store the bytes and create the File rows (call inside the request's transaction)."""
    days = rules.get("retentionDays")
    rows = []
    for upload in uploads:
        name = storage().save(_storage_name(conversation_id, upload), ContentFile(upload.content))
        if written is not None:
            written.append(name)
        rows.append(
            File(
                id=upload.id,
                conversation_id=conversation_id,
                task_id=task_id,
                owner=owner,
                name=upload.name,
                mime_type=upload.mime_type,
                size=upload.size,
                sha256=hashlib.sha256(upload.content).hexdigest(),
                storage_name=name,
            )
        )
    File.objects.bulk_create(rows)
    if days:
        # Exactly `retentionDays` after the creation time the database row got.
        retention = timedelta(days=days)
        File.objects.filter(pk__in=[r.id for r in rows]).update(
            expires_at=F("created_at") + retention
        )
        for row in rows:
            row.expires_at = row.created_at + retention
    return rows


def open_bytes(file: File) -> IO[bytes]:
    """Open a file's stored bytes for reading; raise FileNotFoundError if they are gone."""
    try:
        return storage().open(file.storage_name, "rb")
    except (FileNotFoundError, OSError) as exc:
        raise FileNotFoundError(file.storage_name) from exc


# --- retention -------------------------------------------------------------------------------


def expired(now: datetime | None = None) -> QuerySet[File]:
    """Return files whose retention has passed."""
    return File.objects.filter(expires_at__lt=now or timezone.now()).order_by("expires_at", "id")


def prune(*, dry_run: bool = False, now: datetime | None = None) -> list[str]:
    """Delete files past their retention (rows now, bytes after commit); return their ids."""
    rows = list(expired(now).values_list("id", "storage_name"))
    if dry_run or not rows:
        return [file_id for file_id, _ in rows]
    with transaction.atomic():
        File.objects.filter(pk__in=[file_id for file_id, _ in rows]).delete()
        remove_stored([name for _, name in rows])
    return [file_id for file_id, _ in rows]
