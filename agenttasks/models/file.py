from django.conf import settings
from django.db import models

from .. import ids


class FileQuerySet(models.QuerySet["File"]):
    def visible(self) -> "FileQuerySet":
        """Return files whose conversation tree is not being deleted."""
        return self.filter(conversation__deleting_at__isnull=True)


class File(models.Model):
    """A file that arrived with a task or a message; its bytes live in Django's storage."""

    id = models.CharField(
        primary_key=True, max_length=ids.MAX_ID_LENGTH, default=ids.new_file_id, editable=False
    )
    conversation = models.ForeignKey(
        "agenttasks.Conversation",
        on_delete=models.CASCADE,
        related_name="files",
        verbose_name="conversation",
    )
    task = models.ForeignKey(
        "agenttasks.Task",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="files",
        verbose_name="task",
    )
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="agenttasks_files",
        verbose_name="owner",
    )
    name = models.CharField("name", max_length=255)
    mime_type = models.CharField("MIME type", max_length=255)
    size = models.PositiveBigIntegerField("size")
    sha256 = models.CharField("SHA-256", max_length=64)
    storage_name = models.CharField("stored as", max_length=500)
    created_at = models.DateTimeField("created", auto_now_add=True)
    expires_at = models.DateTimeField("expires", null=True, blank=True)

    objects = FileQuerySet.as_manager()

    class Meta:
        verbose_name = "file"
        verbose_name_plural = "files"
        ordering = ["created_at", "id"]
        indexes = [models.Index(fields=["expires_at"], name="agenttasks_file_expiry_idx")]

    def __str__(self) -> str:
        return self.name

    def ref(self) -> dict:
        """Return the FileRef shape embedded in tasks, messages and events."""
        return {"id": self.id, "name": self.name, "mimeType": self.mime_type, "size": self.size}
