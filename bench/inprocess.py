"""In process, without HTTP: the median cost of one create and one `execute_run` of an echo task.

Each step is timed N times on PostgreSQL with the django-q2 broker as configured (the create
writes the first run's job), with the SQL statements it sends. `--profile` prints where the time
of one step goes (cProfile, by internal time).

    .venv/bin/python bench/inprocess.py --n 500 [--profile] [--json]

DB_PREPARED=0 measures it without prepared statements (psycopg binding the parameters itself).
"""

import argparse
import cProfile
import json
import pstats
import statistics
import time

from common import bench_user, clean, setup_django

CONTROL = ("BEGIN", "COMMIT", "ROLLBACK", "SAVEPOINT", "RELEASE SAVEPOINT")


def statements(fn) -> int:
    """Count the SQL statements `fn` sends (transaction control not counted)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as captured:
        fn()
    return sum(1 for q in captured.captured_queries if not q["sql"].startswith(CONTROL))


def measure(n: int) -> dict[str, tuple[float, int]]:
    """Return {step: (median milliseconds, statements)} for create and execute_run."""
    from agenttasks import lifecycle
    from agenttasks.execution import worker

    clean()
    user = bench_user()

    def create():
        return lifecycle.create(owner=user, agent_id="echo", input="hello")

    for _ in range(20):  # warm up: connections, plans, imports
        worker.execute_run(create().run_id)
    create_ms, execute_ms = [], []
    for _ in range(n):
        started = time.perf_counter()
        task = create()
        created = time.perf_counter()
        worker.execute_run(task.run_id)
        create_ms.append((created - started) * 1000)
        execute_ms.append((time.perf_counter() - created) * 1000)
    tasks = []
    create_statements = statements(lambda: tasks.append(create()))
    execute_statements = statements(lambda: worker.execute_run(tasks[0].run_id))
    return {
        "create": (statistics.median(create_ms), create_statements),
        "execute_run (echo)": (statistics.median(execute_ms), execute_statements),
    }


def profile(n: int) -> None:
    from agenttasks import lifecycle
    from agenttasks.execution import worker

    user = bench_user()
    creating = cProfile.Profile()
    creating.enable()
    tasks = [lifecycle.create(owner=user, agent_id="echo", input="hello") for _ in range(n)]
    creating.disable()
    executing = cProfile.Profile()
    executing.enable()
    for task in tasks:
        worker.execute_run(task.run_id)
    executing.disable()
    for name, profiler in (("create", creating), ("execute_run", executing)):
        print(f"\n--- {name}, {n} times, by internal time")
        pstats.Stats(profiler).sort_stats("tottime").print_stats(15)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=500)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON line")
    args = parser.parse_args()
    setup_django()
    figures = measure(args.n)
    if args.json:
        print(json.dumps(figures))
        return
    for step, (ms, count) in figures.items():
        print(f"  {step:<20} median {ms:6.2f} ms  {count} statements")
    if args.profile:
        profile(args.n)


if __name__ == "__main__":
    main()
