"""Per-agent deadlines: a run that executes longer than its agent's timeout fails.

The worker's heartbeat thread watches the deadline of every run its process executes
(`runtime.driver`). At the deadline it ends the run and its task `failed` with
`Timed out after <n> s` (with the callback and the parent's wake-up, like any failure) and tells
the runtime to stop now; the runtime's late ending then loses its compare-and-set. django-q2's own
`timeout` is the last resort: when it strikes first, the run fails saying so (docs/lifecycle.md).
"""

import logging

from django.conf import settings

from . import lifecycle, registry, store, wakeups
from .conf import app_settings
from .models import Run
from .states import StopReason, TaskStatus
from .types import Ending, RunOutcome

logger = logging.getLogger(__name__)

KILLED_TEXT = (
    "Stopped by django-q2 after its timeout of {seconds} s (Q_CLUSTER['timeout']), "
    "before the agent's own deadline"
)


def timeout_text(seconds: float) -> str:
    """The error of a run stopped at its deadline."""
    return f"Timed out after {format(seconds, 'g')} s"


def q_timeout() -> float | None:
    """django-q2's `timeout` (seconds), when one is set."""
    seconds = (getattr(settings, "Q_CLUSTER", None) or {}).get("timeout")
    return seconds if isinstance(seconds, (int, float)) and seconds > 0 else None


def killed_text() -> str:
    """The error of a run that django-q2 stopped at its own timeout."""
    seconds = q_timeout()
    return KILLED_TEXT.format(seconds="?" if seconds is None else format(seconds, "g"))


def timeout_of(agent_id: str) -> float:
    """Seconds a run of `agent_id` may execute (DEFAULT_TIMEOUT for an unknown agent)."""
    try:
        return registry.get(agent_id).timeout
    except registry.UnknownAgent:
        return app_settings.DEFAULT_TIMEOUT


def fail(run: Run, error: str) -> bool:
    """End a running run and its task `failed` with `error`; whether this call ended it."""
    outcome = RunOutcome(run.id, TaskStatus.FAILED, error=error, append_message=False)
    if run.task_id is None:
        if store.record_run_end(run.id, outcome) is None:
            return False
        wakeups.schedule_delivery(run.conversation_id)
        return True
    ending = Ending(TaskStatus.FAILED, summary=error, error=error, reason=StopReason.TIMED_OUT)
    ended = store.end(run.task_id, run.id, ending, outcome=outcome)
    if ended.task is not None:
        lifecycle.announce(ended.task)
    logger.info("deadline.reached run=%s task=%s error=%r", run.id, run.task_id, error)
    return ended.recorded or ended.task is not None
