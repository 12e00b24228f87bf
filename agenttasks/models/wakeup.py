from django.db import models
from django.db.models import Q

from .. import ids
from ..states import WakeupState, WakeupStatus


class Wakeup(models.Model):
    """A finished task's result owed to the conversation that spawned it (wake-up debt)."""

    id = models.CharField(
        primary_key=True, max_length=ids.MAX_ID_LENGTH, default=ids.new_wakeup_id, editable=False
    )
    conversation = models.ForeignKey(
        "agenttasks.Conversation",
        on_delete=models.CASCADE,
        related_name="owed_wakeups",
        verbose_name="owed to",
    )
    task = models.ForeignKey(
        "agenttasks.Task", on_delete=models.CASCADE, related_name="wakeups", verbose_name="task"
    )
    run_id = models.CharField("run", max_length=ids.MAX_ID_LENGTH)
    status = models.CharField("status", max_length=16, choices=WakeupStatus.choices)
    label = models.CharField("label", max_length=200, blank=True)
    summary = models.TextField("summary", blank=True)
    truncated = models.BooleanField("truncated", default=False)
    state = models.CharField(
        "state", max_length=16, choices=WakeupState.choices, default=WakeupState.PENDING
    )
    delivered_run = models.ForeignKey(
        "agenttasks.Run",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="delivered_wakeups",
        verbose_name="delivered by",
    )
    created_at = models.DateTimeField("created", auto_now_add=True)
    settled_at = models.DateTimeField("settled", null=True, blank=True)

    class Meta:
        verbose_name = "wake-up"
        verbose_name_plural = "wake-ups"
        ordering = ["created_at", "id"]
        constraints = [
            models.UniqueConstraint(
                fields=["task"],
                condition=Q(state="pending"),
                name="agenttasks_wakeup_one_pending",
            ),
            models.UniqueConstraint(fields=["task", "run_id"], name="agenttasks_wakeup_run_uniq"),
        ]
        indexes = [
            models.Index(
                fields=["conversation", "created_at"],
                condition=Q(state="pending"),
                name="agenttasks_wakeup_owed_idx",
            ),
        ]

    def __str__(self) -> str:
        return self.id
