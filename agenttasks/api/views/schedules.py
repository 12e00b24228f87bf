"""The schedule endpoints (docs/rest.md#schedules): list, create, read, update, delete, pause,
resume and run now."""

from drf_spectacular.utils import OpenApiResponse
from rest_framework.response import Response

from ...exceptions import ScheduleNotFound
from ...lifecycle import schedules
from ...models import Schedule
from ...toolkit import errors
from ...toolkit.cursors import Keyset, keyset_page
from ...toolkit.cursors import page_body as cursor_page_body
from ...toolkit.cursors import params as cursor_params
from ...toolkit.identity import check_owner, owner_id
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
    refusals,
)

SCHEDULE_ORDER = Keyset("schedules", ("created_at", "id"), descending=True)
TAGS = ["Schedules"]


class ScheduleBase(ApiView):
    def schedule(self, schedule_id: str) -> Schedule:
        """Return the schedule named in the path, if it exists and the principal owns it."""
        schedule = (
            Schedule.objects.filter(pk=schedule_id).first() if plain_id(schedule_id) else None
        )
        if schedule is None:
            raise errors.refusal(ScheduleNotFound(schedule_id))
        check_owner(self.request, schedule.owner_id, "schedule")
        return schedule

    def answer(self, schedule: Schedule, status: int = 200, **headers) -> Response:
        return Response(
            {"schedule": s.ScheduleSerializer.present(schedule)}, status=status, headers=headers
        )


class ScheduleListView(ScheduleBase):
    @extend_schema(
        operation_id="listSchedules",
        tags=TAGS,
        summary="List the principal's schedules",
        parameters=PAGE_PARAMETERS,
        responses={200: s.SchedulePageSerializer, **refusals(400)},
    )
    def get(self, request):
        limit, offset, position = cursor_params(request, SCHEDULE_ORDER, 20, 100)
        rows = Schedule.objects.filter(owner_id=owner_id(request))
        items, total, offset, after = keyset_page(rows, SCHEDULE_ORDER, limit, offset, position)
        body = [s.ScheduleSerializer.present(x) for x in items]
        return Response(cursor_page_body("schedules", body, total, limit, offset, after))

    @extend_schema(
        operation_id="createSchedule",
        tags=TAGS,
        summary="Create a schedule: each tick creates a task, or posts a message",
        request=s.ScheduleCreateSerializer,
        parameters=[LOCATION, *keyed(201)],
        responses={201: s.ScheduleEnvelopeSerializer, **refusals(400, 403, 404, 409, 415, 422)},
    )
    @idempotent
    def post(self, request):
        data = s.ScheduleCreateSerializer.validated(self.body)
        conversation_id = data["conversation_id"]
        if conversation_id:
            conversation = self.conversation(conversation_id)
            exposed_agent(conversation.agent)
        if data["agent_id"]:
            exposed_agent(data["agent_id"])
        elif not conversation_id:
            raise errors.validation("agentId or conversationId is required", "agentId")
        schedule = schedules.create_schedule(
            owner=self.principal(),
            input=data["input"],
            agent_id=data["agent_id"] or "",
            cron=data["cron"] or "",
            interval=data["interval"],
            timezone=data["timezone"] or "UTC",
            label=data["label"],
            metadata=data["metadata"],
            conversation_id=conversation_id,
            strategy=data["strategy"] or "reject",
            missed=data["missed"] or "run_late",
            paused=data["paused"],
        )
        return self.answer(schedule, 201, Location=self.location(schedule.id))


class ScheduleView(ScheduleBase):
    @extend_schema(
        operation_id="getSchedule",
        tags=TAGS,
        summary="Read a schedule",
        responses={200: s.ScheduleEnvelopeSerializer, **refusals(403, 404)},
    )
    def get(self, request, scheduleId):
        return self.answer(self.schedule(scheduleId))

    @extend_schema(
        operation_id="updateSchedule",
        tags=TAGS,
        summary="Change a schedule's input, label, metadata, clock or policies",
        request=s.ScheduleUpdateSerializer,
        responses={200: s.ScheduleEnvelopeSerializer, **refusals(400, 403, 404, 415)},
    )
    def patch(self, request, scheduleId):
        schedule = self.schedule(scheduleId)
        changes = s.ScheduleUpdateSerializer.validated(self.body)
        if changes:
            schedule = schedules.update_schedule(schedule.id, **changes)
        return self.answer(schedule)

    @extend_schema(
        operation_id="deleteSchedule",
        tags=TAGS,
        summary="Delete a schedule (the tasks it created stay)",
        request=None,
        responses={204: OpenApiResponse(description="Deleted"), **refusals(403, 404, 415)},
    )
    def delete(self, request, scheduleId):
        schedules.delete_schedule(self.schedule(scheduleId).id)
        return Response(status=204)


class SchedulePauseView(ScheduleBase):
    @extend_schema(
        operation_id="pauseSchedule",
        tags=TAGS,
        summary="Pause a schedule's ticks",
        request=None,
        responses={200: s.ScheduleEnvelopeSerializer, **refusals(403, 404, 415)},
    )
    def post(self, request, scheduleId):
        return self.answer(schedules.pause_schedule(self.schedule(scheduleId).id))


class ScheduleResumeView(ScheduleBase):
    @extend_schema(
        operation_id="resumeSchedule",
        tags=TAGS,
        summary="Resume a paused schedule from its next tick",
        request=None,
        responses={200: s.ScheduleEnvelopeSerializer, **refusals(403, 404, 415)},
    )
    def post(self, request, scheduleId):
        return self.answer(schedules.resume_schedule(self.schedule(scheduleId).id))


class ScheduleRunView(ScheduleBase):
    @extend_schema(
        operation_id="runSchedule",
        tags=TAGS,
        summary="Fire one tick now, beside the schedule's clock",
        request=None,
        responses={200: s.TickEnvelopeSerializer, **refusals(403, 404, 415)},
    )
    def post(self, request, scheduleId):
        tick = schedules.run_now(self.schedule(scheduleId).id)
        return Response({"tick": s.TickSerializer.present(tick)})
