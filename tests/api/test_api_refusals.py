"""A refusal carries its code and its data; each surface words it in one place of its own.

Python reads `str(exc)` (the stored statuses), the model tools `task_tools.model_text` (the
model's words), REST, A2A, MCP and the admin `toolkit.errors.refusal` (docs/rest.md#errors).
"""

import inspect

import pytest

from agenttasks import exceptions
from agenttasks.runtime.task_tools import model_text
from agenttasks.toolkit import errors

SAMPLES = {
    exceptions.TaskNotFound: lambda: exceptions.TaskNotFound("task_1"),
    exceptions.RunNotFound: lambda: exceptions.RunNotFound(),
    exceptions.ConversationNotFound: lambda: exceptions.ConversationNotFound("conv_1"),
    exceptions.ActionNotFound: lambda: exceptions.ActionNotFound(),
    exceptions.DepthLimit: lambda: exceptions.DepthLimit(1),
    exceptions.TaskLimit: lambda: exceptions.TaskLimit(5),
    exceptions.ActiveTaskLimit: lambda: exceptions.ActiveTaskLimit(3),
    exceptions.NotRetryable: lambda: exceptions.NotRetryable("running", task_id="task_1"),
    exceptions.RetryLimit: lambda: exceptions.RetryLimit(3, task_id="task_1", attempt=3),
    exceptions.RetryConflict: lambda: exceptions.RetryConflict(),
    exceptions.AlreadyFinal: lambda: exceptions.AlreadyFinal("completed", task_id="task_1"),
    exceptions.TaskBusy: lambda: exceptions.TaskBusy("running", task_id="task_1"),
    exceptions.ActionPending: lambda: exceptions.ActionPending(["act_1"], task_id="task_1"),
    exceptions.ConversationBusy: lambda: exceptions.ConversationBusy("conv_1", run_id="run_1"),
    exceptions.ActionResolved: lambda: exceptions.ActionResolved.settled("act_1", "approved"),
    exceptions.SpawnError: lambda: exceptions.SpawnError.no_parent(),
    exceptions.LaunchFailed: lambda: exceptions.LaunchFailed.spawn("broker down"),
    exceptions.StoreError: lambda: exceptions.StoreError.listing_live("gone"),
    exceptions.ScheduleNotFound: lambda: exceptions.ScheduleNotFound("sched_1"),
    exceptions.InvalidField: lambda: exceptions.InvalidField("label is too long", "label"),
    exceptions.InvalidSchedule: lambda: exceptions.InvalidSchedule("Invalid cron", "cron"),
    exceptions.RunNotWaiting: lambda: exceptions.RunNotWaiting("run_1"),
}


# Refusals REST words as Python does (the contract gives them no words of REST's own).
PYTHONS_WORDS = {
    exceptions.RunNotFound,
    exceptions.ActionNotFound,
    exceptions.DepthLimit,
    exceptions.SpawnError,
}


def test_every_domain_error_has_a_sample_here():
    refusals = {
        cls
        for _, cls in inspect.getmembers(exceptions, inspect.isclass)
        if issubclass(cls, exceptions.TaskError) and cls is not exceptions.TaskError
    }
    assert refusals == set(SAMPLES)


@pytest.mark.parametrize("cls", list(SAMPLES), ids=lambda cls: cls.__name__)
def test_the_one_handler_maps_every_refusal_with_its_status_and_code(cls):
    exc = SAMPLES[cls]()
    answer = errors.translate(exc, {})
    if exc.status_code >= 500:
        assert answer is None  # a fault: the handler logs it and answers a bare 500
        return
    assert (answer.status, answer.code) == (exc.status_code, exc.code)
    if cls in PYTHONS_WORDS:
        assert answer.message == str(exc)
    else:
        assert not answer.message.startswith("tasks:"), answer.message


def test_one_refusal_in_the_words_of_each_surface():
    busy = exceptions.TaskBusy("running", task_id="task_1")
    assert str(busy) == "tasks: task is running"
    assert model_text(busy) == "tasks: task is working"
    rest = errors.refusal(busy)
    assert (rest.status, rest.code, rest.message, rest.details) == (
        409,
        "task_busy",
        "Task task_1 is running; wait for it to finish or cancel it",
        {"status": "running"},
    )


def test_a_not_found_names_what_was_not_found():
    assert errors.refusal(exceptions.TaskNotFound("task_1")).message == "Task not found: task_1"
    assert (
        errors.refusal(exceptions.ConversationNotFound("conv_1")).message
        == "Conversation not found: conv_1"
    )
    assert str(exceptions.TaskNotFound("task_1")) == "tasks: not found"  # Python's words


@pytest.mark.parametrize("cls", [exceptions.TaskBusy, exceptions.NotRetryable])
def test_a_delegate_is_refused_as_driven_by_its_caller(cls):
    rest = errors.refusal(cls("running", task_id="task_1", delegate=True))
    assert rest.message == "Task task_1 is a delegate task; it is driven by its caller"
    assert rest.details == {"status": "running"}
