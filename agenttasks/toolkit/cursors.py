"""Signed cursors for the paged lists (docs/rest.md#pagination): keyset pages by `cursor`.

A cursor names the last item of a page by its sort key (for tasks: `created_at` and `id`), signed
with the site's SECRET_KEY and the list's name, so it can be neither forged nor edited nor used on
another list. The next page is the rows strictly after that key in the list's order: rows written
meanwhile ahead of the cursor are not seen, and none is seen twice. A page reads the same
statements whatever its depth: one aggregate (the total and the rows up to the cursor) and one
keyset read along the list's index.
"""

import dataclasses
from dataclasses import dataclass
from datetime import datetime

from django.core import signing
from django.db.models import Count, Q

from . import errors
from .pagination import page, page_params

SALT = "agenttasks.api.cursor"
INVALID = "Invalid cursor"
BOTH = "cursor and offset cannot be used together"


@dataclass(frozen=True)
class Keyset:
    """A list's order: its name (bound into the cursor), its key fields and their direction."""

    name: str
    fields: tuple[str, ...]
    descending: bool

    def of(self, scope: str) -> "Keyset":
        """Return this order within one parent (a conversation's messages): its cursors fit no
        other."""
        return dataclasses.replace(self, name=f"{self.name}/{scope}")

    @property
    def ordering(self) -> list[str]:
        return [f"-{f}" if self.descending else f for f in self.fields]

    def cursor(self, item) -> str:
        """Return the signed cursor naming `item` (the last item of a page)."""
        values = [_dump(getattr(item, f)) for f in self.fields]
        return signing.dumps([self.name, values], salt=SALT, compress=False)

    def position(self, raw: str) -> list:
        """Decode a cursor of this list, or refuse it (400 Invalid cursor)."""
        try:
            name, values = signing.loads(raw, salt=SALT)
            if name != self.name or len(values) != len(self.fields):
                raise ValueError(name)
            return [_load(v) for v in values]
        except (signing.BadSignature, ValueError, TypeError):
            raise errors.validation(INVALID, "cursor") from None

    def after(self, values: list) -> Q:
        """Return rows strictly after the position, in this order."""
        op = "lt" if self.descending else "gt"
        first, first_value = self.fields[0], values[0]
        if len(self.fields) == 1:
            return Q(**{f"{first}__{op}": first_value})
        second, second_value = self.fields[1], values[1]
        # The bound on the first field alone lets the database start the index scan there.
        return Q(**{f"{first}__{op}e": first_value}) & (
            Q(**{f"{first}__{op}": first_value})
            | Q(**{first: first_value, f"{second}__{op}": second_value})
        )


def _dump(value):
    if isinstance(value, datetime):
        return ["t", value.isoformat()]
    return value


def _load(value):
    if isinstance(value, list) and len(value) == 2 and value[0] == "t":
        parsed = datetime.fromisoformat(value[1])
        if parsed.tzinfo is None:
            raise ValueError(value)
        return parsed
    if isinstance(value, (str, int)) and not isinstance(value, bool):
        return value
    raise ValueError(value)


def params(request, keyset: Keyset, default: int, maximum: int) -> tuple[int, int, list | None]:
    """Return (limit, offset, position); `cursor` and `offset` together are refused."""
    limit, offset = page_params(request, default, maximum)
    raw = request.query_params.get("cursor")
    if raw is None:
        return limit, offset, None
    if request.query_params.get("offset") is not None:
        raise errors.validation(BOTH, "cursor", "offset")
    return limit, offset, keyset.position(raw)


def keyset_page(rows, keyset: Keyset, limit: int, offset: int, position):
    """Return (items, total, offset, nextCursor) of one page, by offset or after a cursor."""
    rows = rows.order_by(*keyset.ordering)
    if position is None:
        items, total = page(rows, limit, offset)
        more = offset + len(items) < total
    else:
        after = keyset.after(position)
        counted = rows.aggregate(total=Count("pk"), before=Count("pk", filter=~after))
        total, offset = counted["total"], counted["before"]
        fetched = list(rows.filter(after)[: limit + 1])
        items, more = fetched[:limit], len(fetched) > limit
    next_cursor = keyset.cursor(items[-1]) if more and items else None
    return items, total, offset, next_cursor


def page_body(key: str, items: list, total: int, limit: int, offset: int, next_cursor) -> dict:
    return {
        key: items,
        "total": total,
        "limit": limit,
        "offset": offset,
        "hasMore": next_cursor is not None,
        "nextCursor": next_cursor,
    }
