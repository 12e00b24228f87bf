"""The schedules' bodies and shapes (docs/rest.md#schedules)."""

from rest_framework import serializers

from ...lifecycle import schedules
from ...models import Schedule, ScheduleTick
from ...states import MissedTicks, MultitaskStrategy, TickOutcome
from ...toolkit import errors
from .envelopes import PageFields
from .requests import Body, Flag, Metadata, Name, String, Text
from .shapes import Shape


class Seconds(String):
    """A whole number of seconds (its range is the lifecycle's check), None when left out."""

    def check(self, value, name):
        if not isinstance(value, int) or isinstance(value, bool):
            raise errors.validation(
                f"{name} must be a whole number from 1 to {schedules.MAX_EVERY}", name
            )
        return value


class ScheduleCreateSerializer(Body):
    missing = "input is required"

    agentId = String(
        source="agent_id", required=False, help_text="Required unless conversationId is given."
    )
    input = Text(invalid="input must be a string", help_text="The task's input, or the message.")
    label = Name(required=False, min_length=1, max_length=200)  # type: ignore[assignment]  # the field is named by the contract
    metadata = Metadata(absent={})
    cron = String(required=False, help_text="A cron expression (5 fields, or 6 with seconds).")
    intervalSeconds = Seconds(source="interval", required=False, help_text="Or: every N seconds.")
    timezone = String(required=False, help_text="An IANA time zone for the cron expression.")
    conversationId = String(
        source="conversation_id",
        required=False,
        help_text="Post the input as a message into this conversation instead of creating tasks.",
    )
    multitaskStrategy = String(
        source="strategy",
        required=False,
        help_text="When the conversation is busy: reject, enqueue, interrupt, rollback or steer.",
    )
    missedTicks = String(source="missed", required=False, help_text="skip or run_late.")
    paused = Flag(required=False)


class ScheduleUpdateSerializer(Body):
    partial = True

    input = Text(invalid="input must be a string", required=False)
    label = Name(required=False, min_length=1, max_length=200)  # type: ignore[assignment]  # the field is named by the contract
    metadata = Metadata()
    cron = String(required=False)
    intervalSeconds = Seconds(source="interval", required=False)
    timezone = String(required=False)
    multitaskStrategy = String(source="strategy", required=False)
    missedTicks = String(source="missed", required=False)


class ScheduleSerializer(Shape):
    """A schedule."""

    id = serializers.CharField()
    agentId = serializers.CharField(source="agent")
    userId = serializers.CharField(required=False)
    input = serializers.CharField()
    label = serializers.CharField()  # type: ignore[assignment]  # the field is named by the contract
    metadata = serializers.DictField()
    cron = serializers.CharField(required=False)
    intervalSeconds = serializers.IntegerField(source="interval", required=False)
    timezone = serializers.CharField()
    conversationId = serializers.CharField(source="conversation_id", required=False)
    multitaskStrategy = serializers.ChoiceField(source="strategy", choices=MultitaskStrategy.values)
    missedTicks = serializers.ChoiceField(source="missed", choices=MissedTicks.values)
    status = serializers.ChoiceField(choices=["active", "paused"])
    nextRunAt = serializers.DateTimeField(source="next_run_at", required=False)
    lastRunAt = serializers.DateTimeField(source="last_run_at", required=False)
    createdAt = serializers.DateTimeField(source="created_at")
    updatedAt = serializers.DateTimeField(source="updated_at")

    def get_user_id(self, schedule: Schedule) -> str:
        return str(schedule.owner_id)

    def get_cron(self, schedule: Schedule) -> str | None:
        return schedule.cron or None

    def get_status(self, schedule: Schedule) -> str:
        return "paused" if schedule.paused else "active"


class TickSerializer(Shape):
    """What one tick of a schedule did."""

    scheduleId = serializers.CharField(source="schedule_id")
    dueAt = serializers.DateTimeField(source="due_at")
    outcome = serializers.ChoiceField(choices=TickOutcome.values)
    taskId = serializers.CharField(source="task_id", required=False)
    runId = serializers.CharField(source="run_id", required=False)
    detail = serializers.CharField(required=False, help_text="A refusal's code, or missed.")

    def get_run_id(self, tick: ScheduleTick) -> str | None:
        return tick.run_id or None

    def get_detail(self, tick: ScheduleTick) -> str | None:
        return tick.detail or None


class ScheduleEnvelopeSerializer(serializers.Serializer):
    schedule = ScheduleSerializer()


class SchedulePageSerializer(PageFields):
    schedules = ScheduleSerializer(many=True)


class TickEnvelopeSerializer(serializers.Serializer):
    tick = TickSerializer()
