"""Shared setup for the benchmarks: a PostgreSQL bench database and a cluster subprocess."""

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/agenttasks_bench"


def setup_django() -> None:
    """Point Django at the bench database (created when missing) and migrate it."""
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DATABASE_URL", DEFAULT_URL)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    os.environ.setdefault("AGENTTASKS_LOG", "WARNING")
    os.environ.setdefault("DJANGO_DEBUG", "0")  # DEBUG keeps every query: slower, and it grows
    os.environ.setdefault("Q_LOG_LEVEL", "WARNING")  # not one "Enqueued" line per task here
    os.environ.setdefault("AGENTTASKS_OVERRIDES", '{"MAX_ACTIVE_TASKS_PER_USER": 0}')
    _ensure_database(os.environ["DATABASE_URL"])
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def _ensure_database(url: str) -> None:
    import psycopg

    parts = urlparse(url)
    name = parts.path.lstrip("/")
    with psycopg.connect(
        host=parts.hostname,
        port=parts.port or 5432,
        user=parts.username or "postgres",
        dbname="postgres",
        autocommit=True,
    ) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')


class Cluster:
    """`manage.py qcluster` on the bench database; knows its workers' pids from its log."""

    def __init__(self, workers: int, env: dict | None = None):
        self.workers = workers
        self.pids: list[int] = []
        self.process = subprocess.Popen(
            [sys.executable, "manage.py", "qcluster"],
            cwd=ROOT,
            # The cluster logs at INFO: its "ready for work" lines say when (and where) it runs.
            env={
                **os.environ,
                "Q_WORKERS": str(workers),
                "Q_LOG_LEVEL": "INFO",
                "PYTHONUNBUFFERED": "1",
                **(env or {}),
            },
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        ready = threading.Event()

        def read():
            for line in self.process.stdout:
                if "ready for work at" in line:
                    self.pids.append(int(line.rsplit(" ", 1)[1]))
                    if len(self.pids) >= workers:
                        ready.set()

        threading.Thread(target=read, daemon=True).start()
        if not ready.wait(60):
            self.stop()
            raise SystemExit("the cluster did not start")

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


def clean() -> None:
    """Empty agenttasks' and django-q2's tables between measurements."""
    from django.apps import apps
    from django.db import connection
    from django_q.models import OrmQ
    from django_q.models import Task as QTask

    tables = [model._meta.db_table for model in apps.get_app_config("agenttasks").get_models()]
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE IF NOT EXISTS bench_rows (n integer)")
        cursor.execute(f"TRUNCATE bench_rows, {', '.join(tables)} CASCADE")
    OrmQ.objects.all().delete()
    QTask.objects.all().delete()


def wait_until(predicate, timeout: float, poll: float = 0.05) -> float:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit("timed out")
        time.sleep(poll)
    return time.monotonic()


def bench_user():
    from django.contrib.auth import get_user_model

    user, _ = get_user_model().objects.get_or_create(username="bench")
    return user
