from datetime import datetime

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone

from .. import ids, tracing
from ..states import RUN_ACTIVE, RUN_UNFINISHED, RunStatus, RunTrigger, StopRequest


class RunQuerySet(models.QuerySet["Run"]):
    """Runs by the named states the workers, the reaper and the guards ask for."""

    def active(self) -> "RunQuerySet":
        """Return runs that are queued, running or paused."""
        return self.filter(status__in=RUN_ACTIVE)

    def unfinished(self) -> "RunQuerySet":
        """Return runs that are active or waiting their turn behind them (`enqueue`)."""
        return self.filter(status__in=RUN_UNFINISHED)

    def due(self, now: datetime) -> "RunQuerySet":
        """Return queued runs that may start now (no delayed start, or one that has come)."""
        return self.filter(status=RunStatus.QUEUED).filter(
            models.Q(not_before__isnull=True) | models.Q(not_before__lte=now)
        )

    def not_due(self, now: datetime) -> "RunQuerySet":
        """Return queued runs whose delayed start has not come."""
        return self.filter(status=RunStatus.QUEUED, not_before__gt=now)

    def lease_expired(self, cutoff: datetime) -> "RunQuerySet":
        """Running runs not heard from since `cutoff` (their worker is presumed dead)."""
        silent = Q(heartbeat_at__lt=cutoff) | Q(heartbeat_at__isnull=True, started_at__lt=cutoff)
        return self.filter(silent, status=RunStatus.RUNNING)

    def taskless(self) -> "RunQuerySet":
        """Return runs of a conversation without a task (chat messages and wake-ups)."""
        return self.filter(task__isnull=True)


