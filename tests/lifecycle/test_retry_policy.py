"""An agent's retry policy: a run that failed for a passing reason is tried again after a backoff
with jitter, each attempt a run of its own, until `max_attempts`; other failures end the task
(docs/lifecycle.md#automatic-retries)."""

from datetime import timedelta

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.utils import timezone

from agenttasks import lifecycle, registry
from agenttasks.execution import worker
from agenttasks.models import Run, Task
from agenttasks.runtime.base import Reply, RetryableError

from ..conftest import wait_for
from ..fake_model import answer, http, refresh, run_to_idle, stream_answer, streamed

pytest_plugins = ["tests.fake_model"]
pytestmark = pytest.mark.django_db(transaction=True)

FAST = {"max_attempts": 3, "backoff_seconds": 0.2, "max_backoff_seconds": 10, "jitter": 0.25}


def settle(task: Task, queue, timeout: float = 20) -> Task:
    """Execute the task's runs in this thread, each once it is due, until the task settles."""
    deadline = timezone.now() + timedelta(seconds=timeout)
    while True:
        run_to_idle(queue)
        task = refresh(task)
        if task.status in ("completed", "failed", "cancelled"):
            return task
        assert timezone.now() < deadline, f"task {task.id} did not settle: {task.status}"
        due = task.run.not_before
        if due:
            wait_for(lambda: timezone.now() >= due, timeout=timeout, interval=0.02)  # noqa: B023
        worker.execute_run(task.run_id)


def runs_of(task: Task) -> list[Run]:
    return list(Run.objects.filter(task_id=task.id).order_by("attempt", "queued_at"))


def flaky(failures: int):
    """A callable handler that raises RetryableError `failures` times, then replies."""
    seen = []

    def handle(ctx):
        seen.append(ctx.run_id)
        if len(seen) <= failures:
            raise RetryableError(f"flaky tool failed ({len(seen)})")
        return Reply(content="done at last")

    return handle


def test_a_retryable_failure_is_tried_again_with_exponential_backoff(agents, user, recording_queue):
    agents("flaky", runtime="callable", handler=flaky(2), retry=FAST)
    task = settle(lifecycle.create(owner=user, agent_id="flaky", input="go"), recording_queue)
    assert (task.status, task.result, task.attempt) == ("completed", "done at last", 3)
    runs = runs_of(task)
    assert [(r.attempt, r.trigger, r.status) for r in runs] == [
        (1, "initial", "failed"),
        (2, "retry", "failed"),
        (3, "retry", "completed"),
    ]
    assert runs[0].error == "flaky tool failed (1)"
    # Attempt k + 1 is due backoff × 2^(k−1) after attempt k failed, less up to 25 % jitter.
    first = (runs[1].not_before - runs[0].ended_at).total_seconds()
    second = (runs[2].not_before - runs[1].ended_at).total_seconds()
    assert 0.15 - 0.01 <= first <= 0.2 + 0.01, first
    assert 0.3 - 0.01 <= second <= 0.4 + 0.01, second
    assert runs[1].started_at >= runs[1].not_before  # nothing started it early


def test_the_task_fails_when_its_attempts_are_spent(agents, user, recording_queue):
    agents("flaky", runtime="callable", handler=flaky(99), retry={**FAST, "max_attempts": 2})
    task = settle(lifecycle.create(owner=user, agent_id="flaky", input="go"), recording_queue)
    assert (task.status, task.attempt, task.error) == ("failed", 2, "flaky tool failed (2)")
    assert [r.status for r in runs_of(task)] == ["failed", "failed"]


def test_a_failure_that_is_not_retryable_ends_the_task_at_once(agents, user, recording_queue):
    def broken(ctx):
        raise ValueError("a bug, not a blip")

    agents("broken", runtime="callable", handler=broken, retry=FAST)
    task = settle(lifecycle.create(owner=user, agent_id="broken", input="go"), recording_queue)
    assert (task.status, task.attempt, task.error) == ("failed", 1, "a bug, not a blip")
    assert len(runs_of(task)) == 1


def test_a_database_error_fails_the_run_in_the_products_words_and_logs_the_detail(
    agents, user, recording_queue, caplog
):
    def clash(ctx):
        type(user).objects.create(username=user.username)  # a real unique violation

    agents("clash", runtime="callable", handler=clash, retry=FAST)
    task = settle(lifecycle.create(owner=user, agent_id="clash", input="go"), recording_queue)
    assert (task.status, task.attempt, task.error) == ("failed", 1, "A database error occurred")
    assert "unique" in caplog.text.lower()  # the database's own words went to the log


