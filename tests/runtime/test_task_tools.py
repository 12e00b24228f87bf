"""The four model tools: docs/lifecycle.md#the-four-model-tools and scenarios 7.4 (tools called
with `call-1`).

Also the strict argument validation, the exact descriptions and schemas of the four tools, the
ownership rule and the attach rule (`attachable`).
"""

import json

import pytest
from django.conf import settings
from django.db import DatabaseError
from django.test import override_settings

from agenttasks import lifecycle, store
from agenttasks.exceptions import SpawnError
from agenttasks.models import Run, Task, Wakeup
from agenttasks.runtime.task_tools import (
    attachable,
    control_tools,
    describe,
    spawn_tool,
    task_tools,
    unnamed,
)
from agenttasks.types import NewTask, RunOutcome

from ..factories import ConversationFactory
from ..harness import finish, row

pytestmark = pytest.mark.django_db(transaction=True)

CALL = "call-1"
STILL_WORKING = " (still working — do not redo its work; you will be told when it finishes)"
HEADER = "task(s), newest first (task_status with the id fetches a full result):"


def agenttasks(**overrides):
    """override_settings for AGENTTASKS, keeping the suite's other keys."""
    return override_settings(AGENTTASKS={**getattr(settings, "AGENTTASKS", {}), **overrides})


def describe_verify(state) -> str:
    """DESCRIBE_STATE hook of scenario 7.4.7."""
    return "step 2/3 (verify) from " + json.dumps(state, separators=(",", ":"))


def tools(conversation, run=None) -> dict:
    return {tool.name: tool for tool in task_tools(conversation, run)}


def spawn(parent, parent_run=None, **kw) -> str:
    kw.setdefault("label", "job")
    return lifecycle.spawn(parent, "worker", "do it", parent_run=parent_run, **kw).task_id


def assert_tool_error(out, text):
    assert (out.text, out.is_error, out.display, out.details) == (text, True, None, None)


# --- 7.4 scenarios ---------------------------------------------------------------------------


def test_7_4_1_spawn_task_returns_at_once(parent, parent_run, recording_queue):
    out = tools(parent, parent_run)["spawn_task"].call(
        {"agent_name": "worker", "input": "do it", "label": "job"}, CALL
    )
    assert not out.is_error, out.text
    task = Task.objects.get()
    assert task.status == "pending"  # nothing ran: the call returned before the run started
    assert "task_id:" in out.text and "status: working" in out.text
    assert out.text == f"task_id: {task.id}\nstatus: working\nlabel: job\nagent: worker"
    assert out.display == "task"
    assert out.details["task_status"] == "working"
    assert out.details == {
        "task_id": task.id,
        "task_label": "job",
        "task_status": "working",
        "task_agent": "worker",
        "task_attempt": 1,
        "task_result": "",
    }
    assert task.tool_call_id == "call-1"
    assert recording_queue.run_ids == [task.run_id]


def test_7_4_2_spawn_task_refuses_without_a_conversation(parent, recording_queue):
    out = tools(None)["spawn_task"].call({"agent_name": "", "input": "do it", "label": ""}, CALL)
    assert_tool_error(out, "spawn_task: no session in the run context")
    assert not Task.objects.exists() and not Run.objects.exists()
    assert recording_queue.run_ids == []


def test_7_4_3_task_status_returns_the_full_result(parent, parent_run):
    text = "".join(chr(ord("a") + i % 26) for i in range(400))
    with agenttasks(SUMMARY_LIMIT=10):
        t = spawn(parent, parent_run)
        task = finish(t, "completed", text=text)
        assert task.summary == text[:10]
        out = tools(parent, parent_run)["task_status"].call({"task_id": t, "wait_seconds": 0}, CALL)
    assert text in out.text
    assert out.text.endswith("\nresult: " + text)
    assert out.details["task_result"] == text


def test_7_4_4_task_status_without_an_id_lists_the_conversation(parent, parent_run, signal_log):
    with agenttasks(SUMMARY_LIMIT=12):
        t1 = spawn(parent, parent_run)
        finish(t1, "completed", text="y" * 100)
        t2 = spawn(parent, parent_run)
        out = tools(parent, parent_run)["task_status"].call(
            {"task_id": "", "wait_seconds": 0}, CALL
        )
        other = tools(ConversationFactory(owner=parent.owner))["task_status"].call(
            {"task_id": "", "wait_seconds": 0}, CALL
        )
    assert out.text.startswith("2 task(s)")
    assert f"{t1}: completed" in out.text and f"{t2}: working" in out.text
    assert out.text.index(t2) < out.text.index(t1)  # newest first
    assert "y" * 100 not in out.text
    assert out.text == (
        f"2 {HEADER}\n- {t2}: working · job{STILL_WORKING}\n- {t1}: completed · job — {'y' * 12}"
    )
    assert (out.is_error, out.display, out.details) == (False, None, None)
    # A listing settles nothing.
    assert Wakeup.objects.get(task_id=t1).state == "pending"
    assert signal_log.delivered == []
    assert "no tasks" in other.text
    assert other.text == "no tasks in this conversation"


