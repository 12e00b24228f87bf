"""Approvals and questions (docs/rest.md#approvals-and-questions): list them and answer one."""

from rest_framework.response import Response

from ... import lifecycle
from ...exceptions import ActionNotFound, RunNotFound, TaskNotFound
from ...lifecycle import escalation
from ...models import PendingAction
from ...states import ActionStatus
from ...toolkit import errors
from .. import serializers as s
from ..idempotency import idempotent
from .base import ApiView, extend_schema, keyed, plain_id, query_param, refusals

ACTION_FILTERS = {*ActionStatus.values, "all"}


class ActionsView(ApiView):
    @extend_schema(
        operation_id="listActions",
        tags=["Actions"],
        summary="List a conversation's approvals and questions",
        parameters=[query_param("status", "pending (default), approved, …, or all.")],
        responses={200: s.ActionListSerializer, **refusals(400, 403, 404)},
    )
    def get(self, request, conversationId):
        conversation = self.conversation(conversationId)
        wanted = request.query_params.get("status", "pending")
        if wanted not in ACTION_FILTERS:
            raise errors.validation(f"Unknown status: {wanted}", "status")
        rows = PendingAction.objects.filter(conversation_id=conversation.id)
        if wanted != "all":
            rows = rows.filter(status=wanted)
        items = [s.PendingActionSerializer.present(a) for a in rows.order_by("created_at", "id")]
        if wanted in ("pending", "all"):
            # Actions escalated from delegate descendants are answerable here too.
            escalated = [a for a in s.pending_actions(conversation.id) if "path" in a]
            items = sorted(items + escalated, key=lambda a: (a["createdAt"], a["id"]))
        return Response({"actions": items, "total": len(items)})


class ActionView(ApiView):
    @extend_schema(
        operation_id="resolveAction",
        tags=["Actions"],
        summary="Answer an approval or a question",
        request=s.ActionAnswerSerializer,
        parameters=[*keyed(200)],
        responses={200: s.ActionResolvedSerializer, **refusals(400, 403, 404, 409, 415, 422)},
    )
    @idempotent
    def post(self, request, conversationId, actionId):
        conversation = self.conversation(conversationId)
        action = PendingAction.objects.filter(pk=actionId).first() if plain_id(actionId) else None
        if action is not None and not escalation.answerable_through(action, conversation.id):
            action = None
        if action is None:
            raise errors.refusal(ActionNotFound(actionId))
        answer = s.ActionAnswerSerializer.validated(self.body, action=action)
        resolution = {**answer, "decided_by": self.principal()}
        try:
            task = lifecycle.resolve_as_person(action.id, resolution)
        except (ActionNotFound, TaskNotFound, RunNotFound):
            raise errors.refusal(ActionNotFound(actionId)) from None
        action.refresh_from_db()
        out = {"action": s.PendingActionSerializer.present(action)}
        if task is not None:
            # The task as this answer left it (a worker may already be running it again).
            out["task"] = s.TaskSerializer.present(task)
        return Response(out)
