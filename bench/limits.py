"""P9, a provider's limits: chat tasks against a model server that refuses beyond its rate.

The fake model server (bench/model_server.py --rate) answers after `--latency` seconds and refuses
a request beyond `--rate` started in the last second (429, `Retry-After: 1`), as providers do.
Each scenario runs on a fresh demo cluster on PostgreSQL (docs/performance.md, P9):

- burst: N tasks created at once, with the limit configured (MODEL_LIMITS) and without (learned
  from the 429s): how long until all settle (ideal N / rate + latency), how many failed, how many
  429s the server answered, and the most requests it started in one second;
- fairness: user A creates N tasks, then user B creates 10, one a second: how long until each of
  B's is claimed, and until its first model request;
- priority: a task of priority 100 created behind N queued tasks: the same two latencies;
- two clusters on one database share the limit; with `--broker redis`, on django-q2's Redis
  broker, where the budget lives in Redis.

    .venv/bin/python bench/limits.py --n 1000 --rate 50 --latency 2
"""

import argparse
import json
import os
import statistics
import time

import httpx
from common import Cluster, clean, setup_django, wait_until
from inflight import AGENT, create, model_server

MODEL_PORT = 8791
TERMINAL = ("completed", "failed", "cancelled")


def overrides(rate: int | None) -> dict:
    values = {
        "MAX_ACTIVE_TASKS_PER_USER": 0,
        "METRICS_ENABLED": False,
        "MODEL_BASE_URL": f"http://127.0.0.1:{MODEL_PORT}/v1",
        "DEFAULT_MODEL": "fake",
        "AGENTS": {AGENT: {"runtime": "chat", "does": "answers", "stream": True}},
    }
    if rate:
        values["MODEL_LIMITS"] = {"default": {"requests_per_minute": rate * 60}}
    return values


def model(path: str) -> dict:
    method = httpx.post if path == "reset" else httpx.get
    return method(f"http://127.0.0.1:{MODEL_PORT}/{path}", timeout=5).json()


def user(name: str):
    from django.contrib.auth import get_user_model

    return get_user_model().objects.get_or_create(username=name)[0]


def settled(ids=None) -> int:
    from agenttasks.models import Task

    rows = Task.objects.filter(status__in=TERMINAL)
    return rows.filter(pk__in=ids).count() if ids is not None else rows.count()


def started_within(task_id: str, timeout: float = 120) -> float:
    """Seconds from now (the task just created) until it leaves `pending`, polled every 20 ms.

    Measured on this process's clock: the claim's own timestamps are taken before its statement
    runs, so under load they can precede the create.
    """
    from agenttasks.models import Task

    begun = time.monotonic()
    wait_until(
        lambda: not Task.objects.filter(pk=task_id, status="pending").exists(), timeout, 0.02
    )
    return time.monotonic() - begun


def parks() -> int:
    """How many times runs parked (a task gone from running back to pending: no chat task here
    continues)."""
    from agenttasks.models import Event

    moves = Event.objects.filter(type="task.status", data__to="pending", data__from="running")
    return moves.values("task_id").count()


def statuses() -> dict[str, int]:
    from django.db.models import Count

    from agenttasks.models import Task

    return dict(Task.objects.values_list("status").annotate(n=Count("pk")))


def sampled(budget: list, started: float) -> bool:
    """Note the budget's learned rate and how far its line runs ahead, twice a second (for
    BENCH_TIMELINE); say True."""
    from django.utils import timezone

    from agenttasks.flow import budgets

    at = time.monotonic() - started
    if os.environ.get("BENCH_TIMELINE") == "1" and (not budget or at - budget[-1][0] >= 0.5):
        row = budgets.state("default")
        if row is not None:
            now = timezone.now()
            ahead = (row.next_start - now).total_seconds() if row.next_start else None
            from django.db.models import Max

            from agenttasks.models import Run

            later = Run.objects.filter(status="queued", not_before__gt=now)
            furthest = later.aggregate(m=Max("not_before"))["m"]
            budget.append(
                (
                    round(at, 1),
                    row.learned_rate and round(row.learned_rate, 1),
                    ahead and round(ahead, 1),
                    later.count(),
                    furthest and round((furthest - now).total_seconds(), 1),
                )
            )
    return True