def test_7_4_5_stopping_a_finished_task_is_a_result(parent, parent_run):
    t = spawn(parent, parent_run)
    finish(t, "completed", text="all done")
    out = tools(parent, parent_run)["task_stop"].call({"task_id": t, "graceful": False}, CALL)
    assert out.is_error is True
    assert "completed" in out.text
    # A card, not a tool error: its text is the card alone.
    assert out.text == describe(unnamed(lifecycle.status(t)))
    assert out.display == "task" and out.details["task_status"] == "completed"
    assert row(t).status == "completed"


def test_7_4_6_the_four_are_exposed(parent, parent_run):
    assert [t.name for t in task_tools(parent, parent_run)] == [
        "spawn_task",
        "task_status",
        "task_retry",
        "task_stop",
    ]
    assert spawn_tool(parent, parent_run).name == "spawn_task"
    assert [t.name for t in control_tools(parent, parent_run)] == [
        "task_status",
        "task_retry",
        "task_stop",
    ]


def test_7_4_7_the_progress_line_is_shown(parent, parent_run):
    with agenttasks(DESCRIBE_STATE={"sequence": "tests.runtime.test_task_tools.describe_verify"}):
        t = spawn(parent, parent_run, kind="sequence", state={"n": 2})
        bound = tools(parent, parent_run)
        card = bound["task_status"].call({"task_id": t, "wait_seconds": 0}, CALL)
        listing = bound["task_status"].call({"task_id": "", "wait_seconds": 0}, CALL)
    assert 'progress: step 2/3 (verify) from {"n":2}' in card.text
    assert card.text == (
        f"task_id: {t}\nstatus: working\nlabel: job\nkind: sequence\n"
        'progress: step 2/3 (verify) from {"n":2}'
    )
    assert 'step 2/3 (verify) from {"n":2}' in listing.text
    assert "still working — do not redo its work" in listing.text
    assert listing.text == (
        f"1 {HEADER}\n- {t}: working · sequence · job · "
        f'step 2/3 (verify) from {{"n":2}}{STILL_WORKING}'
    )


def test_7_4_8_a_retry_refusal_is_a_result(parent, parent_run):
    t = spawn(parent, parent_run)
    finish(t, "completed", text="fine")
    out = tools(parent, parent_run)["task_retry"].call({"task_id": t}, CALL)
    assert out.is_error is True and out.display == "task"
    assert "only a failed task can be retried" in out.text and "completed" in out.text
    assert out.text == (
        "tasks: cannot retry a task that is completed; only a failed task can be retried\n"
        + describe(unnamed(lifecycle.status(t)))
    )
    assert out.details["task_status"] == "completed"
    assert row(t).status == "completed"


def test_a_retry_refusal_tells_a_model_its_own_words(parent, parent_run):
    """Python's NotRetryable says `running`; the model is told `working`, as the tools speak."""
    t = spawn(parent, parent_run)
    assert store.claim(row(t).run_id, "w1")
    out = tools(parent, parent_run)["task_retry"].call({"task_id": t}, CALL)
    assert out.is_error is True
    assert out.text.startswith(
        "tasks: cannot retry a task that is working; only a failed task can be retried\n"
    )


def test_7_4_9_task_retry_refuses_a_foreign_task(parent, parent_run, recording_queue):
    t = spawn(parent, parent_run)
    finish(t, "failed", error="rate limited")
    runs = Run.objects.count()
    foreign = tools(ConversationFactory(owner=parent.owner))
    out = foreign["task_retry"].call({"task_id": t}, CALL)
    assert_tool_error(out, "tasks: not found")
    task = row(t)
    assert (task.status, task.attempt) == ("failed", 1)
    assert Run.objects.count() == runs


def test_7_4_10_task_retry_reports_the_attempt(parent, parent_run):
    t = spawn(parent, parent_run)
    first = tools(parent, parent_run)["task_status"].call({"task_id": t, "wait_seconds": 0}, CALL)
    assert "attempt:" not in first.text and first.details["task_attempt"] == 1
    finish(t, "failed", error="rate limited")
    failed_card = tools(parent, parent_run)["task_status"].call(
        {"task_id": t, "wait_seconds": 0}, CALL
    )
    assert "attempt:" not in failed_card.text
    out = tools(parent, parent_run)["task_retry"].call({"task_id": t}, CALL)
    assert not out.is_error, out.text
    assert out.details["task_attempt"] == 2
    assert "attempt: 2" in out.text
    assert out.text == f"task_id: {t}\nstatus: working\nattempt: 2\nlabel: job"


