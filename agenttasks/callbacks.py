"""Outbound callbacks: one POST per ending to the task's callbackUrl, after commit."""

from . import queue

NOTIFIED = ("completed", "failed", "waiting_for_input", "cancelled")


def schedule(task, status: str) -> None:
    """Queue the callback of a task entering `status`, if it has a callback URL."""
    if task.callback_url and status in NOTIFIED:
        queue.enqueue_job("agenttasks.callbacks.send", task.id, status)
