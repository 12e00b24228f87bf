"""Schedules: work that starts on a clock (docs/lifecycle.md#schedules).

django-q2's scheduler fires the ticks. Each schedule owns one django-q2 row armed for its next
tick (`queue.arm_schedule`); when a scheduler fires it, `rearm` sets the tick after in the
scheduler's own transaction, so firing and re-arming commit together and two clusters cannot
both fire one tick. The job, `fire`, acts once per due time whatever delivered it: the tick's row
(`ScheduleTick`, unique per schedule and due time) commits with the task it creates.
"""

import logging
import math
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter
from django.db import IntegrityError, transaction
from django.utils.timezone import now

from .. import registry
from ..broker import queue
from ..exceptions import ConversationNotFound, InvalidSchedule, ScheduleNotFound, TaskError
from ..models import Conversation, Schedule, ScheduleTick, Task
from ..operations import metrics
from ..states import MissedTicks, MultitaskStrategy, TickOutcome
from .answering import STRATEGIES
from .conversations import post_message
from .creation import create

logger = logging.getLogger(__name__)

FIRE = "agenttasks.lifecycle.schedules.fire"
MAX_EVERY = 366 * 86_400  # intervalSeconds: at most a year
CRON_LENGTH = 100
EDITABLE = ("input", "label", "metadata", "cron", "interval", "timezone", "strategy", "missed")


# --- the clock ---------------------------------------------------------------------------------


