"""docs/rest.md, scenarios 54–56: files (in-process workers where a run is needed)."""

import hashlib
from datetime import datetime, timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone

from agenttasks.models import Conversation, File, Task
from agenttasks.store import files

from .conftest import b64, error

pytestmark = pytest.mark.django_db(transaction=True)

TEN = b"0123456789"


def upload(name="notes.txt", content=TEN, mime="text/plain"):
    return {"name": name, "content": b64(content), "mimeType": mime}


def stored_names():
    storage = files.storage()
    try:
        directories, _ = storage.listdir("agenttasks")
    except FileNotFoundError:
        return []
    names = []
    for conversation in directories:
        for file_dir in storage.listdir(f"agenttasks/{conversation}")[0]:
            names.extend(storage.listdir(f"agenttasks/{conversation}/{file_dir}")[1])
    return names


def parse(date: str) -> datetime:
    return datetime.fromisoformat(date.replace("Z", "+00:00"))


def test_rest_12_54_accepted_file(as_alice, as_bob, workers):
    task = as_alice.create("docs", "read it", files=[upload()])
    (ref,) = task["files"]
    assert set(ref) == {"id", "name", "mimeType", "size"}
    assert (ref["name"], ref["mimeType"], ref["size"]) == ("notes.txt", "text/plain", 10)
    messages = as_alice.get(f"/conversations/{task['conversationId']}/messages").json()
    assert messages["messages"][0]["files"] == [ref]
    meta = as_alice.get(f"/files/{ref['id']}").json()["file"]
    assert (meta["conversationId"], meta["taskId"]) == (task["conversationId"], task["id"])
    assert meta["sha256"] == hashlib.sha256(TEN).hexdigest()
    assert parse(meta["expiresAt"]) - parse(meta["createdAt"]) == timedelta(days=7)
    content = as_alice.get(f"/files/{ref['id']}/content")
    assert content.status_code == 200 and b"".join(content.streaming_content) == TEN
    assert content["Content-Type"] == "text/plain" and content["Content-Length"] == "10"
    assert content["Content-Disposition"] == (
        "attachment; filename=\"notes.txt\"; filename*=UTF-8''notes.txt"
    )
    assert content["X-Content-Type-Options"] == "nosniff"
    assert content["Cache-Control"] == "private"
    error(
        as_bob.get(f"/files/{ref['id']}"), 403, "FORBIDDEN", "You do not have access to this file"
    )
    error(as_bob.get(f"/files/{ref['id']}/content"), 403, "FORBIDDEN")
    as_alice.wait_status(task["id"], "completed")


def test_rest_12_54_content_disposition_of_a_unicode_name(as_alice):
    task = as_alice.create("docs", "read it", files=[upload(name='r\u00e9sum\u00e9 "1".txt')])
    content = as_alice.get(f"/files/{task['files'][0]['id']}/content")
    assert content["Content-Disposition"] == (
        "attachment; filename=\"r_sum_ _1_.txt\"; filename*=UTF-8''r%C3%A9sum%C3%A9%20%221%22.txt"
    )


