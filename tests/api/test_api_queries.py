"""Query counts of the list and detail endpoints: pinned, and the same whatever the page size.

Each count includes the token lookup of DRF's TokenAuthentication (one query).
"""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from agenttasks import lifecycle, store
from agenttasks.models import Task
from agenttasks.types import RunOutcome

from .conftest import b64

pytestmark = pytest.mark.django_db(transaction=True)

# endpoint -> queries (token, then the endpoint's own)
PINNED = {
    "/tasks": 4,  # token, count, page (task + current run), files of the page
    "/tasks?status=completed&agentId=docs": 4,
    "/conversations": 4,  # token, count, page, active runs of the page
    "/conversations/{conversation}/messages": 4,  # token, conversation, count, page
    "/conversations/{conversation}/events": 3,  # token, conversation, page
    # token, conversation, actions, then the escalated ones: delegate children, their actions
    "/conversations/{conversation}/actions?status=all": 5,
    "/tasks/{task}/comments": 3,  # token, task, comments
    "/tasks/{task}/runs": 3,  # token, task, runs
    "/tasks/{task}": 3,  # token, task (+ run, result), files
    "/tasks/{task}/status": 2,  # token, task (+ run)
    "/tasks/{task}/result": 2,  # token, task (+ result)
    "/conversations/{conversation}": 3,  # token, conversation, active run
    "/files/{file}": 2,  # token, file
    "/agents": 1,
}


def build(as_alice, alice, count: int) -> dict:
    """`count` completed docs tasks with a file each, comments, and one conversation's history."""
    first = None
    for i in range(count):
        created = as_alice.create(
            "docs",
            f"t{i}",
            files=[{"name": f"{i}.txt", "content": b64(b"abc"), "mimeType": "text/plain"}],
        )
        task = Task.objects.read(created["id"])
        store.claim(task.run_id, "test")
        lifecycle.on_run_finished(
            task.conversation_id, RunOutcome(task.run_id, "completed", text=f"done {i}")
        )
        first = first or task
    for i in range(count):
        lifecycle.comment(first.id, f"comment {i}", author=alice)
        task = Task.objects.read(first.id)
        store.claim(task.run_id, "test")
        lifecycle.on_run_finished(
            task.conversation_id, RunOutcome(task.run_id, "completed", text=f"again {i}")
        )
    for i in range(count):
        lifecycle.create_conversation(owner=alice, agent_id="echo", title=f"c{i}")
    first = Task.objects.get(pk=first.id)
    return {
        "task": first.id,
        "conversation": first.conversation_id,
        "file": first.files.get().id,
    }


def count_queries(api, path) -> int:
    with CaptureQueriesContext(connection) as queries:
        response = api.get(path)
    assert response.status_code == 200, response.content
    return len(queries)


@pytest.mark.parametrize("size", [2, 12])
def test_query_counts_are_pinned_and_constant(as_alice, alice, size):
    world = build(as_alice, alice, size)
    counts = {path: count_queries(as_alice, path.format(**world)) for path in PINNED}
    assert counts == PINNED
