"""A real cluster against a provider with a limit: a burst ends with every task completed, and
two worker processes share one concurrency limit (docs/operating.md#meeting-your-providers-limits)."""

import threading
import time
from collections import deque
from datetime import timedelta

import pytest
from django.test import override_settings
from django.utils import timezone

from agenttasks import lifecycle
from agenttasks.flow import budgets, redis_store
from agenttasks.models import ProviderBudget, Run, Task

from ..conftest import wait_for
from ..fake_model import answer, http

pytest_plugins = ["tests.fake_model"]
pytestmark = pytest.mark.django_db(transaction=True)

CHAT = {"chatter": {"runtime": "chat", "model": "m-chat", "stream": False}}
TERMINAL = ("completed", "failed", "cancelled")


class LimitedProvider:
    """A provider that refuses a request beyond `per_second` started in the last second (429 with
    `Retry-After: 1`, as providers do), and answers the others after `seconds`."""

    def __init__(self, per_second: int, seconds: float):
        self.per_second, self.seconds = per_second, seconds
        self.started: deque[float] = deque()
        self.refused = 0
        self.busiest_second = 0
        self._lock = threading.Lock()

    def __call__(self, request):
        with self._lock:
            now = time.monotonic()
            while self.started and self.started[0] <= now - 1:
                self.started.popleft()
            if len(self.started) >= self.per_second:
                self.refused += 1
                return http(429, {"error": {"message": "rate limited"}}, {"Retry-After": "1"})
            self.started.append(now)
            self.busiest_second = max(self.busiest_second, len(self.started))
        time.sleep(self.seconds)
        return answer("done")


@pytest.fixture(params=["database", "redis"])
def budget_store(request):
    """The store of the budgets the cluster's processes share: the database's rows or Redis."""
    if request.param == "redis":
        pytest.importorskip("redis")
    yield request.param
    if request.param == "redis":
        with override_settings(AGENTTASKS={"BUDGET_STORE": "redis"}):
            redis_store.clear()


def chat_tasks(user, n: int) -> list[Task]:
    return [lifecycle.create(owner=user, agent_id="chatter", input=f"q {i}") for i in range(n)]


def all_settled(tasks, timeout: float) -> list[str]:
    ids = [t.id for t in tasks]
    wait_for(
        lambda: Task.objects.filter(pk__in=ids, status__in=TERMINAL).count() == len(ids),
        timeout=timeout,
        interval=0.2,
        message=f"{len(ids)} tasks to settle",
    )
    return list(Task.objects.filter(pk__in=ids).values_list("status", flat=True))


def test_a_burst_against_a_provider_whose_limit_is_unknown_ends_with_every_task_completed(
    start_cluster, model, user, budget_store
):
    model.set(AGENTS=CHAT, MAX_ACTIVE_TASKS_PER_USER=0, WORKER_SLOTS=20, BUDGET_STORE=budget_store)
    provider = LimitedProvider(per_second=8, seconds=0.2)
    model.script(provider)
    start_cluster(workers=2, **model.values)
    statuses = all_settled(chat_tasks(user, 60), timeout=120)
    assert statuses.count("completed") == 60, statuses
    assert provider.refused > 0  # it was over the limit, and learned it from the refusals
    assert provider.busiest_second <= 8
    assert budgets.state("default").learned_rate is not None


def test_with_the_limit_configured_the_provider_refuses_nothing(start_cluster, model, user):
    model.set(
        AGENTS=CHAT,
        MAX_ACTIVE_TASKS_PER_USER=0,
        WORKER_SLOTS=20,
        MODEL_LIMITS={"default": {"requests_per_minute": 6 * 60}},
    )
    # The provider counts arrivals in a loaded test process, which bunches them a little: the
    # limit leaves it headroom (the bench measures the cluster at the provider's exact limit).
    provider = LimitedProvider(per_second=10, seconds=0.2)
    model.script(provider)
    start_cluster(workers=2, **model.values)
    statuses = all_settled(chat_tasks(user, 30), timeout=120)
    assert statuses.count("completed") == 30, statuses
    assert provider.refused == 0


