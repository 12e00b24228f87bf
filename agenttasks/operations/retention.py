"""Retention: prune what is past its age, in short transactions (docs/lifecycle.md#retention).

A daily django-q2 schedule (`agenttasks retention`, installed by every worker as it starts) and
`manage.py agenttasks_prune [--dry-run]` run `prune()`:

- every finished conversation tree older than RETENTION["finished_days"], whatever created it,
  with its events, runs, tasks, results, comments, wake-ups, actions and files (the bytes too);
- files past their agent's `retentionDays`;
- expired idempotency keys;
- the schedules' tick rows older than RETENTION["finished_days"];
- django-q2's failure rows older than RETENTION["failures_days"];
- the rows of worker processes that died without removing theirs (SIGKILL, a lost machine).

Every transaction deletes at most BATCH rows, so none holds its locks for long. A tree is marked
`deleting` before its rows go (so no new work starts there), and checked again after the mark.
"""

import functools
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db import connection, models, transaction
from django.utils import timezone

from ..broker import queue
from ..conf import app_settings
from ..models import (
    Comment,
    Conversation,
    Event,
    File,
    IdempotencyKey,
    PendingAction,
    Run,
    ScheduleTick,
    Task,
    TaskResult,
    Wakeup,
    WorkerProcess,
)
from ..states import TERMINAL, WakeupState
from ..store import deletion, files

logger = logging.getLogger(__name__)

BATCH = 1000  # rows per transaction, at most
# The models whose rows a tree's prune deletes (or clears) itself, in order.
KNOWN = {Comment, Conversation, Event, File, PendingAction, Run, Task, TaskResult, Wakeup}
ROOTS = 200  # trees looked at together
DEAD_WORKER_AGE = timedelta(hours=1)  # a process row not rewritten for this long is a dead one's
SCHEDULE_NAME = "agenttasks retention"


@dataclass
class Report:
    """What a prune did (or, dry, would do), and how its transactions went."""

    dry_run: bool = False
    trees: int = 0
    rows: dict[str, int] = field(default_factory=dict)
    batches: int = 0
    largest_batch: int = 0
    slowest_batch: float = 0.0

    def add(self, table: str, count: int) -> None:
        self.rows[table] = self.rows.get(table, 0) + count

    def lines(self) -> list[str]:
        verb = "would delete" if self.dry_run else "deleted"
        out = [f"finished trees {verb}: {self.trees}"]
        out += [f"  {table} {verb}: {count}" for table, count in sorted(self.rows.items())]
        if not self.dry_run:
            out.append(
                f"batches: {self.batches}, largest {self.largest_batch} rows, "
                f"slowest {self.slowest_batch:.3f} s"
            )
        return out


def settings() -> dict:
    """RETENTION merged over its defaults."""
    return app_settings.RETENTION


def prune(
    *, dry_run: bool = False, now: datetime | None = None, finished_days: float | None = None
) -> Report:
    """Prune everything past its age (the schedule's job and the command's).

    `finished_days` replaces RETENTION["finished_days"] for this call (0 prunes every finished
    tree).
    """
    now = now or timezone.now()
    rules = settings()
    days = rules["finished_days"] if finished_days is None else finished_days
    report = Report(dry_run=dry_run)
    _prune_trees(now - timedelta(days=days), report)
    _prune_expired_files(now, report)
    _prune_idempotency_keys(now - timedelta(hours=rules["idempotency_hours"]), report)
    _prune_ticks(now - timedelta(days=days), report)
    _prune_failures(now - timedelta(days=rules["failures_days"]), report)
    _prune_dead_workers(now - DEAD_WORKER_AGE, report)
    logger.info("retention.pruned dry_run=%s trees=%d rows=%s", dry_run, report.trees, report.rows)
    return report


def run() -> list[str]:
    """Prune, as the daily django-q2 schedule; return the report's lines."""
    return prune().lines()


# --- batches ---------------------------------------------------------------------------------


