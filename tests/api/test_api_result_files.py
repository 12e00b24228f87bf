"""docs/rest.md#files: a handler's `Reply(files=…)` is checked, stored, listed and served.

The files are File rows of the task's conversation owned by the task's owner: the result lists
them, GET /files serves them to the owner only, and they go with the conversation.
"""

import pytest

from agenttasks import registry
from agenttasks.models import File
from agenttasks.runtime.base import Reply

from .conftest import error

pytestmark = pytest.mark.django_db(transaction=True)


def reporter(ctx):
    return Reply(
        content="see the report",
        files=[
            {"name": "report.txt", "mimeType": "text/plain", "content": "hello report"},
            {
                "name": "dir/data.bin",
                "mimeType": "Application/Octet-Stream",
                "content": b"\x00\x01",
            },
        ],
    )


def broken(ctx):
    return Reply(content="oops", files=[{"name": "x.txt", "content": "no type"}])


def oversized(ctx):
    return Reply(
        content="big", files=[{"name": "big.txt", "mimeType": "text/plain", "content": "x" * 50}]
    )


@pytest.fixture
def reply_agents():
    registry.register("reporter", runtime="callable", handler=reporter, replace=True)
    registry.register("broken-files", runtime="callable", handler=broken, replace=True)
    registry.register(
        "oversized", runtime="callable", handler=oversized, files={"maxSize": 10}, replace=True
    )
    yield
    for agent_id in ("reporter", "broken-files", "oversized"):
        registry.unregister(agent_id)


def test_reply_files_are_listed_served_and_go_with_the_task(
    as_alice, as_bob, alice, workers, reply_agents
):
    task = as_alice.create("reporter", "write it")
    as_alice.wait_status(task["id"], "completed")
    result = as_alice.task(task["id"])["result"]
    first, second = result["files"]
    assert (first["name"], first["mimeType"], first["size"]) == ("report.txt", "text/plain", 12)
    assert (second["name"], second["mimeType"], second["size"]) == (
        "data.bin",
        "application/octet-stream",
        2,
    )
    assert as_alice.get(f"/tasks/{task['id']}/result").json()["result"]["files"] == result["files"]
    meta = as_alice.get(f"/files/{first['id']}").json()["file"]
    assert meta["conversationId"] == task["conversationId"] and "taskId" not in meta
    row = File.objects.get(pk=first["id"])
    assert row.owner_id == alice.pk
    content = as_alice.get(f"/files/{first['id']}/content")
    assert content.status_code == 200 and b"".join(content.streaming_content) == b"hello report"
    error(
        as_bob.get(f"/files/{first['id']}"), 403, "FORBIDDEN", "You do not have access to this file"
    )
    # The task's files are not its input files.
    assert "files" not in as_alice.task(task["id"])["task"]
    assert as_alice.delete(f"/conversations/{task['conversationId']}").status_code == 204
    error(as_alice.get(f"/files/{first['id']}"), 404, "NOT_FOUND")
    assert not File.objects.exists()


@pytest.mark.parametrize(
    "agent, message",
    [
        ("broken-files", "Reply.files[0].mimeType must look like type/subtype"),
        ("oversized", "File big.txt is 50 bytes; the limit is 10 bytes"),
    ],
)
def test_a_bad_reply_file_fails_the_run(as_alice, workers, reply_agents, agent, message):
    task = as_alice.create(agent, "go")
    failed = as_alice.wait_status(task["id"], "failed")
    assert failed["error"] == message
    assert not File.objects.exists()
