"""Per-agent deadlines: a run that executes longer than its agent's timeout fails.

The worker's heartbeat thread watches the deadline of every run its process executes
(`runtime.driver`). At the deadline `lifecycle.end_at_deadline` ends the run and its task
`failed` with `Timed out after <n> s` (with the callback and the parent's wake-up, like any
failure) and the runtime is told to stop now; its late ending then loses its compare-and-set.
django-q2's own `timeout` is the last resort: when it strikes first, the run fails saying so
(docs/lifecycle.md). This module holds the texts and the timeouts.
"""

from django.conf import settings

from .. import registry
from ..conf import app_settings

KILLED_TEXT = (
    "Stopped by django-q2 after its timeout of {seconds} s (Q_CLUSTER['timeout']), "
    "before the agent's own deadline"
)


def timeout_text(seconds: float) -> str:
    """Return the error of a run stopped at its deadline."""
    return f"Timed out after {format(seconds, 'g')} s"


def q_timeout() -> float | None:
    """Return django-q2's `timeout` (seconds), when one is set."""
    seconds = (getattr(settings, "Q_CLUSTER", None) or {}).get("timeout")
    return seconds if isinstance(seconds, (int, float)) and seconds > 0 else None


def killed_text() -> str:
    """Return the error of a run that django-q2 stopped at its own timeout."""
    seconds = q_timeout()
    return KILLED_TEXT.format(seconds="?" if seconds is None else format(seconds, "g"))


def timeout_of(agent_id: str) -> float:
    """Return seconds a run of `agent_id` may execute (DEFAULT_TIMEOUT for an unknown agent)."""
    try:
        return registry.get(agent_id).timeout
    except registry.UnknownAgent:
        return app_settings.DEFAULT_TIMEOUT
