"""What the SQL functions share with Python comes from Python (`agenttasks.sql.render`)."""

import re
from importlib.resources import files

import pytest

from agenttasks import sql, store
from agenttasks.ids import ALPHABET, ID_LENGTH
from agenttasks.models import Event, Run, Wakeup
from agenttasks.types import Ending, NewTask, RunOutcome

from ..factories import ConversationFactory

# A placeholder is a colon and a name, not part of a cast (`::jsonb`) or an assignment (`:=`).
PLACEHOLDER = re.compile(r"(?<![:\w]):[a-z_]+\b")


def sql_files() -> list[str]:
    """Name every version, current (agenttasks/sql/) or replaced (agenttasks/migrations/sql/)."""
    folders = (files("agenttasks.sql"), sql.HISTORY)
    return sorted(p.name for folder in folders for p in folder.iterdir() if p.name.endswith(".sql"))


@pytest.mark.parametrize("name", sql_files())
def test_every_placeholder_of_a_file_is_written_in(name):
    rendered = re.sub(r"--[^\n]*", "", sql.render(name))  # comments may name placeholders
    assert PLACEHOLDER.findall(rendered) == []


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
