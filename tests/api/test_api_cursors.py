"""docs/rest.md#pagination: signed cursors on GET /tasks, /conversations and /messages.

Every page body has `nextCursor` (null on the last page); a walk by cursor sees each row that
existed when it began exactly once, whatever is created meanwhile; a cursor cannot be forged,
edited or used on another list; a page costs the same statements at any depth.
"""

import threading

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from agenttasks import lifecycle
from agenttasks.models import Conversation, Run, Task

from .conftest import agenttasks, error

pytestmark = pytest.mark.django_db(transaction=True)

UNLIMITED = {"MAX_ACTIVE_TASKS_PER_USER": 0}


def make_tasks(owner, count: int, prefix: str = "t") -> list[str]:
    with agenttasks(**UNLIMITED):
        return [
            lifecycle.create(owner=owner, agent_id="echo", input=f"{prefix}{i}").id
            for i in range(count)
        ]


def walk(api, path: str, key: str, limit: int, between=None) -> tuple[list[str], list[dict]]:
    """Follow nextCursor from the first page; return the ids seen and the page bodies."""
    sep = "&" if "?" in path else "?"
    response = api.get(f"{path}{sep}limit={limit}")
    seen, pages = [], []
    while True:
        assert response.status_code == 200, response.content
        body = response.json()
        pages.append(body)
        seen.extend(item["id"] for item in body[key])
        if body["nextCursor"] is None:
            assert body["hasMore"] is False
            return seen, pages
        assert body["hasMore"] is True and len(body[key]) == limit
        if between is not None:
            between()
        response = api.get(f"{path}{sep}limit={limit}&cursor={body['nextCursor']}")


def test_walking_tasks_by_cursor(as_alice, alice):
    created = make_tasks(alice, 25)
    seen, pages = walk(as_alice, "/tasks", "tasks", 10)
    assert seen == created[::-1]  # newest first, each once
    assert [len(p["tasks"]) for p in pages] == [10, 10, 5]
    assert [(p["total"], p["offset"], p["limit"]) for p in pages] == [
        (25, 0, 10),
        (25, 10, 10),
        (25, 20, 10),
    ]
    # An offset page's cursor continues where the offset page ended.
    by_offset = as_alice.get("/tasks?limit=10&offset=10").json()
    assert by_offset["nextCursor"] and by_offset["hasMore"]
    after = as_alice.get(f"/tasks?limit=10&cursor={by_offset['nextCursor']}").json()
    assert [t["id"] for t in after["tasks"]] == created[::-1][20:]
    assert as_alice.get("/tasks?offset=20").json()["nextCursor"] is None


def test_a_cursor_keeps_the_filters_it_is_used_with(as_alice, alice):
    make_tasks(alice, 4, "a")
    created = make_tasks(alice, 6, "b")
    Task.objects.filter(id__in=created[:3]).update(status="running")
    seen, _ = walk(as_alice, "/tasks?status=running", "tasks", 2)
    assert seen == created[:3][::-1]


def test_equal_creation_times_are_ordered_by_id(as_alice, alice):
    created = make_tasks(alice, 9)
    Task.objects.filter(id__in=created).update(created_at=timezone.now())
    seen, _ = walk(as_alice, "/tasks", "tasks", 4)
    assert seen == sorted(created, reverse=True)


def test_tasks_created_during_a_walk_do_not_disturb_it(as_alice, alice):
    existing = make_tasks(alice, 12)
    made = []
    seen, _ = walk(
        as_alice, "/tasks", "tasks", 5, between=lambda: made.extend(make_tasks(alice, 3, "new"))
    )
    assert seen == existing[::-1]  # each one once, none of the new ones (they are ahead)
    assert len(made) == 6


def test_cursor_and_offset_together_and_bad_cursors(as_alice, alice):
    make_tasks(alice, 3)
    cursor = as_alice.get("/tasks?limit=1").json()["nextCursor"]
    error(
        as_alice.get(f"/tasks?cursor={cursor}&offset=0"),
        400,
        "VALIDATION_ERROR",
        "cursor and offset cannot be used together",
    )
    edited = cursor[:-1] + ("A" if cursor[-1] != "A" else "B")
    for bad in ("nope", "", edited, cursor + "x"):
        found = error(
            as_alice.get(f"/tasks?cursor={bad}"), 400, "VALIDATION_ERROR", "Invalid cursor"
        )
        assert found["details"] == {"fields": {"cursor": ["Invalid cursor"]}}
    # A cursor belongs to its list (and, for messages, to its order).
    error(
        as_alice.get(f"/conversations?cursor={cursor}"), 400, "VALIDATION_ERROR", "Invalid cursor"
    )
    task = Task.objects.filter(owner=alice).first()
    path = f"/conversations/{task.conversation_id}/messages"
    error(as_alice.get(f"{path}?cursor={cursor}"), 400, "VALIDATION_ERROR", "Invalid cursor")


