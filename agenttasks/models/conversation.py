from django.conf import settings
from django.db import models

from .. import ids

# The metadata keys the server writes on a task's conversation; a client cannot set them.
RESERVED_METADATA = ("source", "taskId")


class ConversationQuerySet(models.QuerySet["Conversation"]):
    def visible(self) -> "ConversationQuerySet":
        """Return conversations that are not being deleted."""
        return self.filter(deleting_at__isnull=True)

    def being_deleted(self) -> "ConversationQuerySet":
        """Return conversations whose tree is marked for deletion
        (docs/lifecycle.md#deleting-a-conversation)."""
        return self.filter(deleting_at__isnull=False)


class Conversation(models.Model):
    """An append-only log of events for one user: a chat, or the transcript of a task."""

    id = models.CharField(
        primary_key=True,
        max_length=ids.MAX_ID_LENGTH,
        default=ids.new_conversation_id,
        editable=False,
    )
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="agenttasks_conversations",
        verbose_name="owner",
        db_index=False,  # agenttasks_conv_owner_idx leads with it
    )
    agent = models.CharField("agent", max_length=64)
    title = models.CharField("title", max_length=200, blank=True)
    metadata = models.JSONField("metadata", default=dict, blank=True)
    hidden = models.BooleanField(
        "hidden", default=False, help_text="The conversation of a task a model spawned."
    )
    parent = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="children",
        verbose_name="parent conversation",
        help_text="For a hidden task conversation: the conversation that spawned its task.",
        db_index=False,  # agenttasks_conv_parent_idx, for the conversations that have one
    )
    # Kept equal to the newest event's seq by a database trigger (see migration 0002), so that
    # appending events costs one INSERT and the next seq is read from the locked row.
    last_seq = models.PositiveIntegerField("last seq", default=0)
    deleting_at = models.DateTimeField(
        "deleting since", null=True, blank=True, help_text="Set when a delete has begun."
    )
    created_at = models.DateTimeField("created", auto_now_add=True)
    updated_at = models.DateTimeField("updated", auto_now=True)

    objects = ConversationQuerySet.as_manager()

    class Meta:
        verbose_name = "conversation"
        verbose_name_plural = "conversations"
        indexes = [
            models.Index(
                fields=["owner", "hidden", "-updated_at", "-id"], name="agenttasks_conv_owner_idx"
            ),
            # Retention: the roots of conversation trees by age.
            models.Index(
                fields=["updated_at"],
                name="agenttasks_conv_root_idx",
                condition=models.Q(parent__isnull=True),
            ),
            # Partial: most conversations have no parent, and each update of one that is not
            # HOT adds an entry to every index whose condition it meets.
            models.Index(
                fields=["parent"],
                name="agenttasks_conv_parent_idx",
                condition=models.Q(parent__isnull=False),
            ),
        ]

    def __str__(self) -> str:
        return self.id

    @property
    def source(self) -> str:
        return (self.metadata or {}).get("source", "")


class Event(models.Model):
    """One entry of a conversation's log, numbered by a per-conversation seq."""

    id = models.CharField(
        primary_key=True, max_length=ids.MAX_ID_LENGTH, default=ids.new_event_id, editable=False
    )
    # No index of its own: the (conversation, seq) unique constraint serves every lookup.
    conversation = models.ForeignKey(
        Conversation,
        on_delete=models.CASCADE,
        related_name="events",
        verbose_name="conversation",
        db_index=False,
    )
    seq = models.PositiveIntegerField("seq")
    type = models.CharField("type", max_length=32)
    run_id = models.CharField("run", max_length=ids.MAX_ID_LENGTH, blank=True)
    task_id = models.CharField("task", max_length=ids.MAX_ID_LENGTH, blank=True)
    data = models.JSONField("data", default=dict, blank=True)
    created_at = models.DateTimeField("created", auto_now_add=True)

    class Meta:
        verbose_name = "event"
        verbose_name_plural = "events"
        ordering = ["conversation", "seq"]
        constraints = [
            models.UniqueConstraint(
                fields=["conversation", "seq"], name="agenttasks_event_conversation_seq_uniq"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.conversation_id}#{self.seq} {self.type}"
