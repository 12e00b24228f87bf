"""Idempotent writes (docs/rest.md#idempotent-writes): the `Idempotency-Key` header.

A request with a key runs in one transaction that first inserts the key's row, then does the
effect, then records the answer on the row. A repeat inserting the same key waits on that row's
unique index until the first commits (PostgreSQL), then finds the answer and replays it; a repeat
still waiting after IDEMPOTENCY_WAIT seconds answers 409. If the first fails (a 5xx, a 429), its
transaction rolls back or its row is removed, and the key stays unused. Without the header
nothing here runs, so the lean create path is unchanged.
"""

import functools
import hashlib
import json
import re
from datetime import timedelta
from urllib.parse import quote

from django.db import IntegrityError, OperationalError, connection, transaction
from django.utils import timezone
from rest_framework.response import Response

from .. import store
from ..conf import app_settings
from ..models import IdempotencyKey
from ..toolkit import errors
from ..toolkit.identity import user_of

HEADER = "Idempotency-Key"
REPLAYED = "Idempotent-Replayed"
KEY = re.compile(r"[\x20-\x7e]{1,255}")
INVALID = "Idempotency-Key must be 1-255 printable ASCII characters"
REUSED = "This Idempotency-Key was used with a different request"
IN_PROGRESS = "A request with this Idempotency-Key is still being processed; try again later"
LOCK_NOT_AVAILABLE = "55P03"
RECORDED_HEADERS = ("Location",)
ATTEMPTS = 3
PATH_SAFE = "/:@!$&'()*+,;=-._~"
# The one key of a recorded body kept as JSON text (see _storable).
ENCODED = "agenttasks:json"


def key_of(request) -> str | None:
    """Return the request's Idempotency-Key, None without one; refuse a malformed one (400)."""
    raw = request.META.get("HTTP_IDEMPOTENCY_KEY")
    if raw is None:
        return None
    if not KEY.fullmatch(raw):
        raise errors.validation(INVALID, HEADER)
    return raw


def idempotent(method):
    """Make a view's POST honour the Idempotency-Key header."""

    @functools.wraps(method)
    def wrapper(view, request, *args, **kwargs):
        key = key_of(request)
        if key is None:
            return method(view, request, *args, **kwargs)
        return run(view, request, key, lambda: method(view, request, *args, **kwargs))

    return wrapper


def fingerprint(body) -> str:
    """Return the SHA-256 of the body as canonical JSON (an empty body reads as {})."""
    text = json.dumps(
        body if body is not None else {}, sort_keys=True, separators=(",", ":"), ensure_ascii=False
    )
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


@store.retried  # the request's transaction, when PostgreSQL chose it as a deadlock's victim
def run(view, request, key: str, call):
    """Answer a keyed request: replay the recorded answer, or run it and record its answer."""
    user = user_of(request)
    principal = f"user:{user.pk}" if user is not None else "anonymous"
    wanted = {
        "method": request.method,
        # Percent-encoded: a path may hold a NUL (`task_%00`), which PostgreSQL's text cannot.
        "path": quote(request.path.rstrip("/") or "/", safe=PATH_SAFE, errors="surrogatepass"),
        "request_hash": fingerprint(view.body),
    }
    with transaction.atomic():
        row, found = _claim(principal, user, key, wanted)
        if found is not None:
            return _replay(found, wanted)
        try:
            response = call()
        except Exception as exc:
            error = errors.translate(exc, view.get_exception_handler_context())
            if error is None or not _recordable(error.status) or transaction.get_rollback():
                raise  # rolls the transaction back: the key stays unused
            response = Response(error.body(), status=error.status, headers=error.headers)
        if _recordable(response.status_code):
            headers = {h: response[h] for h in RECORDED_HEADERS if response.has_header(h)}
            IdempotencyKey.objects.filter(pk=row.pk).update(
                status_code=response.status_code,
                response_body=_storable(response.data),
                response_headers=headers,
            )
        else:
            IdempotencyKey.objects.filter(pk=row.pk).delete()
    return response


def _recordable(status: int) -> bool:
    return status < 500 and status != 429


def _claim(principal: str, user, key: str, wanted: dict):
    """Insert the key's row (ours: (row, None)) or return the committed one ((None, found))."""
    for _ in range(ATTEMPTS):
        now = timezone.now()
        try:
            with _lock_timeout(app_settings.IDEMPOTENCY_WAIT), transaction.atomic():
                row = IdempotencyKey.objects.create(
                    principal=principal,
                    owner=user,
                    key=key,
                    created_at=now,
                    expires_at=now + timedelta(seconds=app_settings.IDEMPOTENCY_TTL),
                    **wanted,
                )
            return row, None
        except IntegrityError:
            pass
        except OperationalError as exc:
            if getattr(exc.__cause__, "sqlstate", None) == LOCK_NOT_AVAILABLE:
                raise errors.conflict("idempotency_key_in_progress", IN_PROGRESS) from None
            raise
        found = IdempotencyKey.objects.filter(principal=principal, key=key).first()
        if found is None:
            continue  # it lapsed and was removed meanwhile: claim it afresh
        if found.expires_at <= now:
            IdempotencyKey.objects.filter(pk=found.pk, expires_at__lte=now).delete()
            continue
        return None, found
    raise errors.conflict("idempotency_key_in_progress", IN_PROGRESS)


class _lock_timeout:
    """Bound the wait for a concurrent holder of the key (PostgreSQL's lock_timeout)."""

    def __init__(self, seconds: float):
        self.value = f"{max(int(seconds * 1000), 1)}ms"
        self.previous = None

    def __enter__(self):
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT current_setting('lock_timeout'), set_config('lock_timeout', %s, true)",
                    [self.value],
                )
                self.previous = cursor.fetchone()[0]
        return self

    def __exit__(self, *exc_info):
        if self.previous is not None and not connection.needs_rollback:
            with connection.cursor() as cursor:
                cursor.execute("SELECT set_config('lock_timeout', %s, true)", [self.previous])
        return False


def _replay(found: IdempotencyKey, wanted: dict) -> Response:
    if any(getattr(found, field) != value for field, value in wanted.items()):
        raise errors.ApiError(422, "idempotency_key_reused", REUSED)
    if found.status_code is None:
        raise errors.conflict("idempotency_key_in_progress", IN_PROGRESS)
    headers = {**(found.response_headers or {}), REPLAYED: "true"}
    return Response(_stored(found.response_body), status=found.status_code, headers=headers)


def _storable(body):
    """The body as JSONB can hold it: one quoting a NUL or a lone surrogate is kept as JSON text."""
    text = json.dumps(body, ensure_ascii=False)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return {ENCODED: json.dumps(body)}
    return body if "\\u0000" not in text else {ENCODED: text}


def _stored(body):
    """Read back what `_storable` kept."""
    if isinstance(body, dict) and set(body) == {ENCODED}:
        return json.loads(body[ENCODED])
    return body
