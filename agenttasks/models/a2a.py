"""What A2A adds to a task: the context it belongs to and its push notification configs.

Neither imports the a2a-sdk, so the app's models load without the `a2a` extra.
"""

from django.db import models

from .. import ids


class A2AContext(models.Model):
    """The A2A `contextId` of a task created over A2A (a task without a row is its own context,
    named by its conversation id)."""

    task = models.OneToOneField(
        "agenttasks.Task",
        primary_key=True,
        on_delete=models.CASCADE,
        related_name="a2a_context",
    )
    context_id = models.CharField("context id", max_length=200, db_index=True)

    class Meta:
        verbose_name = "A2A context"
        verbose_name_plural = "A2A contexts"

    def __str__(self) -> str:
        return self.context_id


def new_push_config_id() -> str:
    return ids.new_id("pnc_")


class A2APushConfig(models.Model):
    """A TaskPushNotificationConfig: where and how to POST a task's updates."""

    config_id = models.CharField("config id", max_length=200, default=new_push_config_id)
    task = models.ForeignKey(
        "agenttasks.Task", on_delete=models.CASCADE, related_name="a2a_push_configs"
    )
    url = models.CharField("URL", max_length=2000)
    token = models.CharField("token", max_length=2000, blank=True)
    auth_scheme = models.CharField("authentication scheme", max_length=100, blank=True)
    auth_credentials = models.TextField("authentication credentials", blank=True)
    # The task version last delivered: a job delivered twice sends once.
    delivered_version = models.PositiveIntegerField("delivered version", default=0)
    created_at = models.DateTimeField("created", auto_now_add=True)

    class Meta:
        verbose_name = "A2A push notification config"
        verbose_name_plural = "A2A push notification configs"
        constraints = [
            models.UniqueConstraint(
                fields=["task", "config_id"], name="agenttasks_a2a_push_task_id"
            )
        ]

    def __str__(self) -> str:
        return self.config_id