def _batch(report: Report, work: Callable[[], dict[str, int]]) -> None:
    """Run one transaction of deletes (at most BATCH rows), timing it."""
    begun = time.monotonic()
    with transaction.atomic():
        counts = work()
    seconds = time.monotonic() - begun
    size = sum(counts.values())
    report.batches += 1
    report.largest_batch = max(report.largest_batch, size)
    report.slowest_batch = max(report.slowest_batch, seconds)
    for table, count in counts.items():
        report.add(table, count)


def _raw_delete(model: type[models.Model], ids: Sequence) -> int:
    """DELETE the rows by primary key (their known dependents went first; others go now)."""
    if not ids:
        return 0
    _settle_other_dependents(model, ids)
    table, pk = model._meta.db_table, model._meta.pk.column
    placeholders = ", ".join(["%s"] * len(ids))
    with connection.cursor() as cursor:
        cursor.execute(f"DELETE FROM {table} WHERE {pk} IN ({placeholders})", list(ids))
        return cursor.rowcount


def _settle_other_dependents(model: type[models.Model], ids: Sequence) -> None:
    """Apply on_delete for rows of models this module does not prune itself (another app's)."""
    for relation in model._meta.related_objects:
        related = relation.related_model
        if related in KNOWN or not getattr(relation, "field", None) or relation.many_to_many:
            continue
        rows = related._base_manager.filter(**{f"{relation.field.name}__in": list(ids)})
        if relation.on_delete is models.SET_NULL:
            rows.update(**{relation.field.name: None})
        elif relation.on_delete is not models.DO_NOTHING:
            rows.delete()


def _chunks(items: Sequence, size: int = BATCH) -> Iterable[Sequence]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _delete_rows(report: Report, model: type[models.Model], queryset, label: str) -> None:
    """Delete every row of `queryset` (or, dry, count them), BATCH per transaction."""
    ids = list(queryset.values_list("pk", flat=True))
    if report.dry_run:
        report.add(label, len(ids))
        return
    for chunk in _chunks(ids):
        _batch(report, functools.partial(_delete_labelled, label, model, chunk))


# --- finished trees --------------------------------------------------------------------------


def _old_roots(cutoff: datetime) -> Iterable[list[str]]:
    """Roots of trees past their age, ROOTS at a time.

    A tree whose root is a task's conversation is as old as that task's ending (`finished_at`);
    any other root (a chat conversation) as its last activity (`updated_at`).
    """
    finished = Task.objects.visible().filter(
        status__in=TERMINAL, finished_at__lt=cutoff, conversation__parent__isnull=True
    )
    idle = Conversation.objects.visible().filter(
        parent__isnull=True, updated_at__lt=cutoff, task__isnull=True
    )
    for queryset, column in ((finished, "conversation_id"), (idle, "pk")):
        after = ""
        while True:
            roots = list(
                queryset.filter(**{f"{column}__gt": after})
                .order_by(column)
                .values_list(column, flat=True)[:ROOTS]
            )
            if not roots:
                break
            after = roots[-1]
            yield roots


def _prune_trees(cutoff: datetime, report: Report) -> None:
    """Delete every finished conversation tree past its age."""
    for roots in _old_roots(cutoff):
        trees = _finished(_trees(roots))
        if not trees:
            continue
        if report.dry_run:
            _count_trees(trees, report)
            continue
        trees = _mark(trees)
        order = [c for tree in trees.values() for c in reversed(tree)]  # children first
        _delete_trees(order, report)
        report.trees += len(trees)


def _trees(roots: list[str]) -> dict[str, list[str]]:
    """Each root's tree, root first, over live edges (as store.conversation_tree)."""
    trees = {root: [root] for root in roots}
    owner = {root: root for root in roots}
    edges = Task.objects.tree_edges().only("parent_conversation_id", "conversation_id")
    for level in edges.levels_below(roots):
        for edge in level:
            parent = str(edge.parent_conversation_id)  # reached from it: never None
            owner[edge.conversation_id] = owner[parent]
            trees[owner[edge.conversation_id]].append(edge.conversation_id)
    return trees