def test_7_4_11_spawn_task_records_the_spawning_run(parent, parent_run):
    out = tools(parent, parent_run)["spawn_task"].call(
        {"agent_name": "", "input": "do it", "label": ""}, CALL
    )
    task = row(out.details["task_id"])
    assert task.parent_run_id == parent_run.id
    assert task.parent_conversation_id == parent.id
    # "" resolves to the agent of the spawning run; the label defaults to the input.
    assert task.agent == parent_run.agent and task.label == "do it"


def test_spawn_task_reports_a_lifecycle_refusal_as_a_tool_error(parent, parent_run):
    with agenttasks(MAX_CONCURRENT_PER_PARENT=1):
        spawn(parent, parent_run)
        out = tools(parent, parent_run)["spawn_task"].call(
            {"agent_name": "worker", "input": "again", "label": ""}, CALL
        )
    assert_tool_error(
        out, "tasks: this conversation already has 1 tasks running; wait for one to finish"
    )
    assert Task.objects.count() == 1


def test_spawn_task_of_a_task_that_already_finished_settles_its_debt(parent, parent_run):
    def run_to_completion(run_id):
        task = Task.objects.get(run_id=run_id)
        assert store.claim(run_id, "eager")
        lifecycle.on_run_finished(
            task.conversation_id, RunOutcome(run_id, "completed", text="fast")
        )

    from agenttasks.broker import queue

    backend = queue.get_backend()
    backend.before_enqueue = run_to_completion
    out = tools(parent, parent_run)["spawn_task"].call(
        {"agent_name": "worker", "input": "do it", "label": "job"}, CALL
    )
    assert out.details["task_status"] == "completed" and "result: fast" in out.text
    assert Wakeup.objects.get().state == "consumed"


# --- strict arguments ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "arguments", "detail"),
    [
        ("spawn_task", {}, "property 'agent_name' is required"),
        ("spawn_task", {"agent_name": "", "input": "x"}, "property 'label' is required"),
        (
            "spawn_task",
            {"agent_name": "", "input": "x", "label": "", "kind": "k"},
            "unknown property 'kind'",
        ),
        (
            "spawn_task",
            {"agent_name": None, "input": "x", "label": ""},
            "property 'agent_name' must be a string",
        ),
        ("spawn_task", ["not", "an", "object"], "arguments must be a JSON object"),
        ("spawn_task", None, "arguments must be a JSON object"),
        ("task_status", {"task_id": "t"}, "property 'wait_seconds' is required"),
        (
            "task_status",
            {"task_id": "t", "wait_seconds": "5"},
            "property 'wait_seconds' must be an integer",
        ),
        (
            "task_status",
            {"task_id": "t", "wait_seconds": True},
            "property 'wait_seconds' must be an integer",
        ),
        (
            "task_status",
            {"task_id": "t", "wait_seconds": 1.5},
            "property 'wait_seconds' must be an integer",
        ),
        ("task_status", {"task_id": 7, "wait_seconds": 0}, "property 'task_id' must be a string"),
        ("task_retry", {}, "property 'task_id' is required"),
        ("task_retry", {"task_id": "t", "wait_seconds": 0}, "unknown property 'wait_seconds'"),
        ("task_stop", {"task_id": "t"}, "property 'graceful' is required"),
        (
            "task_stop",
            {"task_id": "t", "graceful": "yes"},
            "property 'graceful' must be a boolean",
        ),
        ("task_stop", {"task_id": "t", "graceful": 1}, "property 'graceful' must be a boolean"),
    ],
)
def test_invalid_arguments_are_a_tool_error(parent, parent_run, name, arguments, detail):
    out = tools(parent, parent_run)[name].call(arguments, CALL)
    assert_tool_error(out, f"{name}: invalid arguments: {detail}")
    assert not Task.objects.exists()


def test_valid_arguments_with_extra_keys_create_nothing(parent, parent_run, recording_queue):
    out = tools(parent, parent_run)["spawn_task"].call(
        {"agent_name": "worker", "input": "x", "label": "", "agent": "worker"}, CALL
    )
    assert out.text == "spawn_task: invalid arguments: unknown property 'agent'"
    assert not Task.objects.exists() and recording_queue.run_ids == []


