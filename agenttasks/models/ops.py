"""Operating records: the last reaper pass (for health checks), durable metric counters, task
counts, worker processes and the notification channels that have listeners."""

from django.db import models


class ReaperPass(models.Model):
    """The last reaper pass any process made, and which node made it (one row)."""

    name = models.CharField("name", primary_key=True, max_length=32)
    node = models.CharField("node", max_length=200)
    finished_at = models.DateTimeField("finished")

    class Meta:
        verbose_name = "reaper pass"
        verbose_name_plural = "reaper passes"

    def __str__(self) -> str:
        return f"{self.name} on {self.node}"


class Counter(models.Model):
    """A monotonic counter shared by every process and node (`agenttasks.operations.metrics`)."""

    name = models.CharField("name", max_length=64)
    labels = models.CharField("labels", max_length=200, blank=True)  # k=v,k=v, sorted by key
    value = models.FloatField("value", default=0)

    class Meta:
        verbose_name = "counter"
        verbose_name_plural = "counters"
        constraints = [
            models.UniqueConstraint(fields=["name", "labels"], name="agenttasks_counter_key")
        ]

    def __str__(self) -> str:
        return f"{self.name}{{{self.labels}}}"


class TaskCount(models.Model):
    """Tasks by status, kept by database triggers on PostgreSQL (`agenttasks.operations.metrics`).

    Each connection adds to its own shard of a status, so concurrent writers do not queue on one
    row; the count of a status is the sum of its shards.
    """

    status = models.CharField("status", max_length=32)
    shard = models.SmallIntegerField("shard")
    n = models.BigIntegerField("tasks", default=0)

    class Meta:
        verbose_name = "task count"
        verbose_name_plural = "task counts"
        constraints = [
            models.UniqueConstraint(fields=["status", "shard"], name="agenttasks_taskcount_key")
        ]

    def __str__(self) -> str:
        return f"{self.status}[{self.shard}] = {self.n}"


class WorkerProcess(models.Model):
    """A worker process's slots and the runs it holds in flight, as its heartbeat last said.

    Each worker process rewrites its row every HEARTBEAT_INTERVAL and deletes it when it stops;
    rows not seen within LEASE_TIMEOUT belong to processes that died (docs/architecture.md#in-flight-runs).
    """

    id = models.CharField("process", primary_key=True, max_length=200)  # host:pid
    node = models.CharField("node", max_length=200)
    slots = models.PositiveIntegerField("slots")
    busy = models.PositiveIntegerField("runs in flight", default=0)
    started_at = models.DateTimeField("started")
    seen_at = models.DateTimeField("seen")

    class Meta:
        verbose_name = "worker process"
        verbose_name_plural = "worker processes"

    def __str__(self) -> str:
        return self.id


class ListenedChannel(models.Model):
    """A notification channel some process listens to, until `until` unless renewed.

    On PostgreSQL a process's listener renews the rows of the channels its waiters need while
    they wait (agenttasks.broker.listen), and the triggers notify `agenttasks_events` and
    `agenttasks_task_ended` only while their row is current: a commit nobody waits on takes no
    part in PostgreSQL's one-at-a-time queueing of notifying commits (docs/architecture.md#waking-waiters).
    """

    channel = models.CharField("channel", primary_key=True, max_length=63)
    until = models.DateTimeField("listened until")

    class Meta:
        verbose_name = "listened channel"
        verbose_name_plural = "listened channels"

    def __str__(self) -> str:
        return self.channel
