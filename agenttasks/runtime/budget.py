"""Budgets (docs/delegation.md#budgets): what a run may spend, counted per window.

A window is a run plus the runs that resume it after a pause; an inline child's spend counts in
its own window and, at once, in every caller window above it.
"""

import re
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..conf import app_settings

BUDGET_PATTERN = re.compile(r"^The max_(turns|tokens|tool_calls|wall_seconds) budget \(")


class BudgetExceeded(Exception):
    """A budget cut the run short; the message is the run's error (`... budget (...) was reached`)."""


def budget_message(limit: str, value, caller: str | None = None) -> str:
    """Return the sentence (docs/delegation.md#budget-messages) for a limit of this window (caller
    None) or of a calling agent's."""
    head = f"The {limit} budget ({format(value, 'g')})"
    return (
        f'{head} of the calling agent "{caller}" was reached' if caller else f"{head} was reached"
    )


class Window:
    """One budget window: what a run and, live, the inline children below it spent.

    The window of a run that resumes after a pause is the same run row, so it continues the
    totals recorded at the pause. Counters are guarded by a lock: parallel children add to
    their callers' windows from their own threads.
    """

    def __init__(
        self,
        *,
        run_id: str,
        agent_id: str,
        limits: dict,
        turns: int = 0,
        tool_calls: int = 0,
        prompt_tokens: int = 0,
        completion_tokens: int = 0,
        total_tokens: int = 0,
        seconds: float = 0.0,
    ):
        self.run_id = run_id
        self.agent_id = agent_id
        self.limits = limits
        self.turns = turns
        self.tool_calls = tool_calls
        self.prompt_tokens = prompt_tokens
        self.completion_tokens = completion_tokens
        self.total_tokens = total_tokens
        self.seconds = seconds
        self._started = time.monotonic()
        self._lock = threading.Lock()
        # Spend added live by the runs below, by the child run directly below this window, so
        # that absorbing that run later adds only what was not already counted.
        self._live: dict[str, list[int]] = {}

    @classmethod
    def for_run(cls, run, agent) -> "Window":
        return cls(
            run_id=run.id,
            agent_id=agent.id,
            limits={**app_settings.DEFAULT_BUDGET, **(agent.budget or {})},
            turns=run.turns,
            tool_calls=run.tool_calls,
            prompt_tokens=run.prompt_tokens,
            completion_tokens=run.completion_tokens,
            total_tokens=run.total_tokens,
            seconds=run.exec_seconds,
        )

    def wall(self) -> float:
        return self.seconds + (time.monotonic() - self._started)

    def usage(self) -> dict:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.total_tokens,
        }

    def add(self, *, turns=0, prompt=0, completion=0, total=0, tool_calls=0, via=None) -> None:
        """Count spend; `via` names the child run below when it comes from an inline child."""
        with self._lock:
            self.turns += turns
            self._add(prompt, completion, total, tool_calls)
            if via is not None:
                live = self._live.setdefault(via, [0, 0, 0, 0])
                for i, value in enumerate((prompt, completion, total, tool_calls)):
                    live[i] += value

    def absorb(self, run_id: str, prompt: int, completion: int, total: int, tool_calls: int):
        """Add a child run's not yet counted spend, less what its inline execution added live."""
        with self._lock:
            live = self._live.pop(run_id, [0, 0, 0, 0])
            spent = (prompt, completion, total, tool_calls)
            delta = [max(value - seen, 0) for value, seen in zip(spent, live, strict=True)]
            self._add(*delta)

    def _add(self, prompt, completion, total, tool_calls) -> None:
        self.prompt_tokens += prompt
        self.completion_tokens += completion
        self.total_tokens += total
        self.tool_calls += tool_calls

    def reached(self, *, turns: bool, calls: int | None = None, spent: bool = False) -> str:
        """Name the first limit this window has reached ('' when none).

        `calls` is the number of tool calls about to run (checkpoint B); `spent` asks whether
        anything at all is left for a subtask (tool calls at or above the limit).
        """
        limits = self.limits
        if turns and limits.get("max_turns") is not None and self.turns >= limits["max_turns"]:
            return "max_turns"
        if limits.get("max_tokens") is not None and self.total_tokens >= limits["max_tokens"]:
            return "max_tokens"
        max_calls = limits.get("max_tool_calls")
        if max_calls is not None:
            if calls is not None and self.tool_calls + calls > max_calls:
                return "max_tool_calls"
            if spent and self.tool_calls >= max_calls:
                return "max_tool_calls"
        wall = limits.get("max_wall_seconds")
        if wall is not None and self.wall() >= wall:
            return "max_wall_seconds"
        return ""

    def wall_left(self) -> float | None:
        wall = self.limits.get("max_wall_seconds")
        return None if wall is None else wall - self.wall()


class Budget:
    """A run's own window and its callers' windows above it (nearest first)."""

    def __init__(self, own: Window, callers: Sequence[Window] = ()):
        self.own = own
        self.callers = list(callers)

    def spend(self, *, turns=0, prompt=0, completion=0, total=0, tool_calls=0) -> None:
        """Count spend in the own window and, at once, in every caller window above it."""
        self.own.add(
            turns=turns, prompt=prompt, completion=completion, total=total, tool_calls=tool_calls
        )
        below = self.own
        for window in self.callers:
            window.add(
                prompt=prompt,
                completion=completion,
                total=total,
                tool_calls=tool_calls,
                via=below.run_id,
            )
            below = window

    def _first(self, **check) -> str:
        limit = self.own.reached(turns=check.pop("turns"), **check)
        if limit:
            return budget_message(limit, self.own.limits[limit])
        for window in self.callers:  # turns are never shared
            limit = window.reached(turns=False, **check)
            if limit:
                return budget_message(limit, window.limits[limit], window.agent_id)
        return ""

    def before_call(self) -> str:
        """Checkpoint A: the message of the first budget that forbids another model call."""
        return self._first(turns=True)

    def before_tools(self, calls: int) -> str:
        """Checkpoint B: the message of the first budget that forbids running `calls` tools."""
        return self._first(turns=True, calls=calls)

    def exhausted(self) -> str:
        """Say whether a subtask may still start: no tokens, tool calls or wall time left."""
        return self._first(turns=False, spent=True)

    def wall_reached(self) -> str:
        for window, caller in [(self.own, None)] + [(w, w.agent_id) for w in self.callers]:
            left = window.wall_left()
            if left is not None and left <= 0:
                return budget_message("max_wall_seconds", window.limits["max_wall_seconds"], caller)
        return ""

    def wall_deadline(self) -> tuple[float | None, str]:
        """Return the seconds left before the nearest wall budget runs out, and its message."""
        best, message = None, ""
        for window, caller in [(self.own, None)] + [(w, w.agent_id) for w in self.callers]:
            left = window.wall_left()
            if left is not None and (best is None or left < best):
                best = left
                message = budget_message(
                    "max_wall_seconds", window.limits["max_wall_seconds"], caller
                )
        return best, message


@dataclass
class CallerLink:
    """A caller above an inline child: its budget window and its stop flag (None when paused)."""

    window: Window
    flag: Any = None  # the caller's StopFlag; None while the caller is paused
