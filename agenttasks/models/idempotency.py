from django.conf import settings
from django.db import models
from django.utils import timezone


class IdempotencyKey(models.Model):
    """A client's Idempotency-Key: the request it named and the answer recorded for it.

    A key belongs to one principal (`user:<pk>`, or `anonymous`); the method, path and body hash
    tell a repeat from a misuse. The row is written in the transaction of the request's effect,
    so it exists exactly when that effect does; it lapses at `expires_at` (IDEMPOTENCY_TTL).
    """

    principal = models.CharField("principal", max_length=64)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="+",
        verbose_name="owner",
        db_index=False,  # deleting a user is rare; the unique key serves every lookup
    )
    key = models.CharField("key", max_length=255)
    method = models.CharField("method", max_length=8)
    path = models.TextField("path")
    request_hash = models.CharField("request hash", max_length=64)
    # Null only inside the first request's own transaction, before its answer is recorded.
    status_code = models.PositiveSmallIntegerField("status code", null=True, blank=True)
    response_body = models.JSONField("response body", null=True, blank=True)
    response_headers = models.JSONField("response headers", default=dict, blank=True)
    created_at = models.DateTimeField("created", default=timezone.now)
    expires_at = models.DateTimeField("expires", db_index=True)

    class Meta:
        verbose_name = "idempotency key"
        verbose_name_plural = "idempotency keys"
        constraints = [
            models.UniqueConstraint(
                fields=["principal", "key"], name="agenttasks_idempotency_principal_key"
            )
        ]

    def __str__(self) -> str:
        return f"{self.principal} {self.key}"
