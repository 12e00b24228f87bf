"""Signals of the task lifecycle, sent after commit with the snapshot the winning write used.

- `task_updated(sender, task)`: after every won store operation and after spawn/retry/stop.
- `task_finished(sender, snapshot)`: after a won `completed` or `failed` ending.
- `result_delivered(sender, snapshot)`: after a won cancellation and after a consumed result.

Receivers must not re-read the task to decide: a retry may already have moved the row.
"""

from django.dispatch import Signal

task_updated = Signal()
task_finished = Signal()
result_delivered = Signal()