def test_rest_12_55_rejected_files(as_alice, workers):
    cases = [
        ("nofiles", [upload()], 403, "attachments_disabled", "Agent nofiles does not accept files"),
        (
            "docs",
            [upload("a.txt"), upload("b.txt"), upload("c.txt")],
            409,
            "too_many_files",
            "Agent docs accepts at most 2 files per conversation",
        ),
        (
            "docs",
            [upload("a.png", mime="image/png")],
            415,
            "unsupported_media_type",
            "File type image/png is not allowed for agent docs",
        ),
        (
            "docs",
            [upload("big.txt", b"x" * 2000)],
            400,
            "file_too_large",
            "File big.txt is 2000 bytes; the limit is 1024 bytes",
        ),
    ]
    for agent, entries, status, code, message in cases:
        response = as_alice.post("/tasks", {"agentId": agent, "input": "x", "files": entries})
        error(response, status, code, message)
    assert error(
        as_alice.post(
            "/tasks", {"agentId": "docs", "input": "x", "files": [upload("a.txt", b"x" * 2000)] * 3}
        ),
        409,
        "too_many_files",
    )["details"] == {"limit": 2, "existing": 0, "added": 3}
    bad = error(
        as_alice.post(
            "/tasks",
            {
                "agentId": "docs",
                "input": "x",
                "files": [{"name": "a", "content": "%%%", "mimeType": "text/plain"}],
            },
        ),
        400,
        "VALIDATION_ERROR",
        "files[0].content is not valid base64",
    )
    assert "files[0].content" in bad["details"]["fields"]
    assert (Task.objects.count(), Conversation.objects.count(), File.objects.count()) == (0, 0, 0)
    assert stored_names() == []
    # A conversation that already holds two files takes no third one.
    conversation = as_alice.post("/conversations", {"agentId": "docs"}).json()["conversation"]
    path = f"/conversations/{conversation['id']}/messages"
    first = as_alice.post(path, {"message": "two", "files": [upload("a.txt"), upload("b.txt")]})
    assert first.status_code == 202, first.content
    found = error(
        as_alice.post(path, {"message": "three", "files": [upload("c.txt")]}),
        409,
        "too_many_files",
    )
    assert found["details"] == {"limit": 2, "existing": 2, "added": 1}
    assert File.objects.count() == 2 and len(stored_names()) == 2


def test_rest_12_56_file_lifetime(as_alice, workers):
    task = as_alice.create("docs", "read it", files=[upload()])
    file_id = task["files"][0]["id"]
    as_alice.wait_status(task["id"], "completed")
    assert as_alice.delete(f"/conversations/{task['conversationId']}").status_code == 204
    error(as_alice.get(f"/files/{file_id}"), 404, "NOT_FOUND", f"File not found: {file_id}")
    error(as_alice.get(f"/files/{file_id}/content"), 404, "NOT_FOUND")
    assert stored_names() == []
    old = as_alice.create("docs", "older", files=[upload("old.txt")])
    fresh = as_alice.create("docs", "newer", files=[upload("new.txt")])
    past = timezone.now() - timedelta(days=8)
    File.objects.filter(pk=old["files"][0]["id"]).update(
        created_at=past, expires_at=past + timedelta(days=7)
    )
    call_command("agenttasks_prune", "--dry-run")
    assert as_alice.get(f"/files/{old['files'][0]['id']}").status_code == 200
    call_command("agenttasks_prune")
    error(as_alice.get(f"/files/{old['files'][0]['id']}"), 404, "NOT_FOUND")
    error(as_alice.get(f"/files/{old['files'][0]['id']}/content"), 404, "NOT_FOUND")
    assert as_alice.get(f"/files/{fresh['files'][0]['id']}/content").status_code == 200
    assert stored_names() == ["new.txt"]


def test_prune_finished_tasks_conversations(as_alice, workers):
    done = as_alice.create()
    kept = as_alice.create(input="recent")
    as_alice.wait_status(done["id"], "completed")
    as_alice.wait_status(kept["id"], "completed")
    Task.objects.filter(pk=done["id"]).update(finished_at=timezone.now() - timedelta(days=10))
    call_command("agenttasks_prune", "--finished-older-than-days", "5")
    error(as_alice.get(f"/tasks/{done['id']}"), 404, "NOT_FOUND")
    error(as_alice.get(f"/conversations/{done['conversationId']}"), 404, "NOT_FOUND")
    assert as_alice.get(f"/tasks/{kept['id']}").status_code == 200


def test_a_missing_stored_file_is_not_found(as_alice):
    task = as_alice.create("docs", "read it", files=[upload()])
    row = File.objects.get()
    files.storage().delete(row.storage_name)
    error(as_alice.get(f"/files/{row.id}/content"), 404, "NOT_FOUND", f"File not found: {row.id}")
    assert task
