"""The SQL the migrations install on PostgreSQL: one file per version of a function.

A later migration adds a file with the next version (`_v2`) instead of rewriting one that a
database may already hold; the version it replaces moves to `agenttasks/migrations/sql/`, read
only by the migration that installed it.

What SQL and Python share is written into a file when a migration installs it (`render`), so each
has one source: `:live` (states.LIVE), `:notified` (states.NOTIFIED), `:allowed` (the pairs of
states.TRANSITIONS), `:trigger_names` (the triggers states.trigger_name renames), `:id_length` and
`:id_alphabet` (the id format of agenttasks.ids), `:ormq` (django-q2's queue table),
`:runs_channel` (the channel worker processes listen on) and the channels of agenttasks.broker.listen
(`:events_channel`, `:stop_channel`, `:task_ended_channel`). Migrations load it once the app
registry is ready (it reads django-q2's model).
"""

import json
from collections.abc import Callable
from importlib.resources import files
from typing import Any

from ..broker.listen import EVENTS_CHANNEL, STOP_CHANNEL, TASK_ENDED_CHANNEL
from ..broker.queue import ORMQ_TABLE, RUNS_CHANNEL
from ..ids import ALPHABET, ID_LENGTH
from ..states import LIVE, NOTIFIED, TRANSITIONS, RunTrigger, trigger_name

HISTORY = files("agenttasks.migrations").joinpath("sql")


def read(name: str) -> str:
    """Return the text of a `.sql` file: a current version, or one that a later one replaced."""
    path = files(__package__).joinpath(name)
    return (path if path.is_file() else HISTORY.joinpath(name)).read_text(encoding="utf-8")


def _literals(values) -> str:
    return ", ".join(f"'{value}'" for value in sorted(values))


def constants() -> dict[str, str]:
    """Return the SQL text of each constant that SQL and Python share, by placeholder."""
    return {
        ":events_channel": f"'{EVENTS_CHANNEL}'",
        ":allowed": _literals(f"{src}>{dst}" for src, dst in TRANSITIONS if src is not None),
        ":id_alphabet": f"'{ALPHABET}'",
        ":id_length": str(ID_LENGTH),
        ":live": _literals(LIVE),
        ":notified": _literals(NOTIFIED),
        ":ormq": ORMQ_TABLE,
        ":runs_channel": f"'{RUNS_CHANNEL}'",
        ":stop_channel": f"'{STOP_CHANNEL}'",
        ":task_ended_channel": f"'{TASK_ENDED_CHANNEL}'",
        ":trigger_names": f"'{json.dumps(_renamed_triggers())}'",
    }


def _renamed_triggers() -> dict[str, str]:
    return {
        trigger: trigger_name(trigger) for trigger in RunTrigger if trigger_name(trigger) != trigger
    }


def render(name: str) -> str:
    """Return a `.sql` file with the shared constants written in."""
    text = read(name)
    # Longest first, so that no placeholder is the start of another one.
    for placeholder, value in sorted(constants().items(), key=lambda item: -len(item[0])):
        text = text.replace(placeholder, value)
    return text


def on_postgres(sql: str | Callable[[], str]) -> Callable[[Any, Any], None]:
    """Return a migration step that runs `sql` (or what it returns) on PostgreSQL only."""

    def run(apps, schema_editor) -> None:
        if schema_editor.connection.vendor == "postgresql":
            with schema_editor.connection.cursor() as cursor:
                cursor.execute(sql() if callable(sql) else sql)

    return run
