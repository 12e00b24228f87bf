from django.conf import settings
from django.db import models
from django.db.models import Q

from .. import ids
from ..states import ActionKind, ActionStatus
from ..text import iso


class PendingActionQuerySet(models.QuerySet["PendingAction"]):
    def open(self) -> "PendingActionQuerySet":
        """Return actions still waiting for an answer."""
        return self.filter(status=ActionStatus.PENDING)


class PendingAction(models.Model):
    """An approval or a question a run asked, bound to that run."""

    class OnTimeout(models.TextChoices):
        DENY = "deny", "deny"
        CANCEL = "cancel", "cancel"

    id = models.CharField(
        primary_key=True, max_length=ids.MAX_ID_LENGTH, default=ids.new_action_id, editable=False
    )
    conversation = models.ForeignKey(
        "agenttasks.Conversation",
        on_delete=models.CASCADE,
        related_name="actions",
        verbose_name="conversation",
        db_index=False,  # agenttasks_action_conv_idx leads with it
    )
    run = models.ForeignKey(
        "agenttasks.Run", on_delete=models.CASCADE, related_name="actions", verbose_name="run"
    )
    task = models.ForeignKey(
        "agenttasks.Task",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="actions",
        verbose_name="task",
    )
    kind = models.CharField("kind", max_length=16, choices=ActionKind.choices)
    tool_name = models.CharField("tool", max_length=64)
    tool_call_id = models.CharField("tool call id", max_length=200)
    args = models.JSONField("arguments", null=True, blank=True)
    questions = models.JSONField("questions", null=True, blank=True)
    prompt = models.TextField("prompt", blank=True)
    status = models.CharField(
        "status", max_length=16, choices=ActionStatus.choices, default=ActionStatus.PENDING
    )
    resolution = models.JSONField(
        "resolution", null=True, blank=True, help_text="The decision: approval, comment, answers."
    )
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        verbose_name="decided by",
    )
    decided_at = models.DateTimeField("decided", null=True, blank=True)
    deadline = models.DateTimeField("expires", null=True, blank=True)
    on_timeout = models.CharField(
        "on timeout", max_length=8, choices=OnTimeout.choices, default=OnTimeout.DENY
    )
    created_at = models.DateTimeField("created", auto_now_add=True)

    objects = PendingActionQuerySet.as_manager()

    class Meta:
        verbose_name = "pending action"
        verbose_name_plural = "pending actions"
        ordering = ["created_at", "id"]
        indexes = [
            models.Index(
                fields=["deadline"],
                condition=Q(status="pending"),
                name="agenttasks_action_open_idx",
            ),
            models.Index(fields=["conversation", "status"], name="agenttasks_action_conv_idx"),
        ]

    def __str__(self) -> str:
        return self.id

    def as_payload(self) -> dict:
        """Return the REST shape (docs/rest.md#data-shapes), unset optional fields omitted."""
        data = {
            "id": self.id,
            "kind": self.kind,
            "runId": self.run_id,
            "toolName": self.tool_name,
            "toolCallId": self.tool_call_id,
            "status": self.status,
            "createdAt": iso(self.created_at),
        }
        if self.args is not None:
            data["args"] = self.args
        if self.questions is not None:
            data["questions"] = self.questions
        if self.prompt:
            data["prompt"] = self.prompt
        if self.deadline is not None:
            data["expiresAt"] = iso(self.deadline)
        if self.decided_by_id is not None:
            data["decidedBy"] = str(self.decided_by_id)
        if self.decided_at is not None:
            data["decidedAt"] = iso(self.decided_at)
        return data
