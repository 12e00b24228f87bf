"""A conversation's event log (docs/rest.md#events): read after a seq, or follow it live."""

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse
from rest_framework.response import Response

from ...conf import app_settings
from ...models import Event, Task
from ...toolkit import caps, errors, streams
from ...toolkit.pagination import SQL_MAX, non_negative, page_params
from .. import serializers as s
from ..streams import EventStream
from .base import ApiView, extend_schema, query_param, refusals


class EventsView(ApiView):
    @extend_schema(
        operation_id="listEvents",
        tags=["Events"],
        summary="Read a conversation's event log after a seq",
        parameters=[
            query_param("after", "Return events with seq > after (default 0).", OpenApiTypes.INT),
            query_param("limit", "Page size (default 100, max 500).", OpenApiTypes.INT),
        ],
        responses={200: s.EventPageSerializer, **refusals(400, 403, 404)},
    )
    def get(self, request, conversationId):
        conversation = self.conversation(conversationId)
        after = non_negative(
            request.query_params.get("after"), "after", "after must be a non-negative integer"
        )
        limit, _ = page_params(request, 100, 500)
        rows = list(
            Event.objects.filter(conversation_id=conversation.id, seq__gt=after).order_by("seq")[
                : limit + 1
            ]
        )
        events = rows[:limit]
        last_seq = max(conversation.last_seq, rows[-1].seq if rows else 0)
        return Response(
            {
                "events": [s.EventSerializer.present(e) for e in events],
                "after": after,
                "limit": limit,
                "lastSeq": last_seq,
                "hasMore": len(rows) > limit,
            }
        )


class EventStreamView(ApiView):
    http_method_names = ["get"]

    @extend_schema(
        operation_id="streamEvents",
        tags=["Events"],
        summary="Follow a conversation live (Server-Sent Events)",
        parameters=[
            query_param("after", "Resume point when no Last-Event-ID is sent.", OpenApiTypes.INT),
            query_param("until", "terminal: close after the task's terminal status."),
            OpenApiParameter(
                "Last-Event-ID",
                OpenApiTypes.STR,
                OpenApiParameter.HEADER,
                description="Resume point (a seq); takes precedence over after.",
            ),
        ],
        responses={
            (200, "text/event-stream"): OpenApiResponse(
                OpenApiTypes.STR,
                description="snapshot, then id/event/data frames; transient message.delta "
                "frames (no id) while a reply is written",
            ),
            **refusals(400, 403, 404),
        },
    )
    def get(self, request, conversationId):
        conversation = self.conversation(conversationId)
        after = request.query_params.get("after")
        resume = None
        if after is not None:
            resume = non_negative(after, "after", "after must be a non-negative integer")
        until = request.query_params.get("until")
        own_task = None
        if until is not None:
            if until != "terminal":
                raise errors.validation("until must be terminal", "until")
            own_task = Task.objects.filter(conversation_id=conversation.id).first()
            if own_task is None:
                raise errors.validation("until=terminal needs a task's conversation", "until")
        header = (request.META.get("HTTP_LAST_EVENT_ID") or "").strip()
        if header.isascii() and header.isdigit():
            resume = min(int(header), SQL_MAX) if len(header) <= 18 else SQL_MAX
        if own_task is None:
            own_task = Task.objects.filter(conversation_id=conversation.id).only("id").first()
        held = caps.take(
            request,
            caps.STREAM,
            app_settings.MAX_STREAMS_PER_USER,
            app_settings.SLOT_LEASE_SECONDS,
        )
        stream = EventStream(
            conversation.id,
            own_task.id if own_task else None,
            resume,
            until is not None,
            held=held,
            client_fd=caps.client_socket(request._request),  # None under ASGI
        )
        return streams.serve(stream, request._request)