def _busy(ids: list[str]) -> set[str]:
    """The conversations among `ids` being deleted, or with work or debt still open."""
    busy: set[str] = set()
    for chunk in _chunks(ids):
        busy.update(
            Conversation.objects.being_deleted().filter(pk__in=chunk).values_list("pk", flat=True)
        )
        busy.update(
            Run.objects.unfinished()
            .filter(conversation_id__in=chunk)
            .values_list("conversation_id", flat=True)
        )
        busy.update(
            Task.objects.live()
            .filter(conversation_id__in=chunk)
            .values_list("conversation_id", flat=True)
        )
        busy.update(
            Wakeup.objects.filter(conversation_id__in=chunk, state=WakeupState.PENDING).values_list(
                "conversation_id", flat=True
            )
        )
    return busy


def _finished(trees: dict[str, list[str]]) -> dict[str, list[str]]:
    busy = _busy([c for tree in trees.values() for c in tree])
    return {root: tree for root, tree in trees.items() if not busy.intersection(tree)}


def _mark(trees: dict[str, list[str]]) -> dict[str, list[str]]:
    """Mark the trees deleting (no new work starts there); keep those still finished after."""
    now = timezone.now()
    ids = [c for tree in trees.values() for c in tree]
    # Work that started between the check and the mark: leave that tree alone.
    marked: set[str] = set()
    for chunk in _chunks(ids):
        marked.update(deletion.mark_expired(list(chunk), now))
    active: set[str] = set()
    for chunk in _chunks(ids):
        active.update(
            Run.objects.unfinished()
            .filter(conversation_id__in=chunk)
            .values_list("conversation_id", flat=True)
        )
    kept: dict[str, list[str]] = {}
    released: list[str] = []
    for root, tree in trees.items():
        if active.intersection(tree) or not marked.issuperset(tree):
            released.extend(c for c in tree if c in marked)
        else:
            kept[root] = tree
    for chunk in _chunks(released):
        deletion.release_marks(list(chunk), now)
    return kept


def _rows_of(conversations: list[str]) -> list[tuple[str, type[models.Model], models.QuerySet]]:
    """The rows of these conversations, dependents before what they depend on."""
    tasks = Task.objects.filter(conversation_id__in=conversations)
    return [
        ("events", Event, Event.objects.filter(conversation_id__in=conversations)),
        ("comments", Comment, Comment.objects.filter(task__in=tasks)),
        ("task results", TaskResult, TaskResult.objects.filter(task__in=tasks)),
        (
            "wake-ups",
            Wakeup,
            Wakeup.objects.filter(
                models.Q(conversation_id__in=conversations) | models.Q(task__in=tasks)
            ),
        ),
        ("actions", PendingAction, PendingAction.objects.filter(conversation_id__in=conversations)),
    ]


def _count_trees(trees: dict[str, list[str]], report: Report) -> None:
    conversations = [c for tree in trees.values() for c in tree]
    report.trees += len(trees)
    for chunk in _chunks(conversations):
        for label, _, queryset in _rows_of(list(chunk)):
            report.add(label, queryset.count())
        report.add("files", File.objects.filter(conversation_id__in=chunk).count())
        report.add("tasks", Task.objects.filter(conversation_id__in=chunk).count())
        report.add("runs", Run.objects.filter(conversation_id__in=chunk).count())
        report.add("conversations", len(chunk))


def _delete_trees(order: list[str], report: Report) -> None:
    """Delete the rows of marked trees (children's conversations first), BATCH per transaction."""
    for chunk in _chunks(order):
        for label, model, queryset in _rows_of(list(chunk)):
            _delete_rows(report, model, queryset, label)
        _delete_files(File.objects.filter(conversation_id__in=chunk), report)
    # Nothing may point at a run that goes in another transaction.
    for chunk in _chunks(order):
        runs = Run.objects.filter(conversation_id__in=chunk, counted_in__isnull=False)
        for ids in _chunks(list(runs.values_list("pk", flat=True))):
            _batch(report, functools.partial(_clear_counted_in, ids))
    _delete_tasks_and_runs(order, report)
    for chunk in _chunks(order):
        _batch(report, functools.partial(_delete_labelled, "conversations", Conversation, chunk))


def _delete_labelled(label: str, model: type[models.Model], ids: Sequence) -> dict[str, int]:
    return {label: _raw_delete(model, ids)}


def _delete_failures(ids: list) -> dict[str, int]:
    return {"django-q2 failures": queue.delete_failures(ids)}