def zone(name: str) -> ZoneInfo:
    """Return the time zone `name`, or refuse it (InvalidSchedule)."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):  # OSError: a name too long for a file
        raise InvalidSchedule(f"Unknown time zone: {name!r}", "timezone") from None


def check_clock(cron: str, interval: int | None, timezone: str) -> None:
    """Refuse a clock that is not exactly one valid cron expression or interval, in a known zone."""
    if bool(cron) == (interval is not None):
        raise InvalidSchedule("Give either cron or intervalSeconds, not both", "cron")
    if cron and not _ticks(cron):
        raise InvalidSchedule(f"Invalid cron expression: {cron!r}", "cron")
    if interval is not None and (
        isinstance(interval, bool) or not isinstance(interval, int) or not 0 < interval <= MAX_EVERY
    ):
        raise InvalidSchedule(
            f"intervalSeconds must be a whole number from 1 to {MAX_EVERY}", "intervalSeconds"
        )
    zone(timezone)


def _ticks(cron: str) -> bool:
    """Say whether a cron expression is valid and comes due at all (not, say, February 30)."""
    if len(cron) > CRON_LENGTH or not croniter.is_valid(cron):
        return False
    try:
        croniter(cron, now()).get_next(datetime)
    except Exception:  # croniter's CroniterBadDateError: no date matches
        return False
    return True


def next_tick(schedule: Schedule, after: datetime) -> datetime:
    """Return the schedule's first tick strictly after `after`.

    A cron expression is read in the schedule's time zone (so 09:00 stays 09:00 across daylight
    saving); an interval counts from the schedule's creation.
    """
    if schedule.cron:
        local = after.astimezone(zone(schedule.timezone))
        tick: datetime = croniter(schedule.cron, local).get_next(datetime)
        return tick.astimezone(UTC)
    step = timedelta(seconds=schedule.interval or 1)
    anchor = schedule.created_at
    return anchor + step * (math.floor((after - anchor) / step) + 1)


# --- the Python API ----------------------------------------------------------------------------


def create_schedule(
    *,
    owner: Any,  # a user
    input: str,
    agent_id: str = "",
    cron: str = "",
    interval: int | None = None,
    timezone: str = "UTC",
    label: str = "",
    metadata: dict[str, Any] | None = None,
    conversation_id: str | None = None,
    strategy: str = MultitaskStrategy.REJECT,
    missed: str = MissedTicks.RUN_LATE,
    paused: bool = False,
) -> Schedule:
    """Create a schedule: each tick creates a task of `agent_id`, or posts `input` as a message
    into `conversation_id` (the owner's) under `strategy`.

    Refused (InvalidSchedule, ScheduleNotFound's kin) for an unknown agent, a clock that is not
    one valid cron expression or interval, an unknown time zone, a conversation the owner does
    not have, or a strategy or missed-tick policy it does not know.
    """
    conversation = _target(owner, conversation_id)
    if conversation is not None:
        if agent_id and agent_id != conversation.agent:
            raise InvalidSchedule("agentId must be the conversation's agent", "agentId")
        agent_id = conversation.agent
    _check_agent(agent_id)
    check_clock(cron, interval, timezone)
    _check_choices(strategy, missed)
    with transaction.atomic():
        schedule = Schedule.objects.create(
            owner=owner,
            agent=agent_id,
            input=input,
            label=label,
            metadata=metadata or {},
            cron=cron,
            interval=interval,
            timezone=timezone,
            conversation=conversation,
            strategy=strategy,
            missed=missed,
            paused_at=now() if paused else None,
        )
        if not paused:
            _arm(schedule)
    return schedule


def get_schedule(schedule_id: str, owner: Any = None) -> Schedule:
    """Return a schedule (the owner's, when one is given), or raise ScheduleNotFound."""
    rows = Schedule.objects.filter(pk=schedule_id)
    if owner is not None:
        rows = rows.filter(owner=owner)
    schedule = rows.first()
    if schedule is None:
        raise ScheduleNotFound(schedule_id)
    return schedule


def update_schedule(schedule_id: str, **changes: Any) -> Schedule:
    """Change a schedule's input, label, metadata, clock, strategy or missed-tick policy.

    A new clock (`cron` or `interval`) replaces the old one and moves the next tick.
    """
    unknown = set(changes) - set(EDITABLE)
    if unknown:
        raise TypeError(f"update_schedule() cannot change {sorted(unknown)}")
    with transaction.atomic():
        schedule = _lock(schedule_id)
        if "cron" in changes or "interval" in changes:
            changes = {"cron": "", "interval": None, **changes}
        for name, value in changes.items():
            setattr(schedule, name, value)
        check_clock(schedule.cron, schedule.interval, schedule.timezone)
        _check_choices(schedule.strategy, schedule.missed)
        schedule.save()
        if not schedule.paused:
            _arm(schedule)
    return schedule


def pause_schedule(schedule_id: str) -> Schedule:
    """Stop a schedule's ticks until it is resumed (a tick already fired still acts)."""
    with transaction.atomic():
        schedule = _lock(schedule_id)
        if not schedule.paused:
            schedule.paused_at = now()
            schedule.next_run_at = None
            schedule.save(update_fields=["paused_at", "next_run_at", "updated_at"])
            queue.disarm_schedule(schedule.q_schedule_id)
    return schedule


def resume_schedule(schedule_id: str) -> Schedule:
    """Start a paused schedule's ticks again, from the next one after now."""
    with transaction.atomic():
        schedule = _lock(schedule_id)
        if schedule.paused:
            schedule.paused_at = None
            schedule.save(update_fields=["paused_at", "updated_at"])
            _arm(schedule)
    return schedule


def delete_schedule(schedule_id: str) -> None:
    """Delete a schedule and its ticks; the tasks it created stay, without it."""
    with transaction.atomic():
        _lock(schedule_id).delete()


def forget_row(sender: Any, instance: Schedule, **kwargs: Any) -> None:
    """Delete a deleted schedule's django-q2 row, whatever deleted it (a post_delete hook: the
    conversation it posts into, or its owner, may take it with them)."""
    queue.delete_schedule_row(instance.q_schedule_id)


def run_now(schedule_id: str) -> ScheduleTick:
    """Fire one tick of a schedule now, paused or not, beside its clock; return what it did."""
    tick = fire(schedule_id, due=now().isoformat(), manual=True)
    if tick is None:
        raise ScheduleNotFound(schedule_id)
    return tick


# --- firing ------------------------------------------------------------------------------------


def fire(
    schedule_id: str, due: str | None = None, manual: bool = False, **kwargs: Any
) -> ScheduleTick | None:
    """Act on one tick of a schedule (django-q2's job for a fired row); return what it did.

    Once per due time: a second delivery of one tick finds its row and does nothing. A tick that
    came due while no cluster ran, found after the following one was due too, is skipped when
    the schedule says so.
    """
    schedule = Schedule.objects.filter(pk=schedule_id).first()
    if schedule is None or (schedule.paused and not manual):
        return None
    due_at = datetime.fromisoformat(due) if due else now()
    if not manual and schedule.missed == MissedTicks.SKIP and next_tick(schedule, due_at) <= now():
        return _record(schedule, due_at, TickOutcome.SKIPPED, detail="missed")
    try:
        with transaction.atomic():
            if schedule.conversation_id is None:
                tick = ScheduleTick(schedule=schedule, due_at=due_at, outcome=TickOutcome.CREATED)

                def keep(task: Task) -> None:
                    tick.task = task
                    tick.save(force_insert=True)

                create(
                    owner=schedule.owner,
                    agent_id=schedule.agent,
                    input=schedule.input,
                    label=schedule.label,
                    metadata=schedule.metadata,
                    schedule_id=schedule.id,
                    before_commit=keep,
                )
            else:
                tick = ScheduleTick.objects.create(
                    schedule=schedule, due_at=due_at, outcome=TickOutcome.POSTED
                )
                run, _ = post_message(
                    schedule.conversation_id,
                    schedule.input,
                    author=schedule.owner,
                    metadata=schedule.metadata,
                    strategy=schedule.strategy,
                )
                tick.run_id = run.id
                tick.save(update_fields=["run_id"])
    except IntegrityError:
        return ScheduleTick.objects.filter(schedule=schedule, due_at=due_at).first()
    except (TaskError, registry.UnknownAgent) as exc:
        return _record(schedule, due_at, TickOutcome.REFUSED, detail=_told(exc))
    Schedule.objects.filter(pk=schedule.pk).update(last_run_at=due_at)
    metrics.count_tick(tick.outcome)
    logger.info("schedule.fired schedule=%s due=%s outcome=%s", schedule.id, due, tick.outcome)
    return tick


def rearm(row: Any) -> None:
    """Arm a fired django-q2 row for its schedule's tick after now (`queue.on_schedule_fired`).

    Runs in the scheduler's transaction, which holds the row's lock: a paused schedule stays
    disarmed.
    """
    schedule = Schedule.objects.filter(q_schedule_id=row.pk, paused_at__isnull=True).first()
    if schedule is None:
        return
    row.next_run = next_tick(schedule, max(row.next_run, now()))
    row.repeats = 1
    Schedule.objects.filter(pk=schedule.pk).update(next_run_at=row.next_run)


# --- helpers -----------------------------------------------------------------------------------


def _arm(schedule: Schedule) -> None:
    schedule.next_run_at = next_tick(schedule, now())
    q_id = queue.arm_schedule(
        f"agenttasks schedule {schedule.id}",
        FIRE,
        (schedule.id,),
        schedule.next_run_at,
        schedule.q_schedule_id,
    )
    schedule.q_schedule_id = q_id
    Schedule.objects.filter(pk=schedule.pk).update(
        next_run_at=schedule.next_run_at, q_schedule_id=q_id
    )


def _lock(schedule_id: str) -> Schedule:
    # Lock order: django-q2's row first, as its scheduler takes it before `rearm` reads ours.
    q_id = Schedule.objects.filter(pk=schedule_id).values_list("q_schedule_id", flat=True).first()
    queue.lock_schedule_row(q_id)
    schedule = Schedule.objects.select_for_update().filter(pk=schedule_id).first()
    if schedule is None:
        raise ScheduleNotFound(schedule_id)
    return schedule


def _target(owner: Any, conversation_id: str | None) -> Conversation | None:
    if not conversation_id:
        return None
    conversation = (
        Conversation.objects.visible().filter(pk=conversation_id, owner=owner, hidden=False).first()
    )
    if conversation is None:
        raise ConversationNotFound(conversation_id)
    return conversation


def _check_agent(agent_id: str) -> None:
    try:
        registry.get(agent_id)
    except registry.UnknownAgent:
        raise InvalidSchedule(f"Unknown agent: {agent_id!r}", "agentId") from None


def _check_choices(strategy: str, missed: str) -> None:
    if strategy not in STRATEGIES:
        raise InvalidSchedule(
            f"multitaskStrategy must be one of {', '.join(STRATEGIES)}", "multitaskStrategy"
        )
    if missed not in MissedTicks.values:
        raise InvalidSchedule(
            f"missedTicks must be one of {', '.join(MissedTicks.values)}", "missedTicks"
        )


def _record(schedule: Schedule, due_at: datetime, outcome: str, detail: str) -> ScheduleTick:
    try:
        with transaction.atomic():
            tick = ScheduleTick.objects.create(
                schedule=schedule, due_at=due_at, outcome=outcome, detail=detail
            )
    except IntegrityError:  # recorded already: counted then
        return ScheduleTick.objects.get(schedule=schedule, due_at=due_at)
    metrics.count_tick(outcome)
    return tick


def _told(exc: Exception) -> str:
    """Name a refusal by its code (`conversation_busy`, …): each surface words it."""
    return exc.code if isinstance(exc, TaskError) else "unknown_agent"
