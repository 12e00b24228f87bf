"""P1 throughput: N echo tasks end to end through a real cluster, beside bare django-q2 jobs.

Both run on the same PostgreSQL database with the same cluster settings in the same run:
- baseline: N django-q2 jobs that each insert one row (first enqueue to last row written);
- agenttasks: N echo tasks created through the REST API (uvicorn, 8 concurrent clients), first
  create to last completed.

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


def agenttasks(n: int, port: int = 8767, concurrency: int = 8) -> float:
    """N echo tasks created through the REST API by `concurrency` clients, run by the cluster."""
    import threading

    import httpx
    from latency import start_server
    from rest_framework.authtoken.models import Token

    from agenttasks.models import Task

    token = Token.objects.get_or_create(user=bench_user())[0].key
    server = start_server(port)
    url = f"http://127.0.0.1:{port}/api/agents/tasks"
    headers = {"Authorization": f"Token {token}"}
    failures = []

    def create(count: int, offset: int) -> None:
        with httpx.Client(timeout=60) as client:
            for i in range(count):
                answer = client.post(
                    url, json={"agentId": "echo", "input": f"m{offset + i}"}, headers=headers
                )
                if answer.status_code != 201:
                    failures.append(answer.text)

    try:
        share = n // concurrency
        clients = [
            threading.Thread(target=create, args=(share, k * share)) for k in range(concurrency)
        ]
        started = time.monotonic()
        for client in clients:
            client.start()
        for client in clients:
            client.join()
        if failures:
            raise SystemExit(f"{len(failures)} creates failed, e.g. {failures[0]}")
        ended = wait_until(
            lambda: Task.objects.filter(status="completed").count() >= share * concurrency, 900
        )
    finally:
        server.kill()
    return share * concurrency / (ended - started)


def measure(n: int, workers_list: list[int]) -> list[tuple[int, float, float]]:
    rows = []
    for workers in workers_list:
        results = []
        for run in (bare, agenttasks):
            clean()
            # One settings module for the web server and the cluster, as a site keeps it: both
            # use the connection pool, which each forked worker must not inherit.
            cluster = Cluster(workers, env={"DB_POOL": "1"})
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
