"""DRF's token authentication, with a lookup that skips the ORM's query compiling.

A create through REST spent more than a third of its web CPU in DRF's token lookup
(`select_related("user").get(key=...)`: building the query, compiling its join, instantiating two
models). This class reads the token and its user in one raw statement, written once per process,
and answers as DRF's does: the same user and token, the same errors, nothing cached (a deleted
token fails at once). Use it in place of `rest_framework.authentication.TokenAuthentication`
(docs/performance.md#cost-per-task).
"""

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.contrib.auth import get_user_model
from django.db import connections, router
from django.utils.translation import gettext_lazy as _
from rest_framework import authentication, exceptions


class TokenAuthentication(authentication.TokenAuthentication):
    """`Authorization: Token <key>`, as DRF's, with its lookup in one raw statement."""

    def authenticate_credentials(self, key):
        token_model, user_model = self.get_model(), get_user_model()
        alias = router.db_for_read(token_model)
        lookup = _lookup(token_model, user_model, alias)
        with connections[alias].cursor() as cursor:
            cursor.execute(lookup.sql, [key])
            row = cursor.fetchone()
        if row is None:
            raise exceptions.AuthenticationFailed(_("Invalid token."))
        values = lookup.convert(row, connections[alias])
        split = len(lookup.token_fields)
        token = token_model.from_db(alias, lookup.token_fields, values[:split])
        user = user_model.from_db(alias, lookup.user_fields, values[split:])
        token.user = user  # what select_related would have cached
        if not user.is_active:
            raise exceptions.AuthenticationFailed(_("User inactive or deleted."))
        return (user, token)


@dataclass(frozen=True)
class _Lookup:
    """The statement reading a token and its user by key, and how to read its row."""

    sql: str
    token_fields: list[str]
    user_fields: list[str]
    converters: list[tuple[int, Callable, Any]]  # (column, converter, its expression)

    def convert(self, row, connection) -> list:
        """The row's values as the ORM would give them (SQLite's datetimes made aware, ...)."""
        values = list(row)
        for i, converter, column in self.converters:
            values[i] = converter(values[i], column, connection)
        return values


@functools.cache
def _lookup(token_model, user_model, alias: str) -> _Lookup:
    token_fields = token_model._meta.concrete_fields
    user_fields = user_model._meta.concrete_fields
    user_fk = token_model._meta.get_field("user")
    database = connections[alias]
    quote = database.ops.quote_name
    selected = [f"t.{quote(f.column)}" for f in token_fields]
    selected += [f"u.{quote(f.column)}" for f in user_fields]
    sql = (
        f"SELECT {', '.join(selected)} FROM {quote(token_model._meta.db_table)} t"
        f" JOIN {quote(user_model._meta.db_table)} u"
        f" ON u.{quote(user_fk.target_field.column)} = t.{quote(user_fk.column)}"
        f" WHERE t.{quote(token_model._meta.get_field('key').column)} = %s"
    )
    columns = [f.get_col("t") for f in token_fields] + [f.get_col("u") for f in user_fields]
    converters = [
        (i, converter, column)
        for i, column in enumerate(columns)
        for converter in database.ops.get_db_converters(column)
        + column.field.get_db_converters(database)
    ]
    return _Lookup(
        sql,
        [f.attname for f in token_fields],
        [f.attname for f in user_fields],
        converters,
    )