class Run(models.Model):
    """One execution of an agent on a conversation: what a worker claims, heartbeats and ends."""

    id = models.CharField(
        primary_key=True, max_length=ids.MAX_ID_LENGTH, default=ids.new_run_id, editable=False
    )
    conversation = models.ForeignKey(
        "agenttasks.Conversation",
        on_delete=models.CASCADE,
        related_name="runs",
        verbose_name="conversation",
        db_index=False,  # agenttasks_run_conv_idx leads with it
    )
    task = models.ForeignKey(
        "agenttasks.Task",
        null=True,
        blank=True,
        # A run is deleted with its conversation; a task row deleted on its own leaves history.
        on_delete=models.SET_NULL,
        related_name="runs",
        verbose_name="task",
    )
    # The conversation's owner and the task's priority, copied onto the run so that a claim
    # walks an index owner by owner instead of reading every queued run (docs/architecture.md,
    # "Fair claims read a few runs of each owner, not the queue").
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.DO_NOTHING,  # deleted with its conversation
        db_constraint=False,
        db_index=False,  # agenttasks_run_turn_idx leads with it
        related_name="+",
        editable=False,
        verbose_name="owner",
    )
    priority = models.IntegerField("priority", default=0, db_default=0, editable=False)
    agent = models.CharField("agent", max_length=64)
    trigger = models.CharField("trigger", max_length=16, choices=RunTrigger.choices)
    input = models.TextField("input", blank=True)
    attempt = models.PositiveIntegerField("attempt", default=1)
    status = models.CharField(
        "status", max_length=16, choices=RunStatus.choices, default=RunStatus.QUEUED
    )
    stop_request = models.CharField(
        "stop request", max_length=16, choices=StopRequest.choices, default="", blank=True
    )
    worker = models.CharField("worker", max_length=200, blank=True)
    heartbeat_at = models.DateTimeField("heartbeat", null=True, blank=True)
    queued_at = models.DateTimeField("queued", default=timezone.now)
    requeues = models.PositiveIntegerField(
        "requeues",
        default=0,
        db_default=0,
        help_text="How often the reaper enqueued this run again since it last became queued.",
    )
    requeue_at = models.DateTimeField(
        "next requeue check",
        null=True,
        blank=True,
        help_text="The reaper looks at this queued run again no earlier than this.",
    )
    not_before = models.DateTimeField(
        "not before",
        null=True,
        blank=True,
        help_text="A queued run is not claimed before this (a delayed start).",
    )
    limited_since = models.DateTimeField(
        "waiting for its limit since",
        null=True,
        blank=True,
        help_text="A run parked for its provider's limit has waited since then (its patience "
        "counts from then).",
    )
    message = models.JSONField(
        "waiting message",
        null=True,
        blank=True,
        help_text="The message.user event a waiting run posts when it is released to start.",
    )
    steers = models.PositiveIntegerField(
        "steered messages", default=0, help_text="Messages steered to it (the steer strategy)."
    )
    steers_taken = models.PositiveIntegerField(
        "steered messages taken in", default=0, help_text="Of those, the ones it has read."
    )
    started_at = models.DateTimeField("started", null=True, blank=True)
    ended_at = models.DateTimeField("ended", null=True, blank=True)
    output = models.TextField("output", blank=True)
    error = models.TextField("error", blank=True)
    graceful_stop = models.BooleanField("graceful stop", default=False)
    progress = models.JSONField(
        "progress state", null=True, blank=True, help_text="The last progress state recorded."
    )
    turns = models.PositiveIntegerField("turns", default=0)
    tool_calls = models.PositiveIntegerField("tool calls", default=0)
    prompt_tokens = models.PositiveIntegerField("prompt tokens", default=0)
    completion_tokens = models.PositiveIntegerField("completion tokens", default=0)
    total_tokens = models.PositiveIntegerField("total tokens", default=0)
    usage_known = models.BooleanField("usage known", default=False)
    exec_seconds = models.FloatField("seconds executing", default=0)
    counted_in = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="absorbed_runs",
        verbose_name="counted in",
        db_index=False,  # agenttasks_run_counted_in_idx, for the runs that have one
        help_text="The caller run whose usage absorbed this delegate run's usage.",
    )
    counted_usage = models.JSONField(
        "counted usage",
        null=True,
        blank=True,
        help_text="What of this run's usage and tool calls its `counted in` run has absorbed "
        "(a paused child keeps spending after its escalation was reported).",
    )
    # The W3C trace context current when it was written (docs/operating.md#traces): "" while
    # tracing is off.
    traceparent = models.CharField(
        "trace context", max_length=55, blank=True, default=tracing.current_traceparent
    )
    created_at = models.DateTimeField("created", auto_now_add=True)

    objects = RunQuerySet.as_manager()

    class Meta:
        verbose_name = "run"
        verbose_name_plural = "runs"
        ordering = ["created_at", "id"]
        indexes = [
            # The reaper: running runs by heartbeat, queued runs by age.
            models.Index(fields=["status", "heartbeat_at"], name="agenttasks_run_lease_idx"),
            models.Index(fields=["status", "queued_at"], name="agenttasks_run_queue_idx"),
            # Busy checks and wake guards: the active runs of one conversation.
            models.Index(fields=["conversation", "status"], name="agenttasks_run_conv_idx"),
            # The claims: each owner's queued runs in turn order, and the wake-ups, which go
            # first.
            models.Index(
                fields=["owner", "-priority", "queued_at", "id"],
                name="agenttasks_run_turn_idx",
                condition=models.Q(status="queued"),
            ),
            models.Index(
                fields=["queued_at", "id"],
                name="agenttasks_run_wakeup_idx",
                condition=models.Q(status="queued", trigger="wakeup"),
            ),
            # The claimers: when the next delayed start comes.
            models.Index(
                fields=["not_before"],
                name="agenttasks_run_waiting_idx",
                condition=models.Q(status="queued", not_before__isnull=False),
            ),
            # Partial: few runs are counted in another (each write of a run adds an entry to
            # every index whose condition it meets).
            models.Index(
                fields=["counted_in"],
                name="agenttasks_run_counted_in_idx",
                condition=models.Q(counted_in__isnull=False),
            ),
        ]

    def __str__(self) -> str:
        return self.id

    @property
    def usage(self) -> dict | None:
        if not self.usage_known:
            return None
        return {
            "inputTokens": self.prompt_tokens,
            "outputTokens": self.completion_tokens,
            "totalTokens": self.total_tokens,
        }
