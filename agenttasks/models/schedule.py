from django.conf import settings
from django.db import models

from .. import ids
from ..states import MissedTicks, MultitaskStrategy, TickOutcome


class Schedule(models.Model):
    """Work that starts on a clock: each tick creates a task, or posts a message into one
    conversation (docs/lifecycle.md#schedules).

    django-q2's scheduler fires the ticks: `q_schedule` is its row, armed for `next_run_at`.
    """

    id = models.CharField(
        primary_key=True, max_length=ids.MAX_ID_LENGTH, default=ids.new_schedule_id, editable=False
    )
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.CASCADE,
        related_name="agent_schedules",
        verbose_name="owner",
    )
    agent = models.CharField("agent", max_length=64)
    input = models.TextField("input")
    label = models.CharField("label", max_length=200, blank=True)
    metadata = models.JSONField("metadata", default=dict, blank=True)
    cron = models.CharField("cron expression", max_length=100, blank=True)
    interval = models.PositiveIntegerField("every (seconds)", null=True, blank=True)
    timezone = models.CharField("time zone", max_length=64, default="UTC")
    conversation = models.ForeignKey(
        "agenttasks.Conversation",
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="schedules",
        verbose_name="posts into",
    )
    strategy = models.CharField(
        "when busy",
        max_length=16,
        choices=MultitaskStrategy.choices,
        default=MultitaskStrategy.REJECT,
    )
    missed = models.CharField(
        "missed ticks", max_length=16, choices=MissedTicks.choices, default=MissedTicks.RUN_LATE
    )
    paused_at = models.DateTimeField("paused", null=True, blank=True)
    next_run_at = models.DateTimeField("next run", null=True, blank=True)
    last_run_at = models.DateTimeField("last run", null=True, blank=True)
    q_schedule = models.OneToOneField(
        "django_q.Schedule",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        verbose_name="django-q2 schedule",
    )
    created_at = models.DateTimeField("created", auto_now_add=True)
    updated_at = models.DateTimeField("updated", auto_now=True)

    class Meta:
        verbose_name = "schedule"
        verbose_name_plural = "schedules"
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(fields=["owner", "-created_at", "-id"], name="agenttasks_sched_owner_idx"),
        ]
        constraints = [
            models.CheckConstraint(
                condition=(models.Q(cron="") & models.Q(interval__isnull=False))
                | (~models.Q(cron="") & models.Q(interval__isnull=True)),
                name="agenttasks_sched_one_clock",
            ),
        ]

    def __str__(self) -> str:
        return self.label or self.id

    @property
    def paused(self) -> bool:
        return self.paused_at is not None


class ScheduleTick(models.Model):
    """One tick of a schedule and what it did: one row per due time, so a tick acts once."""

    schedule = models.ForeignKey(
        Schedule, on_delete=models.CASCADE, related_name="ticks", verbose_name="schedule"
    )
    due_at = models.DateTimeField("due")
    outcome = models.CharField("outcome", max_length=16, choices=TickOutcome.choices)
    task = models.ForeignKey(
        "agenttasks.Task",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        verbose_name="task",
    )
    run_id = models.CharField("run", max_length=ids.MAX_ID_LENGTH, blank=True)
    detail = models.TextField("detail", blank=True)
    created_at = models.DateTimeField("fired", auto_now_add=True)

    class Meta:
        verbose_name = "schedule tick"
        verbose_name_plural = "schedule ticks"
        ordering = ["-due_at"]
        constraints = [
            models.UniqueConstraint(fields=["schedule", "due_at"], name="agenttasks_tick_once"),
        ]

    def __str__(self) -> str:
        return f"{self.schedule_id} at {self.due_at:%Y-%m-%d %H:%M:%S}: {self.outcome}"
