"""Prometheus metrics, correct across processes and nodes (docs/rest.md#metrics).

Gauges are computed from the database at scrape time with index-backed queries; counters and the
run-duration histogram are durable rows (`Counter`) that every process increments with one
upsert, so a worker restart loses nothing. `exposition()` renders them with prometheus-client.
"""

import logging
from collections import defaultdict
from collections.abc import Iterable, Mapping
from datetime import timedelta

from django.db import connection, transaction
from django.db.models import Count, Min, Sum
from django.utils import timezone
from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.exposition import choose_encoder
from prometheus_client.utils import floatToGoString

from ..conf import app_settings
from ..models import Counter, Run, Schedule, Task, TaskCount, WorkerProcess
from ..states import RunStatus, TaskStatus

logger = logging.getLogger(__name__)

# Upper bounds (seconds) of the run-duration histogram's buckets.
DURATION_BUCKETS = (0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
BUCKET_LABELS = (*(floatToGoString(b) for b in DURATION_BUCKETS), "+Inf")  # "0.1" … "5.0"
DURATION = "agenttasks_run_duration_seconds"
QUEUE_WAIT = "agenttasks_run_queue_wait_seconds"
HISTOGRAMS = {
    DURATION: ("How long runs executed, by agent and outcome.", ["agent", "outcome"]),
    QUEUE_WAIT: ("How long runs waited from queued (or due) to claimed, by trigger.", ["trigger"]),
}
TOP_OWNERS = 20  # owners with the most queued runs shown by agenttasks_runs_queued_by_owner
COUNTERS = {
    "agenttasks_orphans_failed_total": "Runs the reaper failed because their lease expired.",
    "agenttasks_callbacks_total": "Callbacks sent, by outcome (delivered or failed).",
    "agenttasks_model_requests_total": "Model-server requests, by outcome.",
    "agenttasks_provider_permits_total": "Model requests that got their turn, by endpoint.",
    "agenttasks_provider_waits_total": "Model requests that waited for their turn, by endpoint.",
    "agenttasks_provider_wait_seconds_total": "Seconds model requests waited for their turn.",
    "agenttasks_provider_refusals_total": "Refusals (429, 503) a provider answered, by endpoint.",
    "agenttasks_provider_patience_ran_out_total": "Runs failed waiting on a limit, by endpoint.",
    "agenttasks_provider_late_turns_total": "Requests that missed their turn and took another.",
    "agenttasks_provider_parks_total": "Runs parked to wait for a turn far off, by endpoint.",
    "agenttasks_task_retries_total": "Automatic retries after a passing failure, by agent.",
    "agenttasks_schedule_ticks_total": "Schedule ticks recorded, by outcome.",
    "agenttasks_tokens_total": "Tokens runs spent, by agent and kind (input, output, total).",
}


def _labels(labels: Mapping[str, str]) -> str:
    return ",".join(f"{key}={labels[key]}" for key in sorted(labels))


def _parse(labels: str) -> dict[str, str]:
    return dict(pair.split("=", 1) for pair in labels.split(",")) if labels else {}


def increment(rows: Iterable[tuple[str, Mapping[str, str], float]]) -> None:
    """Add to durable counters: (name, labels, amount) each, in one statement; never raises.

    Only while METRICS_ENABLED: a site that does not scrape pays no statement per run.
    """
    if not app_settings.METRICS_ENABLED:
        return
    summed: dict[tuple[str, str], float] = defaultdict(float)
    for name, labels, amount in rows:
        if amount:
            summed[(name, _labels(labels))] += float(amount)
    # One row per counter: an upsert may not touch a row twice.
    values = [(name, labels, amount) for (name, labels), amount in summed.items()]
    if not values:
        return
    table = Counter._meta.db_table
    placeholders = ", ".join(["(%s, %s, %s)"] * len(values))
    sql = (
        f"INSERT INTO {table} (name, labels, value) VALUES {placeholders} "
        f"ON CONFLICT (name, labels) DO UPDATE SET value = {table}.value + excluded.value"
    )
    params = [item for row in values for item in row]
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(sql, params)
    except Exception:
        # A metric is never worth failing the work it counts.
        logger.warning("metrics.increment_failed names=%s", [v[0] for v in values], exc_info=True)


def count(name: str, amount: float = 1, **labels: str) -> None:
    """Add `amount` to one durable counter."""
    increment([(name, labels, amount)])


def count_tick(outcome: str) -> None:
    """Count one schedule tick recorded: `created`, `posted`, `skipped` or `refused`
    (`states.TickOutcome`). Call it once the tick's row is committed, not for a tick found
    already recorded."""
    count("agenttasks_schedule_ticks_total", outcome=str(outcome))


def spent(run: Run, usage: Mapping | None) -> dict[str, float]:
    """Return the tokens one execution of `run` spent, by kind, from its outcome's usage.

    A chat run reports its window's running totals (snake_case keys), which a resumed run
    carries over: what it had recorded when claimed is subtracted. A callable run reports the
    usage of its reply (camelCase keys).
    """
    usage = usage or {}
    if "prompt_tokens" in usage:
        return {
            "input": (usage.get("prompt_tokens") or 0) - run.prompt_tokens,
            "output": (usage.get("completion_tokens") or 0) - run.completion_tokens,
            "total": (usage.get("total_tokens") or 0) - run.total_tokens,
        }
    return {
        "input": usage.get("inputTokens") or 0,
        "output": usage.get("outputTokens") or 0,
        "total": usage.get("totalTokens") or 0,
    }


def record_run(run: Run, outcome: str, seconds: float, usage: Mapping | None) -> None:
    """Count one execution's ending: its duration in the histogram, and the tokens it spent."""
    try:
        rows = _run_rows(run, outcome, seconds, usage)
    except Exception:  # a malformed usage never costs the run its ending
        logger.warning("metrics.run_failed run=%s", run.id, exc_info=True)
        return
    increment(rows)


def _observed(name: str, labels: dict[str, str], seconds: float) -> list:
    """The counter rows of one observation in a histogram: its bucket, its sum, its count."""
    bounds = zip(DURATION_BUCKETS, BUCKET_LABELS, strict=False)  # "+Inf" has no bound
    bucket = next((label for bound, label in bounds if seconds <= bound), "+Inf")
    return [
        (f"{name}_bucket", {**labels, "le": bucket}, 1),
        (f"{name}_sum", labels, seconds),
        (f"{name}_count", labels, 1),
    ]


def record_claims(runs: Iterable[Run], now) -> None:
    """Count how long each claimed run waited in the queue: from when it was queued, or from
    its delayed start when it had one."""
    rows = []
    for run in runs:
        since = max(run.queued_at, run.not_before) if run.not_before else run.queued_at
        waited = max(0.0, (now - since).total_seconds())
        rows.extend(_observed(QUEUE_WAIT, {"trigger": run.trigger}, waited))
    increment(rows)


def _run_rows(run: Run, outcome: str, seconds: float, usage: Mapping | None) -> list:
    rows = _observed(DURATION, {"agent": run.agent, "outcome": outcome}, seconds)
    for kind, amount in spent(run, usage).items():
        rows.append(("agenttasks_tokens_total", {"agent": run.agent, "kind": kind}, max(amount, 0)))
    return rows


def tasks_by_status() -> dict[str, int]:
    """Count tasks by status: from the trigger-kept counts on PostgreSQL (a scrape never reads
    the task table), by counting elsewhere."""
    if connection.vendor == "postgresql":
        kept = TaskCount.objects.order_by().values_list("status").annotate(n=Sum("n"))
        return {status: int(n) for status, n in kept if n}
    counted = Task.objects.order_by().values_list("status").annotate(n=Count("pk"))
    return {status: int(n) for status, n in counted}


def lease_expired_count(cutoff) -> int:
    """Count `Run.objects.lease_expired(cutoff)` in two index-only reads (an OR across columns
    would read every running run's row)."""
    running = Run.objects.filter(status=RunStatus.RUNNING)
    silent = running.filter(heartbeat_at__lt=cutoff).count()
    return silent + running.filter(heartbeat_at__isnull=True, started_at__lt=cutoff).count()


class _Collector:
    """Read every figure from the database when scraped."""

    def collect(self):
        now = timezone.now()
        tasks = GaugeMetricFamily("agenttasks_tasks", "Tasks by status.", labels=["status"])
        by_status = tasks_by_status()
        for status in TaskStatus.values:
            tasks.add_metric([status], by_status.get(status, 0))
        yield tasks

        queued = Run.objects.filter(status=RunStatus.QUEUED).aggregate(
            n=Count("*"), oldest=Min("queued_at")
        )
        yield GaugeMetricFamily("agenttasks_runs_queued", "Runs queued.", value=queued["n"])
        oldest = queued["oldest"]
        yield GaugeMetricFamily(
            "agenttasks_oldest_queued_run_seconds",
            "Age of the oldest queued run (0 when none).",
            value=0 if oldest is None else max(0.0, (now - oldest).total_seconds()),
        )
        cutoff = now - timedelta(seconds=app_settings.LEASE_TIMEOUT)
        yield GaugeMetricFamily(
            "agenttasks_runs_lease_expired",
            "Running runs whose heartbeat is older than LEASE_TIMEOUT.",
            value=lease_expired_count(cutoff),
        )
        yield from _queue_shares(now)
        yield from _slots(cutoff)
        yield GaugeMetricFamily(
            "agenttasks_schedules_active",
            "Schedules ticking on their clock (not paused).",
            value=Schedule.objects.filter(paused_at__isnull=True).count(),
        )
        yield from _counters(Counter.objects.values_list("name", "labels", "value"))


def _queue_shares(now):
    """The runs waiting for a delayed start, and the queued runs of the owners with the most."""
    yield GaugeMetricFamily(
        "agenttasks_runs_delayed",
        "Queued runs waiting for a delayed start (not_before).",
        value=Run.objects.not_due(now).count(),
    )
    yield GaugeMetricFamily(
        "agenttasks_runs_parked",
        "Queued runs parked until their turn at their provider (PARK_AFTER).",
        value=Run.objects.not_due(now).filter(limited_since__isnull=False).count(),
    )
    by_owner = GaugeMetricFamily(
        "agenttasks_runs_queued_by_owner",
        f"Queued runs of the {TOP_OWNERS} owners with the most (anonymous: the empty owner).",
        labels=["owner"],
    )
    owners = (
        Run.objects.filter(status=RunStatus.QUEUED)
        .values_list("conversation__owner_id")
        .annotate(n=Count("pk"))
        .order_by("-n")[:TOP_OWNERS]
    )
    for owner, n in owners:
        by_owner.add_metric(["" if owner is None else str(owner)], n)
    yield by_owner


def _slots(seen_since):
    """Each node's slots, runs in flight and free slots, from its live worker processes."""
    nodes = (
        WorkerProcess.objects.filter(seen_at__gte=seen_since)
        .order_by("node")
        .values_list("node")
        .annotate(slots=Sum("slots"), busy=Sum("busy"))
    )
    slots = GaugeMetricFamily(
        "agenttasks_worker_slots", "Slots of the live worker processes.", labels=["node"]
    )
    in_flight = GaugeMetricFamily(
        "agenttasks_runs_in_flight", "Runs the worker processes hold.", labels=["node"]
    )
    free = GaugeMetricFamily(
        "agenttasks_worker_slots_free", "Slots free for another run.", labels=["node"]
    )
    for node, total, busy in nodes:
        slots.add_metric([node], total)
        in_flight.add_metric([node], busy)
        free.add_metric([node], max(total - busy, 0))
    yield from (slots, in_flight, free)


def _counters(rows):
    values: dict[str, list[tuple[dict, float]]] = defaultdict(list)
    for name, labels, value in rows:
        values[name].append((_parse(labels), value))
    for name, help_text in COUNTERS.items():
        label_names = sorted({key for labels, _ in values[name] for key in labels})
        family = CounterMetricFamily(name.removesuffix("_total"), help_text, labels=label_names)
        if name == "agenttasks_orphans_failed_total" and not values[name]:
            family.add_metric([], 0)
        for labels, value in values[name]:
            family.add_metric([labels.get(key, "") for key in label_names], value)
        yield family
    for name, (help_text, label_names) in HISTOGRAMS.items():
        yield _histogram(values, name, help_text, label_names)


def _histogram(values, name: str, help_text: str, label_names: list[str]) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, help_text, labels=label_names)
    buckets: dict[tuple, dict[str, float]] = defaultdict(dict)
    for labels, value in values[f"{name}_bucket"]:
        buckets[tuple(labels[k] for k in label_names)][labels["le"]] = value
    sums = {tuple(lb[k] for k in label_names): v for lb, v in values[f"{name}_sum"]}
    for key in sorted(set(buckets) | set(sums)):
        running, cumulative = 0.0, []
        for bound in BUCKET_LABELS:
            running += buckets[key].get(bound, 0)
            cumulative.append((bound, running))
        family.add_metric(list(key), cumulative, sums.get(key, 0))
    return family


def exposition(accept: str = "") -> tuple[bytes, str]:
    """Render every metric in the format the `Accept` header asks for; return it and its type."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector())
    encoder, content_type = choose_encoder(accept)
    return encoder(registry), content_type
