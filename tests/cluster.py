"""A real django-q2 cluster in a subprocess, on the test database (PostgreSQL or SQLite file)."""

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

from django.db import connection

from agenttasks.broker import queue
from agenttasks.broker.listen import HOST, listener_name

ROOT = Path(__file__).resolve().parent.parent


def end_sessions(application_name: str) -> None:
    """End the database sessions a killed cluster left (PostgreSQL).

    A session whose process was killed lives on until its statement ends; one waiting for a
    lock would wait for the test database's flush, and the flush for it.
    """
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND application_name = %s",
            [application_name],
        )


def database_env() -> dict:
    """Point a subprocess at the database the tests use."""
    settings = connection.settings_dict
    if connection.vendor == "postgresql":
        user = settings.get("USER") or "postgres"
        host = settings.get("HOST") or "127.0.0.1"
        port = settings.get("PORT") or "5432"
        return {"DATABASE_URL": f"postgres://{user}@{host}:{port}/{settings['NAME']}"}
    return {"SQLITE_PATH": str(settings["NAME"])}


def run_jobs() -> int:
    """django-q2's queued jobs that execute a run: the scheduler's own jobs (the reaper's,
    retention's, a schedule's ticks), which a running cluster adds every second, left out."""
    from django_q.models import OrmQ

    return sum(1 for job in OrmQ.objects.all() if job.task.get("func") == queue.EXECUTE_RUN)


class Cluster:
    """`manage.py qcluster` with the given worker count, AGENTTASKS overrides and environment."""

    def __init__(self, workers: int = 2, settings: dict | None = None, env: dict | None = None):
        self.workers = workers
        self.settings = settings or {}
        self.env = env or {}
        self.application_name = f"agenttasks-test-cluster-{os.getpid()}-{id(self)}"
        self.process: subprocess.Popen | None = None
        self.lines: list[str] = []
        self._ready = threading.Event()

    def start(self, timeout: float = 30) -> "Cluster":
        env = {
            **os.environ,
            **database_env(),
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "Q_WORKERS": str(self.workers),
            "AGENTTASKS_TEST_SETTINGS": json.dumps(self.settings),
            "PYTHONUNBUFFERED": "1",
            "DB_POOL": "1",
            "PGAPPNAME": self.application_name,  # kill() ends its sessions by this name
            **self.env,
        }
        self._ready.clear()
        self.process = subprocess.Popen(
            [sys.executable, "manage.py", "qcluster"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # so kill() can take the whole process group
        )
        threading.Thread(target=self._read, args=(self.process,), daemon=True).start()
        if not self._ready.wait(timeout):
            self.stop()
            raise RuntimeError("cluster did not start:\n" + "\n".join(self.lines[-40:]))
        return self

    def _read(self, process):
        for line in process.stdout:
            self.lines.append(line.rstrip())
            if "ready for work" in line:
                self._ready.set()

    def kill(self) -> None:
        """SIGKILL the whole cluster (sentinel, workers, pusher, monitor): a machine dying.

        The whole process group, even when its first process has ended: a worker left behind
        would go on serving this test database to the tests that follow.
        """
        if self.process is None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass  # nothing of the group is left
        self.process.wait(10)
        end_sessions(self.application_name)

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()

    def log(self) -> str:
        return "\n".join(self.lines)

    def started_worker_pids(self) -> set[int]:
        """Every worker process this cluster has started, dead or alive."""
        return {
            int(line.rsplit(" ", 1)[1]) for line in list(self.lines) if "ready for work at" in line
        }

    def worker_pids(self) -> list[int]:
        """The live worker processes (django-q2 logs each one it starts, reincarnations too)."""
        pids = []
        for line in list(self.lines):
            if "ready for work at" in line:
                pid = int(line.rsplit(" ", 1)[1])
                try:
                    os.kill(pid, 0)
                except OSError:
                    continue
                pids.append(pid)
        return pids

    def listener_names(self) -> list[str]:
        """The session names of its workers' listeners (named for their process, not PGAPPNAME)."""
        return [listener_name(f"{HOST}:{pid}") for pid in self.started_worker_pids()]
