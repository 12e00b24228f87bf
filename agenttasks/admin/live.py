"""The admin follows a task live: its conversation's event stream, with the operator's session.

The REST stream answers only a conversation's owner; this view serves the same frames
(`api/streams.py`) to staff who may view the task, so its page can refresh the parts that changed
(`static/agenttasks/live.js`) without a reload. It holds no per-user place: the admin is for a
handful of operators, and each stream still closes after STREAM_MAX_SECONDS (the script reopens it).
"""

from django.http import Http404, HttpRequest

from ..api.streams import EventStream
from ..models import Task
from ..toolkit import caps, streams


def stream(request: HttpRequest, task: Task) -> streams.StreamResponse:
    """Return the event stream of `task`'s conversation, from now on (snapshot, then new events)."""
    if task is None:
        raise Http404
    events = EventStream(
        task.conversation_id, task.pk, None, False, client_fd=caps.client_socket(request)
    )
    return streams.serve(events, request)