def test_two_processes_never_exceed_a_concurrency_limit_of_3(
    start_cluster, model, user, budget_store
):
    model.set(
        AGENTS=CHAT,
        MAX_ACTIVE_TASKS_PER_USER=0,
        WORKER_SLOTS=10,
        MODEL_LIMITS={"default": {"concurrent": 3}},
        BUDGET_STORE=budget_store,
    )

    def script(request):
        time.sleep(0.3)
        return answer("done")

    server = model.script(script)
    start_cluster(workers=2, **model.values)
    statuses = all_settled(chat_tasks(user, 24), timeout=120)
    assert statuses.count("completed") == 24, statuses
    assert server.max_in_flight["m-chat"] == 3, server.max_in_flight  # used, and never more
    assert budgets.state("default") is not None  # the budget lives in the store under test


def test_a_delayed_task_starts_at_its_time_on_a_real_cluster(start_cluster, model, user):
    model.set(AGENTS=CHAT, MAX_ACTIVE_TASKS_PER_USER=0)
    server = model.script(lambda request: answer("done"))
    start_cluster(workers=1, **model.values)
    now = lifecycle.create(owner=user, agent_id="chatter", input="now")
    at = timezone.now() + timedelta(seconds=3)
    later = lifecycle.create(owner=user, agent_id="chatter", input="later", not_before=at)
    assert all_settled([now], timeout=60) == ["completed"]
    assert Task.objects.get(pk=later.id).status == "pending"  # the other one ran meanwhile
    assert all_settled([later], timeout=60) == ["completed"]
    started = Task.objects.get(pk=later.id).started_at
    assert at <= started < at + timedelta(seconds=3), (at, started)
    assert server.served["m-chat"] == 2


def test_parked_runs_survive_a_sigkill_start_at_their_turn_and_can_be_cancelled(
    start_cluster, model, user
):
    """A turn further off than PARK_AFTER parks the run: queued again until its place in the
    line, its slot given back. Killed while parked, the cluster loses nothing: a new one starts
    each run at its place; a parked task can be cancelled."""
    limits = {"default": {"requests_per_minute": 20}}  # a start every 3.3 s (at 90 %)
    model.set(AGENTS=CHAT, MAX_ACTIVE_TASKS_PER_USER=0, MODEL_LIMITS=limits, PARK_AFTER=1)
    server = model.script(lambda request: answer("done"))
    cluster = start_cluster(workers=1, **model.values)
    tasks = chat_tasks(user, 4)
    ids = [t.id for t in tasks]

    def parked():
        return Run.objects.filter(task_id__in=ids, status="queued", limited_since__isnull=False)

    def one_done_three_parked():
        done = Task.objects.filter(pk__in=ids, status="completed").count()
        return done == 1 and parked().count() == 3

    wait_for(one_done_three_parked, timeout=30, interval=0.1, message="one done, three parked")
    cluster.kill()
    for run in parked():
        assert run.not_before > timezone.now() - timedelta(seconds=2)
        assert run.worker == "" and run.task.status == "pending"
    last = parked().order_by("-not_before").first()
    lifecycle.cancel(last.task_id)
    start_cluster(workers=1, **model.values)
    statuses = all_settled(tasks, timeout=60)
    assert sorted(statuses) == ["cancelled", "completed", "completed", "completed"]
    assert server.served["m-chat"] == 3  # each run sent its request once, the cancelled none
    arrivals = [r.arrived for r in server.requests]
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:], strict=False)]
    assert min(gaps) >= 3.0, gaps  # each at its turn, 3.3 s apart
    assert Run.objects.filter(task_id__in=ids).count() == 4  # parked runs kept their ids
    assert ProviderBudget.objects.get(pk="default").refusals == 0