# --- descriptions and schemas, verbatim ----------------------------------------------------

SPAWN_DESCRIPTION = (
    "Start a background task: another agent works on the input while you continue. Returns a "
    "task_id immediately. When the task finishes you are notified automatically in a later turn "
    "— after spawning, finish your reply and END YOUR TURN instead of polling. Only reach for "
    "task_status when the user explicitly asks for progress (use its wait_seconds rather than a "
    "polling loop); task_stop cancels."
)
STATUS_DESCRIPTION = (
    "Check a background task started with spawn_task. Statuses: working, input_required "
    "(waiting for a human approval), completed, failed, cancelled. For finished tasks the result "
    "field carries the FULL final output — the wake-up notification only shows a truncated "
    "summary. Set wait_seconds for one bounded wait instead of calling this in a loop. With no "
    "task_id it lists this conversation's tasks — the way back to an id you no longer have."
)
RETRY_DESCRIPTION = (
    "Resume a FAILED background task from where it stopped: same conversation, same progress, a "
    "new attempt. Prefer this over spawning a fresh task after a transient failure (a rate "
    "limit, a dropped connection) — a new task starts from nothing and pays again for everything "
    "this one already did. Only a failed task can be resumed, and only a limited number of "
    "times; when the failure is one a rerun cannot fix, spawn a new task instead."
)
STOP_DESCRIPTION = "Stop a background task started with spawn_task."

EXPECTED_SCHEMAS = {
    "spawn_task": (
        SPAWN_DESCRIPTION,
        {
            "type": "object",
            "properties": {
                "agent_name": {
                    "type": "string",
                    "description": "Agent to run the task with; empty uses the current agent",
                },
                "input": {"type": "string", "description": "The task prompt for the agent"},
                "label": {
                    "type": "string",
                    "description": "Short human-readable task label shown in the UI",
                },
            },
            "required": ["agent_name", "input", "label"],
            "additionalProperties": False,
        },
    ),
    "task_status": (
        STATUS_DESCRIPTION,
        {
            "type": "object",
            "properties": {
                "task_id": {
                    "type": "string",
                    "description": "The id returned by spawn_task; empty lists every task of "
                    "this conversation instead (newest first, summaries only)",
                },
                "wait_seconds": {
                    "type": "integer",
                    "description": "Block up to this many seconds for the task to finish before "
                    "returning (0 = return immediately). Prefer one wait over repeated polling",
                },
            },
            "required": ["task_id", "wait_seconds"],
            "additionalProperties": False,
        },
    ),
    "task_retry": (
        RETRY_DESCRIPTION,
        {
            "type": "object",
            "properties": {
                "task_id": {"type": "string", "description": "The id of the failed task to resume"}
            },
            "required": ["task_id"],
            "additionalProperties": False,
        },
    ),
    "task_stop": (
        STOP_DESCRIPTION,
        {
            "type": "object",
            "properties": {
                "task_id": {"type": "string", "description": "The id returned by spawn_task"},
                "graceful": {
                    "type": "boolean",
                    "description": "Finish the current turn before stopping instead of aborting "
                    "immediately",
                },
            },
            "required": ["task_id", "graceful"],
            "additionalProperties": False,
        },
    ),
}


@pytest.mark.parametrize("name", list(EXPECTED_SCHEMAS))
def test_exact_description_and_strict_schema(parent, parent_run, name):
    description, parameters = EXPECTED_SCHEMAS[name]
    tool = tools(parent, parent_run)[name]
    assert tool.schema() == {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": parameters,
            "strict": True,
        },
    }
    # Strict: every property required, in order, and nothing else accepted.
    assert parameters["required"] == list(parameters["properties"])
    # The JSON a loop sends to the model keeps the exact text.
    assert json.loads(json.dumps(tool.schema()))["function"]["description"] == description


# --- ownership ------------------------------------------------------------------------------

OWNED_CALLS = {
    "task_status": lambda t: {"task_id": t, "wait_seconds": 0},
    "task_retry": lambda t: {"task_id": t},
    "task_stop": lambda t: {"task_id": t, "graceful": False},
}


def snapshot(task_id):
    task = row(task_id)
    wakeups = list(Wakeup.objects.filter(task_id=task_id).values_list("state", flat=True))
    return (task.status, task.run_id, task.attempt, task.run.stop_request, wakeups)


@pytest.fixture
def failed_child(parent, parent_run):
    t = spawn(parent, parent_run)
    finish(t, "failed", error="rate limited")
    return t


