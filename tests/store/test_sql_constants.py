"""What the SQL functions share with Python comes from Python, and what a migration runs is frozen.

`agenttasks.sql.render` writes today's constants into a template; a migration runs the text frozen
when it was made (agenttasks/migrations/frozen/), so today's rendering must equal it for every
current version. When it does not, a constant changed: the function needs a new version."""

import re

import pytest

from agenttasks import sql, store
from agenttasks.ids import ALPHABET, ID_LENGTH
from agenttasks.models import Event, Run, Wakeup
from agenttasks.types import Ending, NewTask, RunOutcome

from ..factories import ConversationFactory

# A placeholder is a colon and a name, not part of a cast (`::jsonb`) or an assignment (`:=`).
PLACEHOLDER = re.compile(r"(?<![:\w]):[a-z_]+\b")


def frozen_files() -> list[str]:
    """Name every frozen version, current or replaced."""
    return sorted(p.name for p in sql.FROZEN.iterdir() if p.name.endswith(".sql"))


@pytest.mark.parametrize("name", frozen_files())
def test_every_placeholder_of_a_frozen_file_is_written_in(name):
    text = re.sub(r"--[^\n]*", "", sql.frozen(name))  # comments may name placeholders
    assert PLACEHOLDER.findall(text) == []


@pytest.mark.parametrize("name", sql.templates())
def test_rendering_a_current_version_today_equals_its_frozen_text(name):
    assert name in frozen_files(), f"freeze it: python manage.py freeze_sql {name}"
    assert sql.render(name) == sql.frozen(name), (
        f"a constant that {name} writes in changed since it was frozen: add the next version "
        "of the function, freeze it and install it in a new migration"
    )


def test_a_changed_constant_is_caught(monkeypatch):
    """The comparison above can fail: a status added to LIVE changes what end_v2 renders."""
    changed = {**sql.constants(), ":live": "'paused'"}
    monkeypatch.setattr(sql, "constants", lambda: changed)
    assert sql.render("end_v2.sql") != sql.frozen("end_v2.sql")


def test_the_trigger_names_are_states_trigger_name():
    assert sql.constants()[":trigger_names"] == """'{"initial": "create"}'"""


@pytest.mark.postgres
@pytest.mark.django_db
def test_ids_the_functions_make_have_the_form_of_agenttasks_ids(user):
    parent = ConversationFactory(owner=user, agent="default")
    task = store.create_task(
        NewTask(owner=user, agent="worker", input="x", parent_conversation_id=parent.pk)
    )
    store.claim(task.run_id, "w1")  # run.started: an event whose id the function makes
    outcome = RunOutcome(task.run_id, "completed", text="done")
    store.end(task.id, task.run_id, Ending("completed", result="done"), outcome=outcome)

    made = [
        *Event.objects.filter(conversation_id=task.conversation_id, type="run.started"),
        *Wakeup.objects.filter(task_id=task.id),
    ]
    assert len(made) == 2
    form = re.compile(rf"(evt|wake)_[{re.escape(ALPHABET)}]{{{ID_LENGTH}}}")
    assert all(form.fullmatch(row.pk) for row in made), [row.pk for row in made]
    started = Event.objects.get(conversation_id=task.conversation_id, type="run.started")
    assert Run.objects.get(pk=task.run_id).trigger == "initial"
    assert started.data["trigger"] == "create"
