"""Hooks the lifecycle tests register in AGENTTASKS["CONTINUE"].

`sequence` answers from `script`, a list each test fills: an item is a `Continuation`, `None`,
an exception to raise, or a callable `(task, outcome) -> answer` (for hooks that act while
asked). When the script runs out it answers `fallback` (a value or such a callable). Every
question is recorded in `calls`. `reset()` restores the defaults between tests.
"""

from agenttasks.types import Continuation

script: list = []
fallback = None
calls: list[dict] = []


def reset() -> None:
    """Forget the script, the fallback and the recorded calls."""
    global fallback
    script.clear()
    calls.clear()
    fallback = None


def sequence(task, outcome):
    """CONTINUE hook for the kind `sequence`: answer the next scripted item."""
    calls.append(
        {
            "task_id": task.id,
            "run_id": outcome.run_id,
            "status": outcome.status,
            "text": outcome.text,
            "state": task.state,
            "continuations": task.continuations,
        }
    )
    answer = script.pop(0) if script else fallback
    if callable(answer) and not isinstance(answer, Continuation):
        answer = answer(task, outcome)
    if isinstance(answer, BaseException):
        raise answer
    return answer
