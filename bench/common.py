"""Shared setup for the benchmarks: a PostgreSQL bench database and a cluster subprocess."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
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
    # Metrics off, as the baselines were measured (a site that does not scrape writes no counter).
    os.environ.setdefault(
        "AGENTTASKS_OVERRIDES", '{"MAX_ACTIVE_TASKS_PER_USER": 0, "METRICS_ENABLED": false}'
    )
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


# How the README recommends serving the API in production, and how the benchmarks serve it.
WEB_WORKERS = 3


def serve(port: int, server: str = "gunicorn", env: dict | None = None) -> subprocess.Popen:
    """Serve the demo site on 127.0.0.1:`port` and wait until it answers.

    gunicorn: WSGI, WEB_WORKERS processes of 4 threads each with persistent connections
    (CONN_MAX_AGE), the app loaded before the fork (`--preload`), as docs/production.md serves
    it; uvicorn: ASGI, WEB_WORKERS processes with Django's connection pool.
    """
    import httpx

    if server == "gunicorn":
        command = [
            "gunicorn",
            "project.wsgi:application",
            f"--bind=127.0.0.1:{port}",
            f"--workers={WEB_WORKERS}",
            "--worker-class=gthread",
            "--threads=4",
            "--preload",
        ]
        extra = {}
    else:
        command = [
            "uvicorn",
            "project.asgi:application",
            f"--port={port}",
            f"--workers={WEB_WORKERS}",
            "--no-access-log",
        ]
        extra = {"DB_POOL": "1"}
    process = subprocess.Popen(
        [sys.executable, "-m", *command],
        cwd=ROOT,
        env={**os.environ, **extra, **(env or {})},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )

    def answers() -> bool:
        try:
            return httpx.get(
                f"http://127.0.0.1:{port}/api/agents/agents", timeout=1
            ).status_code in (
                200,
                401,
            )
        except httpx.HTTPError:
            return False

    wait_until(answers, 30, poll=0.2)
    return process


def process_table() -> list[dict]:
    """Every process of this machine: pid, process group, command, and its CPU seconds (`cpu`)
    and those of the children it has reaped (`reaped`: exited backends, replaced workers)."""
    tick = os.sysconf("SC_CLK_TCK")
    rows = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                command = fh.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        rows.append(
            {
                "pid": int(entry),
                "pgid": int(fields[2]),
                "command": command,
                "cpu": (int(fields[11]) + int(fields[12])) / tick,
                "reaped": (int(fields[13]) + int(fields[14])) / tick,
            }
        )
    return rows


def stop(process: subprocess.Popen) -> None:
    """Kill a server or cluster started by the benchmarks, with every process it forked."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def post_tasks(port: int, token: str, n: int, clients: int = 8) -> float:
    """Create `n` echo tasks through POST /tasks from `clients` connections; return the seconds.

    With ApacheBench (`ab`, Debian's apache2-utils) when it is installed: a C client leaves the
    two cores to the server and the database. Otherwise `clients` Python threads with httpx.
    """
    if shutil.which("ab"):
        return _ab_post(port, token, n, clients)
    return _httpx_post(port, token, n, clients)


def _ab_post(port: int, token: str, n: int, clients: int) -> float:
    with tempfile.NamedTemporaryFile("w", suffix=".json") as body:
        json.dump({"agentId": "echo", "input": "m"}, body)
        body.flush()
        return ab_seconds(f"http://127.0.0.1:{port}/api/agents/tasks", token, n, clients, body.name)


def ab_seconds(url: str, token: str, n: int, clients: int, body: str | None = None) -> float:
    """Send `n` requests (a POST of the JSON file `body`, else a GET) with ab; return the seconds."""
    command = ["ab", "-q", "-n", str(n), "-c", str(clients), "-H", f"Authorization: Token {token}"]
    if body is not None:
        command += ["-p", body, "-T", "application/json"]
    out = subprocess.run([*command, url], capture_output=True, text=True, check=True).stdout
    failed = re.search(r"Failed requests:\s+(\d+)", out)
    taken = re.search(r"Time taken for tests:\s+([\d.]+)", out)
    if (failed and int(failed.group(1))) or "Non-2xx" in out or taken is None:
        raise SystemExit(f"requests failed:\n{out}")
    return float(taken.group(1))


def _httpx_post(port: int, token: str, n: int, clients: int) -> float:
    import httpx

    url = f"http://127.0.0.1:{port}/api/agents/tasks"
    headers = {"Authorization": f"Token {token}"}
    failures: list[str] = []
    share = n // clients

    def create(offset: int) -> None:
        with httpx.Client(timeout=60) as client:
            for i in range(share):
                answer = client.post(
                    url, json={"agentId": "echo", "input": f"m{offset + i}"}, headers=headers
                )
                if answer.status_code != 201:
                    failures.append(answer.text)

    threads = [threading.Thread(target=create, args=(k * share,)) for k in range(clients)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise SystemExit(f"{len(failures)} creates failed, e.g. {failures[0]}")
    return time.monotonic() - started


def broker_env(broker: str) -> dict:
    """The environment that points the demo settings at a django-q2 broker."""
    return {"Q_BROKER": broker}


class Cluster:
    """`manage.py qcluster` on the bench database; knows its workers' pids from its log."""

    def __init__(self, workers: int, env: dict | None = None):
        self.workers = workers
        self.pids: list[int] = []
        self.lines: list[str] = []  # what it logged (BENCH_CLUSTER_LOG=path writes it there too)
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
                self.lines.append(line)
                if "ready for work at" in line:
                    self.pids.append(int(line.rsplit(" ", 1)[1]))
                    if len(self.pids) >= workers:
                        ready.set()

        threading.Thread(target=read, daemon=True).start()
        if not ready.wait(60):
            self.stop()
            raise SystemExit("the cluster did not start")

    def stop(self) -> None:
        stop(self.process)
        if os.environ.get("BENCH_CLUSTER_LOG"):
            Path(os.environ["BENCH_CLUSTER_LOG"]).write_text("".join(self.lines))


def clean() -> None:
    """Empty agenttasks' and django-q2's tables between measurements."""
    from django.apps import apps
    from django.db import connection
    from django_q.models import OrmQ
    from django_q.models import Task as QTask

    tables = [model._meta.db_table for model in apps.get_app_config("agenttasks").get_models()]
    # django-q2's queue too: deleted rows would stay behind as dead ones where autovacuum is off
    # (as on the CI's PostgreSQL), and slow the bare baseline's queue round after round.
    tables += [OrmQ._meta.db_table, QTask._meta.db_table]
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE IF NOT EXISTS bench_rows (n integer)")
        cursor.execute(f"TRUNCATE bench_rows, {', '.join(tables)} CASCADE")
    from django_q.brokers import get_broker

    get_broker().purge_queue()
    from agenttasks.flow import budgets, redis_store

    if budgets.in_redis():
        redis_store.clear()


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
