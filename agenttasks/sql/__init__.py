"""The SQL the migrations install on PostgreSQL: one template per version of a function.

What SQL and Python share is written into a template from Python (`render`), so each has one
source: `:live` (states.LIVE), `:notified` (states.NOTIFIED), `:run_ended` (states.RUN_ENDED),
`:allowed` (the pairs of states.TRANSITIONS), `:trigger_names` (the triggers states.trigger_name
renames), `:id_length` and `:id_alphabet` (the id format of agenttasks.ids), `:ormq` (django-q2's
queue table), `:runs_channel` (the channel worker processes listen on), `:jobs_channel` (the
channel idle pushers of agenttasks.broker.orm listen on) and the channels of
agenttasks.broker.listen (`:events_channel`, `:stop_channel`, `:task_ended_channel`).

A migration never renders: it runs the text frozen in `agenttasks/migrations/frozen/` when it was
made (`frozen`), so a fresh database gets what an upgraded one got, whatever today's code says.
A test renders each current template and compares it with its frozen text: when a constant
changes, the function gets a new version (`_v2`), frozen by `python manage.py freeze_sql`, and a
migration that installs it. A replaced version's template goes; its frozen text stays.
"""

import json
from collections.abc import Callable
from importlib.resources import files
from typing import Any

FROZEN = files("agenttasks.migrations").joinpath("frozen")


def frozen(name: str) -> str:
    """Return the SQL a migration runs: the text of `name` as it was rendered when frozen."""
    return FROZEN.joinpath(name).read_text(encoding="utf-8")


def templates() -> list[str]:
    """Name the templates of the current versions."""
    return sorted(p.name for p in files(__package__).iterdir() if p.name.endswith(".sql"))


def _literals(values) -> str:
    return ", ".join(f"'{value}'" for value in sorted(values))


def constants() -> dict[str, str]:
    """Return the SQL text of each constant that SQL and Python share, by placeholder."""
    # Imported here: a migration imports this package, and the rest of agenttasks is not its floor.
    from ..broker.listen import EVENTS_CHANNEL, STOP_CHANNEL, TASK_ENDED_CHANNEL
    from ..broker.queue import JOBS_CHANNEL, ORMQ_TABLE, RUNS_CHANNEL
    from ..ids import ALPHABET, ID_LENGTH
    from ..states import LIVE, NOTIFIED, RUN_ENDED, TRANSITIONS, RunTrigger, trigger_name

    renamed = {t: trigger_name(t) for t in RunTrigger if trigger_name(t) != t}
    return {
        ":events_channel": f"'{EVENTS_CHANNEL}'",
        ":allowed": _literals(f"{src}>{dst}" for src, dst in TRANSITIONS if src is not None),
        ":id_alphabet": f"'{ALPHABET}'",
        ":id_length": str(ID_LENGTH),
        ":jobs_channel": f"'{JOBS_CHANNEL}'",
        ":live": _literals(LIVE),
        ":notified": _literals(NOTIFIED),
        ":ormq": ORMQ_TABLE,
        ":run_ended": _literals(RUN_ENDED),
        ":runs_channel": f"'{RUNS_CHANNEL}'",
        ":stop_channel": f"'{STOP_CHANNEL}'",
        ":task_ended_channel": f"'{TASK_ENDED_CHANNEL}'",
        ":trigger_names": f"'{json.dumps(renamed)}'",
    }


def render(name: str) -> str:
    """Return a current template with today's shared constants written in."""
    text = files(__package__).joinpath(name).read_text(encoding="utf-8")
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
