"""docs/lifecycle.md#progress: the default progress line, without a DESCRIBE_STATE hook."""

import pytest

from agenttasks import lifecycle, store
from agenttasks.lifecycle.progress import default_line
from agenttasks.models import Event

from ..conftest import wait_for
from ..harness import row

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize(
    "state, line",
    [
        ({"step": 1, "of": 2, "name": "read"}, "step 1/2 (read)"),
        ({"step": 2, "of": 3}, "step 2/3"),
        ({"name": "read", "pages": 12}, "name: read, pages: 12"),
        ({"done": True, "left": [1, 2]}, "done: true, left: [1,2]"),
        ("halfway", "halfway"),
        (42, "42"),
        ({}, ""),
        (None, ""),
    ],
)
def test_the_default_line(state, line):
    assert default_line(state) == line


def test_the_default_line_is_cut_at_the_summary_limit(settings):
    settings.AGENTTASKS = {"SUMMARY_LIMIT": 20}
    assert default_line({"text": "x" * 100}) == "text: " + "x" * 14


def test_a_handler_progress_shows_without_a_hook(user, settings):
    """The README's own example: ctx.progress({"step": 1, "of": 2, "name": "read"})."""
    settings.AGENTTASKS = {"DESCRIBE_STATE": {}, "MAX_ACTIVE_TASKS_PER_USER": 0}
    task = lifecycle.create(owner=user, agent_id="worker", input="go")
    store.claim(task.run_id, "w1")
    lifecycle.record_progress(task.run_id, {"step": 1, "of": 2, "name": "read"})
    assert lifecycle.progress_line(row(task.id)) == "step 1/2 (read)"
    event = wait_for(lambda: row(task.id).conversation.events.filter(type="task.progress").first())
    assert event.data["progress"] == "step 1/2 (read)"
    assert lifecycle.status(task.id).progress == "step 1/2 (read)"


def test_a_hook_still_wins(user, settings):
    settings.AGENTTASKS = {"DESCRIBE_STATE": {"": "tests.lifecycle.test_progress.shout"}}
    task = lifecycle.create(owner=user, agent_id="worker", input="go")
    store.claim(task.run_id, "w1")
    lifecycle.record_progress(task.run_id, {"step": 1, "of": 2})
    assert lifecycle.progress_line(row(task.id)) == "STEP ONE"


def shout(state) -> str:
    return "STEP ONE"


def test_progress_after_an_immediate_cancel_is_dropped(user, recording_queue):
    """A `slow` task cancelled at step 2 went on to log step 3 after its cancelled event, and
    the admin then showed the cancelled task at step 3/5."""
    task = lifecycle.create(owner=user, agent_id="slow", input="go")
    store.claim(task.run_id, "w1")
    assert store.record_progress(task.run_id, {"step": 2, "of": 5}, "step 2/5")
    lifecycle.cancel(task.id)  # at once: the task ends while its run winds down
    cancelled = row(task.id)
    assert cancelled.status == "cancelled" and cancelled.run.status == "running"
    assert not store.record_progress(task.run_id, {"step": 3, "of": 5}, "step 3/5")
    assert row(task.id).run.progress == {"step": 2, "of": 5}
    events = Event.objects.filter(conversation_id=task.conversation_id).order_by("seq")
    assert [e.data["progress"] for e in events if e.type == "task.progress"] == ["step 2/5"]