def test_without_a_policy_a_retryable_failure_fails_the_task(agents, user, recording_queue):
    agents("flaky", runtime="callable", handler=flaky(1))
    task = settle(lifecycle.create(owner=user, agent_id="flaky", input="go"), recording_queue)
    assert (task.status, task.attempt) == ("failed", 1)


def test_a_model_server_error_is_retried_by_the_policy_and_a_bad_request_is_not(
    model, agents, user, recording_queue
):
    model.set(MODEL_RETRIES=0)
    agents("plain", model="m-plain", stream=False, retry=FAST)
    replies = [http(503, "overloaded"), answer("ok")]
    server = model.script(lambda request: replies.pop(0) if len(replies) > 1 else replies[0])
    task = settle(lifecycle.create(owner=user, agent_id="plain", input="hi"), recording_queue)
    assert (task.status, task.result, task.attempt) == ("completed", "ok", 2)
    assert server.served["m-plain"] == 2
    retry_input = runs_of(task)[1].input
    assert "Model server returned HTTP 503: overloaded" in retry_input

    model.script(lambda request: http(400, "bad request"))
    task = settle(lifecycle.create(owner=user, agent_id="plain", input="hi"), recording_queue)
    assert (task.status, task.attempt) == ("failed", 1)


def test_a_stream_cut_short_is_a_model_error_that_the_policy_retries(
    model, agents, user, recording_queue
):
    agents("streamer", model="m-stream", retry={**FAST, "max_attempts": 2})
    replies = [streamed([{"content": "half an ans"}], cut=True), stream_answer(["whole"])]
    server = model.script(lambda request: replies.pop(0) if len(replies) > 1 else replies[0])
    task = settle(lifecycle.create(owner=user, agent_id="streamer", input="hi"), recording_queue)
    assert (task.status, task.result, task.attempt) == ("completed", "whole", 2)
    (cut,) = [r for r in runs_of(task) if r.status == "failed"]
    assert cut.error == "Model server stream ended before the reply was complete"
    assert server.served["m-stream"] == 2

    agents("streamer", model="m-stream")  # no policy: the cut stream fails the task
    model.script(lambda request: streamed([{"content": "half"}], cut=True))
    task = settle(lifecycle.create(owner=user, agent_id="streamer", input="hi"), recording_queue)
    assert (task.status, task.error) == (
        "failed",
        "Model server stream ended before the reply was complete",
    )


def test_a_task_waiting_for_its_retry_can_be_cancelled(agents, user, recording_queue):
    agents(
        "flaky",
        runtime="callable",
        handler=flaky(99),
        retry={**FAST, "backoff_seconds": 60, "max_backoff_seconds": 60},
    )
    task = lifecycle.create(owner=user, agent_id="flaky", input="go")
    run_to_idle(recording_queue)
    task = refresh(task)
    assert (task.status, task.attempt, task.run.status) == ("pending", 2, "queued")
    assert task.run.not_before > timezone.now() + timedelta(seconds=40)
    lifecycle.cancel(task.id)
    task = refresh(task)
    assert (task.status, task.run.status) == ("cancelled", "cancelled")


def test_the_policy_is_checked_when_the_agent_is_registered():
    with pytest.raises(ImproperlyConfigured, match="retry: unknown keys"):
        registry.build("a", runtime="callable", handler=flaky(0), retry={"attempts": 3})
    with pytest.raises(ImproperlyConfigured, match="retry: max_attempts has an invalid value 0"):
        registry.build("a", runtime="callable", handler=flaky(0), retry={"max_attempts": 0})
    with pytest.raises(ImproperlyConfigured, match="retry: jitter has an invalid value 2"):
        registry.build("a", runtime="callable", handler=flaky(0), retry={"jitter": 2})


def test_the_backoff_doubles_up_to_its_cap_less_the_jitter():
    policy = registry.RetryPolicy(backoff_seconds=1, max_backoff_seconds=5, jitter=0.5)
    assert [policy.delay(k, 0.0) for k in (1, 2, 3, 4)] == [1, 2, 4, 5]
    assert policy.delay(2, 1.0) == 1.0  # the whole jitter takes half off
