"""The transition table: reachability, terminal exits, and the model-facing names."""

from collections import deque

import pytest

from agenttasks import states
from agenttasks.states import LIVE, TERMINAL, TRANSITIONS, TaskStatus, model_status


def test_every_state_is_reachable_from_creation():
    reached, queue = set(), deque([None])
    while queue:
        src = queue.popleft()
        for frm, dst in TRANSITIONS:
            if frm == src and dst not in reached:
                reached.add(dst)
                queue.append(dst)
    assert reached == set(TaskStatus.values)


def test_terminal_states_leave_only_to_pending():
    exits = {(frm, dst) for frm, dst in TRANSITIONS if frm in TERMINAL}
    assert exits == {(s, TaskStatus.PENDING) for s in TERMINAL}
    assert not states.is_allowed(TaskStatus.COMPLETED, TaskStatus.RUNNING)
    assert not states.is_allowed(TaskStatus.CANCELLED, TaskStatus.FAILED)


def test_every_live_state_can_end_every_way():
    for src in LIVE:
        for dst in TERMINAL:
            assert states.is_allowed(src, dst)


def test_waiting_only_resumes_to_pending():
    out = {dst for frm, dst in TRANSITIONS if frm == TaskStatus.WAITING_FOR_INPUT}
    assert out == {TaskStatus.PENDING} | TERMINAL


def test_live_and_terminal_partition_the_statuses():
    assert LIVE | TERMINAL == set(TaskStatus.values)
    assert not LIVE & TERMINAL


def test_model_facing_names():
    assert [model_status(s) for s in TaskStatus.values] == [
        "working",
        "working",
        "input_required",
        "completed",
        "failed",
        "cancelled",
    ]


def test_the_store_refuses_a_change_the_table_forbids():
    from agenttasks.exceptions import TransitionError
    from agenttasks.models import Task
    from agenttasks.store.rows import set_status

    task = Task(status=TaskStatus.COMPLETED)
    with pytest.raises(TransitionError, match="completed -> running is not an allowed transition"):
        set_status(task, TaskStatus.RUNNING)
    assert task.status == TaskStatus.COMPLETED
    set_status(task, TaskStatus.PENDING)  # a re-opening comment
    assert task.status == TaskStatus.PENDING


def test_every_stop_reason_is_the_contracts():
    """Each StopReason is one of the words docs/lifecycle.md gives `stop_reason`, verbatim."""
    from pathlib import Path

    from agenttasks.states import StopReason

    doc = (Path(__file__).resolve().parent.parent / "docs" / "lifecycle.md").read_text()
    (row,) = [line for line in doc.splitlines() if line.startswith("| `status`, `stop_reason` |")]
    assert [r for r in StopReason.values if r and f"`{r}`" not in row] == []
