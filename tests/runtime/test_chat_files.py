"""docs/delegation.md#files: a message's files reach the chat model as content parts.

The fake model server records the request; the test compares its exact JSON body.
"""

import base64
import json

import pytest

from agenttasks import lifecycle
from agenttasks.models import File
from agenttasks.runtime.content import FILE_TEXT_CHARS
from agenttasks.store import files

from ..fake_model import answer, refresh, run_to_idle

pytest_plugins = ["tests.fake_model"]
pytestmark = pytest.mark.django_db(transaction=True)

PNG = b"\x89PNG\r\n\x1a\nfake image bytes"


def create_with_files(user, agent: str, text: str, uploads: list[files.Upload]):
    """lifecycle.create with files, as POST /tasks does."""
    return lifecycle.create(owner=user, agent_id=agent, input=text, uploads=uploads)


def upload(index: int, name: str, mime_type: str, content: bytes) -> files.Upload:
    return files.Upload(index=index, name=name, mime_type=mime_type, content=content)


def test_files_reach_the_model_as_content_parts(model, agents, user, recording_queue):
    agents("reader", model="m-reader", does="reads files")
    server = model.script(lambda r: answer("read"))
    uploads = [
        upload(0, "chart.png", "image/png", PNG),
        upload(1, "notes.txt", "text/plain", b"hello\nworld"),
        upload(2, "data.json", "application/json", b'{"a": 1}'),
        upload(3, "report.pdf", "application/pdf", b"%PDF-1.4 ..."),
    ]
    task = create_with_files(user, "reader", "summarize these", uploads)
    run_to_idle(recording_queue)
    assert refresh(task).result == "read"
    (request,) = server.of("m-reader")
    png_url = "data:image/png;base64," + base64.b64encode(PNG).decode()
    user_message = {
        "role": "user",
        "content": [
            {"type": "text", "text": "summarize these"},
            {"type": "image_url", "image_url": {"url": png_url}},
            {"type": "text", "text": "File: notes.txt\nhello\nworld"},
            {"type": "text", "text": 'File: data.json\n{"a": 1}'},
            {"type": "text", "text": "[Attached file: report.pdf (application/pdf, 12 bytes)]"},
        ],
    }
    assert request.json == {
        "model": "m-reader",
        "messages": [user_message],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    assert json.loads(request.raw)["messages"][-1] == user_message


def test_a_long_text_file_is_cut(model, agents, user, recording_queue):
    agents("reader", model="m-reader")
    server = model.script(lambda r: answer("read"))
    text = "x" * (FILE_TEXT_CHARS + 50)
    create_with_files(user, "reader", "look", [upload(0, "big.txt", "text/plain", text.encode())])
    run_to_idle(recording_queue)
    (request,) = server.of("m-reader")
    parts = request.messages[-1]["content"]
    assert parts[1] == {
        "type": "text",
        "text": f"File: big.txt\n{'x' * FILE_TEXT_CHARS}\n[… cut at {FILE_TEXT_CHARS} characters]",
    }


def test_a_message_without_files_keeps_its_string_content(model, agents, user, recording_queue):
    agents("reader", model="m-reader")
    server = model.script(lambda r: answer("read"))
    lifecycle.create(owner=user, agent_id="reader", input="plain")
    run_to_idle(recording_queue)
    (request,) = server.of("m-reader")
    assert request.messages[-1] == {"role": "user", "content": "plain"}


def test_a_pruned_file_is_a_note(model, agents, user, recording_queue):
    agents("reader", model="m-reader")
    server = model.script(lambda r: answer("read"))
    uploads = [upload(0, "gone.txt", "text/plain", b"bye")]
    task = create_with_files(user, "reader", "look", uploads)
    File.objects.filter(task_id=task.id).delete()
    run_to_idle(recording_queue)
    (request,) = server.of("m-reader")
    assert request.messages[-1]["content"][1] == {
        "type": "text",
        "text": "[Attached file: gone.txt (text/plain, 3 bytes); no longer available]",
    }