def test_walking_conversations_and_messages(as_alice, alice):
    for i in range(7):
        lifecycle.create_conversation(owner=alice, agent_id="echo", title=f"c{i}")
    expected = list(
        Conversation.objects.filter(owner=alice, hidden=False)
        .order_by("-updated_at", "-id")
        .values_list("id", flat=True)
    )
    seen, pages = walk(as_alice, "/conversations", "conversations", 3)
    assert seen == expected and len(pages) == 3
    conversation = expected[0]
    for i in range(5):
        lifecycle.post_message(conversation, f"m{i}")
        # Stand-in for the run ending (no worker here), so the next message is accepted.
        Run.objects.filter(conversation_id=conversation).update(status="completed")
    path = f"/conversations/{conversation}/messages"
    seen_asc, _ = walk(as_alice, path, "messages", 2)
    seen_desc, _ = walk(as_alice, path + "?order=desc", "messages", 2)
    assert len(seen_asc) == 5 and seen_desc == seen_asc[::-1]
    asc_cursor = as_alice.get(f"{path}?limit=2").json()["nextCursor"]
    error(
        as_alice.get(f"{path}?order=desc&cursor={asc_cursor}"),
        400,
        "VALIDATION_ERROR",
        "Invalid cursor",
    )


def test_a_messages_cursor_fits_its_own_conversation_only(as_alice, alice, as_bob, bob):
    """A cursor of conversation A pages neither A's sibling B nor another user's conversation."""
    conversations = {}
    for owner, name in ((alice, "a"), (alice, "b"), (bob, "c")):
        conversation = lifecycle.create_conversation(owner=owner, agent_id="echo").id
        for i in range(3):
            lifecycle.post_message(conversation, f"{name}{i}")
            Run.objects.filter(conversation_id=conversation).update(status="completed")
        conversations[name] = conversation
    cursor = as_alice.get(f"/conversations/{conversations['a']}/messages?limit=1").json()[
        "nextCursor"
    ]
    page = as_alice.get(f"/conversations/{conversations['a']}/messages?cursor={cursor}")
    assert page.status_code == 200 and len(page.json()["messages"]) == 2
    for client, name in ((as_alice, "b"), (as_bob, "c")):
        error(
            client.get(f"/conversations/{conversations[name]}/messages?cursor={cursor}"),
            400,
            "VALIDATION_ERROR",
            "Invalid cursor",
        )


def test_a_cursor_page_costs_the_same_at_any_depth(as_alice, alice):
    make_tasks(alice, 30)
    _, pages = walk(as_alice, "/tasks", "tasks", 5)

    def queries(url):
        with CaptureQueriesContext(connection) as captured:
            assert as_alice.get(url).status_code == 200
        return len(captured)

    counts = {queries(f"/tasks?limit=5&cursor={p['nextCursor']}") for p in pages[:-1]}
    counts.add(queries("/tasks?limit=5"))
    assert counts == {4}, counts  # token, count, page (task + run), files of the page


@pytest.mark.postgres
def test_a_walk_while_tasks_are_created_concurrently_sees_each_existing_task_once(as_alice, alice):
    existing = set(make_tasks(alice, 40))
    stop = threading.Event()
    made: list[str] = []

    def create_meanwhile():
        try:
            while not stop.is_set():
                made.extend(make_tasks(alice, 1, "live"))
        finally:
            connection.close()

    creator = threading.Thread(target=create_meanwhile)
    creator.start()
    try:
        seen, pages = walk(as_alice, "/tasks", "tasks", 3)
    finally:
        stop.set()
        creator.join(10)
    assert made, "nothing was created during the walk"
    assert len(seen) == len(set(seen)), "a task was seen twice"
    assert existing <= set(seen)
    assert len(pages) >= 14


def test_the_document_declares_cursor_and_next_cursor(anonymous):
    document = anonymous.get("/docs/openapi.json").json()
    for path in ("/tasks", "/conversations", "/conversations/{conversationId}/messages"):
        names = {p["name"] for p in document["paths"][path]["get"]["parameters"]}
        assert {"cursor", "offset", "limit"} <= names, path
        schema = document["paths"][path]["get"]["responses"]["200"]["content"]["application/json"][
            "schema"
        ]["$ref"].rsplit("/", 1)[1]
        field = document["components"]["schemas"][schema]["properties"]["nextCursor"]
        assert field["type"] == "string" and field.get("nullable") is True, field