def _clear_counted_in(ids: Sequence[str]) -> dict[str, int]:
    Run.objects.filter(pk__in=ids).update(counted_in=None)
    return {}  # an update, not a deletion


def _delete_tasks_and_runs(order: list[str], report: Report) -> None:
    """Delete each conversation's tasks with their runs, packing transactions up to BATCH rows."""
    pending_tasks: list[str] = []
    pending_runs: list[str] = []

    def flush():
        if not pending_runs and not pending_tasks:
            return
        tasks, runs = list(pending_tasks), list(pending_runs)
        _batch(
            report,
            lambda: {"tasks": _raw_delete(Task, tasks), "runs": _raw_delete(Run, runs)},
        )
        pending_tasks.clear()
        pending_runs.clear()

    for chunk in _chunks(order, 100):
        runs_by_conversation: dict[str, list[str]] = {}
        for run_id, conversation_id in Run.objects.filter(conversation_id__in=chunk).values_list(
            "pk", "conversation_id"
        ):
            runs_by_conversation.setdefault(conversation_id, []).append(run_id)
        tasks_by_conversation = dict(
            Task.objects.filter(conversation_id__in=chunk).values_list("conversation_id", "pk")
        )
        for conversation_id in chunk:  # children first, as `order` is
            runs = runs_by_conversation.get(conversation_id, [])
            task = tasks_by_conversation.get(conversation_id)
            if task is None:
                for ids in _chunks(runs):  # a chat conversation's runs, on their own
                    if len(pending_runs) + len(ids) > BATCH:
                        flush()
                    pending_runs.extend(ids)
                continue
            if len(pending_tasks) + len(pending_runs) + 1 + len(runs) > BATCH:
                flush()
            pending_tasks.append(task)
            pending_runs.extend(runs)  # a task goes with its runs (their FKs point both ways)
    flush()


def _delete_files(queryset, report: Report) -> None:
    """Delete file rows in batches; their bytes go once each batch commits."""
    rows = list(queryset.values_list("pk", "storage_name"))
    if report.dry_run:
        report.add("files", len(rows))
        return
    for chunk in _chunks(rows):

        def work(chunk=chunk):
            deleted = _raw_delete(File, [pk for pk, _ in chunk])
            files.remove_stored([name for _, name in chunk])
            return {"files": deleted}

        _batch(report, work)


# --- the rest --------------------------------------------------------------------------------


def _prune_expired_files(now: datetime, report: Report) -> None:
    _delete_files(files.expired(now), report)


def _prune_idempotency_keys(cutoff: datetime, report: Report) -> None:
    """Delete idempotency keys past their IDEMPOTENCY_TTL or older than `idempotency_hours`."""
    queryset = IdempotencyKey.objects.filter(
        models.Q(expires_at__lt=timezone.now()) | models.Q(created_at__lt=cutoff)
    )
    _delete_rows(report, IdempotencyKey, queryset, "idempotency keys")


def _prune_ticks(cutoff: datetime, report: Report) -> None:
    """Delete the schedules' tick rows that fired before `cutoff` (a tick long past cannot come
    due again, so its row guards nothing)."""
    queryset = ScheduleTick.objects.filter(created_at__lt=cutoff)
    _delete_rows(report, ScheduleTick, queryset, "schedule ticks")


def _prune_failures(cutoff: datetime, report: Report) -> None:
    """Delete django-q2's failure rows stopped before `cutoff`."""
    while True:
        ids = queue.old_failures(cutoff, BATCH)
        if report.dry_run:
            report.add("django-q2 failures", len(queue.old_failures(cutoff, 10**9)))
            return
        if not ids:
            return
        _batch(report, functools.partial(_delete_failures, ids))


def _prune_dead_workers(cutoff: datetime, report: Report) -> None:
    """Delete the rows of worker processes last seen before `cutoff`: a live process rewrites
    its row every HEARTBEAT_INTERVAL, and one that stops deletes it; a killed one cannot."""
    queryset = WorkerProcess.objects.filter(seen_at__lt=cutoff)
    _delete_rows(report, WorkerProcess, queryset, "dead worker processes")