def burst(n: int, workers: int, clusters: int = 1) -> dict:
    clean()
    running = [Cluster(workers) for _ in range(clusters)]
    try:
        model("reset")
        started = time.monotonic()
        create(n, owner=user("a"))
        budget: list = []
        ended = wait_until(lambda: sampled(budget, started) and settled() >= n, 900, poll=0.1)
        figures = model("stats")
        figures.pop("marks")
        if os.environ.get("BENCH_TIMELINE") != "1":
            figures.pop("timeline")
        else:
            figures["budget"] = budget
    finally:
        for cluster in running:
            cluster.stop()
    return {
        "seconds": round(ended - started, 1),
        "statuses": statuses(),
        "parks": parks(),
        **figures,
    }


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return round(ordered[max(0, round(0.95 * len(ordered)) - 1)], 2)


def first_requests(created: dict[str, float]) -> list[float]:
    """Seconds from each marked task's create (wall clock) to its first model request."""
    marks = model("stats")["marks"]
    return [marks[f"{mark} 0"] - at for mark, at in created.items() if f"{mark} 0" in marks]


def fairness(n: int, workers: int, late: int = 10) -> dict:
    """A's N tasks at once, then B's `late` tasks one a second: how long until each of B's is
    claimed, and until its first model request."""
    clean()
    cluster = Cluster(workers)
    try:
        model("reset")
        started = time.monotonic()
        create(n, owner=user("a"))
        b_claimed, created = [], {}
        for k in range(late):
            begun = time.monotonic()
            created[f"mark:b{k}"] = time.time()
            (b_id,) = create(1, threads=1, owner=user("b"), text=f"mark:b{k}")
            b_claimed.append(time.monotonic() - begun + started_within(b_id))
            time.sleep(max(0.0, begun + 1 - time.monotonic()))
        ended = wait_until(lambda: settled() >= n + late, 900, poll=0.1)
        b_request = first_requests(created)
        figures = model("stats")
    finally:
        cluster.stop()
    figures.pop("marks")
    return {
        "b_claimed_p50": round(statistics.median(b_claimed), 2),
        "b_claimed_p95": p95(b_claimed),
        "b_request_p50": round(statistics.median(b_request), 2),
        "b_request_p95": p95(b_request),
        "a_seconds": round(ended - started, 1),
        "statuses": statuses(),
        "parks": parks(),
        **figures,
    }


def priority(n: int, workers: int) -> dict:
    """A task of priority 100 created behind N queued tasks: its start latency."""
    clean()
    cluster = Cluster(workers)
    try:
        model("reset")
        create(n, owner=user("a"))
        time.sleep(2)  # the backlog is claimed and waits its turns
        begun, created = time.monotonic(), {"mark:urgent": time.time()}
        (urgent,) = create(1, threads=1, owner=user("a"), priority=100, text="mark:urgent")
        latency = time.monotonic() - begun + started_within(urgent)
        wait_until(lambda: settled() >= n + 1, 900, poll=0.1)
        (request,) = first_requests(created)
    finally:
        cluster.stop()
    return {
        "urgent_claimed": round(latency, 2),
        "urgent_request": round(request, 2),
        "statuses": statuses(),
    }


def run_scenario(name: str, args) -> dict:
    if name == "burst":
        return burst(args.n, args.workers)
    if name == "two-clusters":
        return burst(args.n, max(1, args.workers // 2), clusters=2)
    if name == "fairness":
        return fairness(args.n, args.workers)
    return priority(args.n, args.workers)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--rate", type=int, default=50)
    parser.add_argument("--latency", type=float, default=2.0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--unconfigured", action="store_true", help="learn the limit from 429s")
    parser.add_argument(
        "--scenario", choices=["burst", "two-clusters", "fairness", "priority"], default="burst"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON line (run.py)")
    parser.add_argument(
        "--broker", choices=["orm", "redis"], default="orm", help="redis: the budget in Redis"
    )
    args = parser.parse_args()
    if args.broker == "redis":
        os.environ.update(Q_BROKER="redis", Q_NAME="agenttasks-bench-limits")
    os.environ["AGENTTASKS_OVERRIDES"] = json.dumps(
        overrides(None if args.unconfigured else args.rate)
    )
    setup_django()
    server = model_server(args.latency, port=MODEL_PORT, rate=args.rate)
    try:
        result = run_scenario(args.scenario, args)
    finally:
        server.terminate()
    ideal = args.n / args.rate + args.latency
    result.update(
        scenario=args.scenario,
        n=args.n,
        rate=args.rate,
        configured=not args.unconfigured,
        broker=args.broker,
        ideal=round(ideal, 1),
    )
    print(json.dumps(result) if args.json else result)


if __name__ == "__main__":
    main()