@pytest.mark.parametrize("name", list(OWNED_CALLS))
def test_ownership_without_a_bound_conversation(failed_child, name):
    before = snapshot(failed_child)
    out = tools(None)[name].call(OWNED_CALLS[name](failed_child), CALL)
    assert_tool_error(out, "task tools: no session in the run context")
    assert snapshot(failed_child) == before


def test_listing_without_a_bound_conversation(db):
    out = tools(None)["task_status"].call({"task_id": "", "wait_seconds": 0}, CALL)
    assert_tool_error(out, "task_status: no session in the run context")


@pytest.mark.parametrize("name", list(OWNED_CALLS))
def test_ownership_unknown_id(parent, parent_run, name):
    out = tools(parent, parent_run)[name].call(OWNED_CALLS[name]("task_nope"), CALL)
    assert_tool_error(out, "tasks: not found")


@pytest.mark.parametrize("name", list(OWNED_CALLS))
def test_ownership_foreign_conversation(failed_child, parent, name):
    before = snapshot(failed_child)
    stranger = ConversationFactory(owner=parent.owner, agent="default")
    out = tools(stranger)[name].call(OWNED_CALLS[name](failed_child), CALL)
    assert_tool_error(out, "tasks: not found")
    assert snapshot(failed_child) == before


@pytest.mark.parametrize("name", list(OWNED_CALLS))
def test_ownership_rest_created_task_without_parent(user, parent, name):
    task = lifecycle.create(owner=user, agent_id="worker", input="from REST")
    assert store.claim(task.run_id, "w1")
    lifecycle.on_run_finished(task.conversation_id, RunOutcome(task.run_id, "failed", error="boom"))
    before = snapshot(task.id)
    # Not from P, and not from its own conversation either: no model can see it.
    for conversation in (parent, task.conversation_id):
        out = tools(conversation)[name].call(OWNED_CALLS[name](task.id), CALL)
        assert_tool_error(out, "tasks: not found")
    assert snapshot(task.id) == before


@pytest.mark.parametrize("name", list(OWNED_CALLS))
def test_ownership_delegate_task(parent, parent_run, name):
    delegate = store.create_task(
        NewTask(
            parent_conversation_id=parent.pk,
            owner=parent.owner,
            agent="worker",
            input="delegated",
            kind="delegate",
            parent_run_id=parent_run.pk,
        )
    )
    assert store.claim(delegate.run_id, "w1")
    assert store.finalize(delegate.id, delegate.run_id, "failed", result="boom")
    before = snapshot(delegate.id)
    out = tools(parent, parent_run)[name].call(OWNED_CALLS[name](delegate.id), CALL)
    assert_tool_error(out, "tasks: not found")
    assert snapshot(delegate.id) == before
    listing = tools(parent, parent_run)["task_status"].call(
        {"task_id": "", "wait_seconds": 0}, CALL
    )
    assert listing.text == "no tasks in this conversation"


def test_an_owned_task_is_found(failed_child, parent, parent_run):
    out = tools(parent, parent_run)["task_status"].call(
        OWNED_CALLS["task_status"](failed_child), CALL
    )
    assert not out.is_error and out.details["task_status"] == "failed"


# --- attach rule (7.6.2) ---------------------------------------------------------------------


def test_attachable_follows_max_depth(parent, parent_run):
    assert attachable(parent) is True  # not a task's conversation
    child = row(spawn(parent, parent_run))
    assert child.depth == 1
    assert attachable(child.conversation) is False  # default MAX_DEPTH 1
    assert attachable(child.conversation_id) is False
    with agenttasks(MAX_DEPTH=2):
        assert attachable(child.conversation) is True
        grandchild = row(lifecycle.spawn(child.conversation, "worker", "deeper").task_id)
        assert grandchild.depth == 2
        assert attachable(grandchild.conversation) is False


def test_attachable_withholds_the_tools_when_meta_for_raises(parent, monkeypatch):
    def broken(conversation):
        raise SpawnError.looking_up(str(conversation), DatabaseError("connection reset"))

    monkeypatch.setattr(lifecycle, "meta_for", broken)
    assert attachable(parent) is False


def test_meta_for_reports_a_store_failure_and_the_tools_are_withheld(parent, monkeypatch):
    # 7.6.2 from the attach side: a lookup error is never read as "not a task".
    from django.db.models.query import QuerySet

    def failing_values(self, *fields, **expressions):
        raise DatabaseError("server closed the connection unexpectedly")

    monkeypatch.setattr(QuerySet, "values", failing_values)
    with pytest.raises(SpawnError) as raised:
        lifecycle.meta_for(parent)
    assert str(raised.value).startswith(f'tasks: looking up session "{parent.id}": ')
    assert isinstance(raised.value.__cause__, DatabaseError)
    assert attachable(parent) is False
