"""limit/offset pages (docs/rest.md#pagination) and the strict parsing of integer query parameters.

Cursor pages and the page body are in `cursors`.
"""

import re

from . import errors

DIGITS = re.compile(r"[0-9]+")
# Far beyond any real row count, and small enough for every database's integer parameters.
SQL_MAX = 2**62


def _int(raw: str) -> int:
    """Read validated digits, saturating at SQL_MAX (int() refuses thousands of digits)."""
    digits = raw.lstrip("0") or "0"
    return SQL_MAX if len(digits) > 18 else min(int(digits), SQL_MAX)


def non_negative(raw: str | None, name: str, message: str, default: int = 0) -> int:
    """Parse a non-negative integer query value, or refuse it with `message`."""
    if raw is None:
        return default
    if not DIGITS.fullmatch(raw):
        raise errors.validation(message, name)
    return _int(raw)


def page_params(request, default: int, maximum: int) -> tuple[int, int]:
    """Return (limit, offset); a limit above the maximum is clamped to it."""
    params = request.query_params
    limit_raw = params.get("limit")
    if limit_raw is None:
        limit = default
    else:
        if not DIGITS.fullmatch(limit_raw) or _int(limit_raw) < 1:
            raise errors.validation("limit must be a positive integer", "limit")
        limit = min(_int(limit_raw), maximum)
    offset = non_negative(params.get("offset"), "offset", "offset must be a non-negative integer")
    return limit, offset


def page(queryset, limit: int, offset: int) -> tuple[list, int]:
    """Return (items, total) of one page; an offset past the end reads nothing."""
    total = queryset.count()
    if offset >= total:
        return [], total
    return list(queryset[offset : offset + limit]), total
