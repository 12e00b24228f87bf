"""P1 throughput: N echo tasks end to end through a real cluster, beside bare django-q2 jobs.

Both run on the same PostgreSQL database with the same cluster settings in the same run:
- baseline: N django-q2 jobs that each insert one row (first enqueue to last row written);
- agenttasks: N echo tasks created with `lifecycle.create` (first create to last completed).

    .venv/bin/python bench/throughput.py --n 2000 --workers 2 4
"""

import argparse
import time

from common import Cluster, bench_user, clean, setup_django, wait_until


def bare(n: int) -> float:
    from django.db import connection
    from django_q.tasks import async_task

    def count():
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM bench_rows")
            return cursor.fetchone()[0]

    started = time.monotonic()
    for i in range(n):
        async_task("bench.jobs.write_row", i)
    return n / (wait_until(lambda: count() >= n, 600) - started)


def agenttasks(n: int) -> float:
    from agenttasks import lifecycle
    from agenttasks.models import Task

    user = bench_user()
    started = time.monotonic()
    for i in range(n):
        lifecycle.create(owner=user, agent_id="echo", input=f"m{i}")
    ended = wait_until(lambda: Task.objects.filter(status="completed").count() >= n, 900)
    return n / (ended - started)


def measure(n: int, workers_list: list[int]) -> list[tuple[int, float, float]]:
    rows = []
    for workers in workers_list:
        results = []
        for run in (bare, agenttasks):
            clean()
            cluster = Cluster(workers)
            try:
                results.append(run(n))
            finally:
                cluster.stop()
        rows.append((workers, *results))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--workers", type=int, nargs="+", default=[2, 4])
    args = parser.parse_args()
    setup_django()
    rows = measure(args.n, args.workers)
    print(f"\nP1 throughput, N={args.n}, PostgreSQL, ORM broker")
    print(
        f"{'workers':>7}  {'bare django-q2 jobs/s':>22}  {'agenttasks tasks/s':>19}  {'ratio':>6}"
    )
    for workers, base, ours in rows:
        print(f"{workers:>7}  {base:>22.1f}  {ours:>19.1f}  {ours / base:>6.2f}")


if __name__ == "__main__":
    main()
