from datetime import datetime

from django.db import models

from ..states import TaskStatus


class DeliveryQuerySet(models.QuerySet):
    def overdue(self, cutoff: datetime) -> "DeliveryQuerySet":
        """Return deliveries that were due at `cutoff` or before and that no job holds: never
        claimed, or claimed by a job whose lease ended at `cutoff` or before."""
        return self.filter(due_at__lte=cutoff).filter(
            models.Q(leased_until__isnull=True) | models.Q(leased_until__lte=cutoff)
        )

    def claimable(self, now: datetime) -> "DeliveryQuerySet":
        """Return deliveries no job holds at `now`."""
        return self.filter(models.Q(leased_until__isnull=True) | models.Q(leased_until__lte=now))


class Delivery(models.Model):
    """A notification an ending owes: its task's callback, or one push config's POST.

    Written in the ending's own transaction (an outbox row), so nothing owed is forgotten if the
    broker or the database fails between the commit and the enqueue of the job that sends it.
    The job that sends it leases the row (`leased_until`), and deletes it once the receiver
    answered or the failure is recorded; the reaper sends again what stays overdue, a lease that
    lapsed included (docs/rest.md#callbacks).
    """

    task = models.ForeignKey(
        "agenttasks.Task", on_delete=models.CASCADE, related_name="deliveries", verbose_name="task"
    )
    # None: the task's callbackUrl; else one of its A2A push notification configs.
    config = models.ForeignKey(
        "agenttasks.A2APushConfig",
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="deliveries",
        verbose_name="push config",
    )
    status = models.CharField("status", max_length=32, choices=TaskStatus.choices)
    version = models.PositiveIntegerField("task version")
    attempts = models.PositiveIntegerField("sent again", default=0)
    due_at = models.DateTimeField("due", db_index=True)
    # A job is sending it until then; a crash leaves the row, sent again once the lease lapsed.
    leased_until = models.DateTimeField("leased until", null=True, blank=True)

    objects = DeliveryQuerySet.as_manager()

    class Meta:
        verbose_name = "delivery owed"
        verbose_name_plural = "deliveries owed"

    def __str__(self) -> str:
        return f"{self.task_id} {self.status} → {self.config_id or 'callback'}"
