"""The conversation endpoints (docs/rest.md#conversations): list, create, read, update, delete,
and their messages."""

from django.db.models import Prefetch
from drf_spectacular.utils import OpenApiResponse
from rest_framework.response import Response

from ... import lifecycle
from ...exceptions import RunNotFound
from ...models import Conversation, Event, Run
from ...states import MultitaskStrategy
from ...toolkit import errors
from ...toolkit.cursors import Keyset, keyset_page
from ...toolkit.cursors import page_body as cursor_page_body
from ...toolkit.cursors import params as cursor_params
from ...toolkit.identity import owner_id
from .. import serializers as s
from ..idempotency import idempotent
from .base import (
    LOCATION,
    PAGE_PARAMETERS,
    ApiView,
    exposed_agent,
    extend_schema,
    keyed,
    plain_id,
    query_param,
    refusals,
)

MESSAGE_TYPES = list(s.MESSAGE_TYPES)
CONVERSATION_ORDER = Keyset("conversations", ("updated_at", "id"), descending=True)
MESSAGE_ORDER = {
    "asc": Keyset("messages.asc", ("seq",), descending=False),
    "desc": Keyset("messages.desc", ("seq",), descending=True),
}


def conversation_rows():
    return Conversation.objects.prefetch_related(
        Prefetch(
            "runs",
            queryset=Run.objects.active().order_by("-created_at", "-id"),
            to_attr="active_runs",
        )
    )


class ConversationListView(ApiView):
    @extend_schema(
        operation_id="listConversations",
        tags=["Conversations"],
        summary="List the principal's visible conversations",
        parameters=[query_param("agentId", "Exact agent id."), *PAGE_PARAMETERS],
        responses={200: s.ConversationPageSerializer, **refusals(400)},
    )
    def get(self, request):
        limit, offset, position = cursor_params(request, CONVERSATION_ORDER, 20, 100)
        rows = conversation_rows().visible().filter(owner_id=owner_id(request), hidden=False)
        agent_id = request.query_params.get("agentId")
        if agent_id is not None and not plain_id(agent_id):
            items, total, after = [], 0, None
        else:
            if agent_id is not None:
                rows = rows.filter(agent=agent_id)
            items, total, offset, after = keyset_page(
                rows, CONVERSATION_ORDER, limit, offset, position
            )
        body = [s.ConversationSerializer.present(c) for c in items]
        return Response(cursor_page_body("conversations", body, total, limit, offset, after))

    @extend_schema(
        operation_id="createConversation",
        tags=["Conversations"],
        summary="Create a conversation",
        request=s.ConversationCreateSerializer,
        parameters=[LOCATION, *keyed(201)],
        responses={201: s.ConversationEnvelopeSerializer, **refusals(400, 404, 409, 415, 422)},
    )
    @idempotent
    def post(self, request):
        data = s.ConversationCreateSerializer.validated(self.body)
        agent = exposed_agent(data["agent_id"])
        conversation = lifecycle.create_conversation(
            owner=self.principal(),
            agent_id=agent.id,
            title=data["title"],
            metadata=data["metadata"],
        )
        conversation = conversation_rows().get(pk=conversation.pk)
        return Response(
            {"conversation": s.ConversationSerializer.present(conversation)},
            status=201,
            headers={"Location": self.location(conversation.id)},
        )


class ConversationView(ApiView):
    @extend_schema(
        operation_id="getConversation",
        tags=["Conversations"],
        summary="Read a conversation",
        responses={200: s.ConversationEnvelopeSerializer, **refusals(403, 404)},
    )
    def get(self, request, conversationId):
        conversation = self.conversation(conversationId)
        return Response({"conversation": s.ConversationSerializer.present(conversation)})

    @extend_schema(
        operation_id="updateConversation",
        tags=["Conversations"],
        summary="Change a conversation's title or metadata",
        request=s.ConversationUpdateSerializer,
        responses={200: s.ConversationEnvelopeSerializer, **refusals(400, 403, 404, 415)},
    )
    def patch(self, request, conversationId):
        conversation = self.conversation(conversationId)
        changes = s.ConversationUpdateSerializer.validated(self.body)
        if changes:
            conversation = lifecycle.update_conversation(conversation.id, **changes)
        return Response({"conversation": s.ConversationSerializer.present(conversation)})

    @extend_schema(
        operation_id="deleteConversation",
        tags=["Conversations"],
        summary="Stop and delete a conversation with its whole tree",
        request=None,
        responses={204: OpenApiResponse(description="Deleted"), **refusals(400, 403, 404, 415)},
    )
    def delete(self, request, conversationId):
        # A delete that died halfway left the tree marked: deleting it again finishes it.
        conversation = self.conversation(conversationId, deleting=True)
        lifecycle.delete_conversation(conversation.id)
        return Response(status=204)


class MessagesView(ApiView):
    @extend_schema(
        operation_id="listMessages",
        tags=["Conversations"],
        summary="List a conversation's messages",
        parameters=[*PAGE_PARAMETERS, query_param("order", "asc (default) or desc.")],
        responses={200: s.MessagePageSerializer, **refusals(400, 403, 404)},
    )
    def get(self, request, conversationId):
        conversation = self.conversation(conversationId)
        order = request.query_params.get("order", "asc")
        if order not in ("asc", "desc"):
            raise errors.validation("order must be asc or desc", "order")
        keyset = MESSAGE_ORDER[order].of(conversation.id)
        limit, offset, position = cursor_params(request, keyset, 100, 500)
        rows = Event.objects.filter(conversation_id=conversation.id, type__in=MESSAGE_TYPES)
        # A turn that only called tools is logged with null content for the transcript; it is
        # not a message anyone wrote (docs/rest.md#messages).
        rows = rows.exclude(type="message.assistant", data__content=None)
        items, total, offset, after = keyset_page(rows, keyset, limit, offset, position)
        body = [s.MessageSerializer.present(e) for e in items]
        return Response(cursor_page_body("messages", body, total, limit, offset, after))

    @extend_schema(
        operation_id="postMessage",
        tags=["Conversations"],
        summary="Send a user message; it starts a run of the conversation's agent",
        request=s.MessageCreateSerializer,
        parameters=[*keyed(202)],
        responses={202: s.MessageAcceptedSerializer, **refusals(400, 403, 404, 409, 415, 422)},
    )
    @idempotent
    def post(self, request, conversationId):
        conversation = self.conversation(conversationId)
        data = s.MessageCreateSerializer.validated(self.body)
        exposed_agent(conversation.agent)
        run, event = lifecycle.post_message(
            conversation.id,
            data["message"],
            author=self.principal(),
            metadata=data["metadata"],
            uploads=data["uploads"],
            strategy=data["strategy"] or MultitaskStrategy.REJECT,
        )
        body = {"run": s.RunSerializer.present(run)}
        if event is not None:
            body["message"] = s.MessageSerializer.present(event)
        return Response(body, status=202)


class WaitingRunCancelView(ApiView):
    @extend_schema(
        operation_id="cancelWaitingRun",
        tags=["Conversations"],
        summary="Cancel a message's run that waits its turn (multitaskStrategy enqueue)",
        request=None,
        responses={200: s.RunEnvelopeSerializer, **refusals(403, 404, 409, 415)},
    )
    def post(self, request, conversationId, runId):
        conversation = self.conversation(conversationId)
        if not Run.objects.filter(pk=runId, conversation_id=conversation.id).exists():
            raise errors.refusal(RunNotFound(runId))
        run = lifecycle.cancel_waiting(runId)
        return Response({"run": s.RunSerializer.present(run)})
