"""P1 throughput: N echo tasks end to end through a real cluster, beside bare django-q2 jobs.

Both run on the same PostgreSQL database with the same cluster settings in the same run:
- baseline: N django-q2 jobs that each insert one row (first enqueue to last row written);
- agenttasks: N echo tasks created with `lifecycle.create` (first create to last completed).

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/agenttasks_bench .venv/bin/python bench/throughput.py --n 2000 --workers 2 4
"""

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/agenttasks_bench")
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
os.environ.setdefault("AGENTTASKS_LOG", "WARNING")


def ensure_database() -> None:
    from urllib.parse import urlparse

    import psycopg

    url = urlparse(os.environ["DATABASE_URL"])
    name = url.path.lstrip("/")
    with psycopg.connect(
        host=url.hostname,
        port=url.port or 5432,
        user=url.username or "postgres",
        dbname="postgres",
        autocommit=True,
    ) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')


def start_cluster(workers: int) -> subprocess.Popen:
    env = {**os.environ, "Q_WORKERS": str(workers), "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(
        [sys.executable, "manage.py", "qcluster"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    ready = 0
    for line in process.stdout:
        if "ready for work" in line:
            ready += 1
            if ready == workers:
                break
    # Keep draining the log so the cluster never blocks on a full pipe.
    import threading

    threading.Thread(target=lambda: [None for _ in process.stdout], daemon=True).start()
    return process


def stop_cluster(process: subprocess.Popen) -> None:
    import signal

    os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def clean() -> None:
    from django.db import connection
    from django_q.models import OrmQ
    from django_q.models import Task as QTask

    from agenttasks.models import Conversation

    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE IF NOT EXISTS bench_rows (n integer)")
        cursor.execute("TRUNCATE bench_rows")
    Conversation.objects.all().delete()
    OrmQ.objects.all().delete()
    QTask.objects.all().delete()


def wait_until(predicate, timeout: float) -> float:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit("timed out")
        time.sleep(0.02)
    return time.monotonic()


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


def agenttasks_run(n: int) -> float:
    from django.contrib.auth import get_user_model

    from agenttasks import lifecycle
    from agenttasks.models import Task

    user, _ = get_user_model().objects.get_or_create(username="bench")
    started = time.monotonic()
    for i in range(n):
        lifecycle.create(owner=user, agent_id="echo", input=f"m{i}")
    ended = wait_until(lambda: Task.objects.filter(status="completed").count() >= n, 900)
    return n / (ended - started)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--workers", type=int, nargs="+", default=[2, 4])
    args = parser.parse_args()
    ensure_database()
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    rows = []
    for workers in args.workers:
        results = {}
        for name, fn in (("bare django-q2", bare), ("agenttasks", agenttasks_run)):
            clean()
            cluster = start_cluster(workers)
            try:
                results[name] = fn(args.n)
            finally:
                stop_cluster(cluster)
        rows.append((workers, results["bare django-q2"], results["agenttasks"]))
    print(f"\nP1 throughput, N={args.n}, PostgreSQL, ORM broker")
    print(
        f"{'workers':>7}  {'bare django-q2 jobs/s':>22}  {'agenttasks tasks/s':>19}  {'ratio':>6}"
    )
    for workers, base, ours in rows:
        print(f"{workers:>7}  {base:>22.1f}  {ours:>19.1f}  {ours / base:>6.2f}")


if __name__ == "__main__":
    main()
