"""P6, runs in flight: chat tasks against a model that answers after 2 s, on the demo's cluster.

N chat tasks are created in this process (4 threads); the clock runs from the first create until
every task has settled. The fake model server (bench/model_server.py, a process of its own)
streams each reply in 20 pieces, the first after half the latency, and counts the requests it
holds at once. While the tasks run, the cluster's memory (the RSS of every process of its group)
and the connections to PostgreSQL are sampled; their peaks are reported.

    .venv/bin/python bench/inflight.py --n 1000 --latency 2
    .venv/bin/python bench/inflight.py --n 100 --slots 1      # one slot per process
"""

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
from common import Cluster, bench_user, clean, process_table, setup_django, wait_until

HERE = Path(__file__).resolve().parent
MODEL_PORT = 8790
AGENT = "chatter"
TERMINAL = ("completed", "failed", "cancelled")


def overrides(slots: int | None) -> dict:
    """The AGENTTASKS overrides of this benchmark (the cluster reads them too)."""
    values = {
        "MAX_ACTIVE_TASKS_PER_USER": 0,
        "METRICS_ENABLED": False,  # as the baselines were measured
        "MODEL_BASE_URL": f"http://127.0.0.1:{MODEL_PORT}/v1",
        "DEFAULT_MODEL": "fake",
        "AGENTS": {AGENT: {"runtime": "chat", "does": "answers", "stream": True}},
    }
    if slots is not None:
        values["WORKER_SLOTS"] = slots
    return values


def model_server(
    latency: float, pieces: int = 20, port: int = MODEL_PORT, rate: int = 0
) -> subprocess.Popen:
    """Start bench/model_server.py (`rate`: refuse beyond that many starts a second)."""
    process = subprocess.Popen(
        [
            sys.executable,
            str(HERE / "model_server.py"),
            f"--port={port}",
            f"--latency={latency}",
            f"--pieces={pieces}",
            f"--rate={rate}",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    process.stdout.readline()  # "listening on …"
    return process


def stats() -> dict:
    return httpx.get(f"http://127.0.0.1:{MODEL_PORT}/stats", timeout=5).json()


def group_rss_kib(pgid: int) -> int:
    """The resident memory of every process in a process group (KiB)."""
    total = 0
    for row in process_table():
        if row["pgid"] != pgid:
            continue
        try:
            with open(f"/proc/{row['pid']}/status") as fh:
                for line in fh:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
        except (OSError, IndexError, ValueError):
            continue
    return total


def cpu_seconds() -> dict[str, float]:
    """CPU seconds so far of this machine's processes, by what they are."""
    out: dict[str, float] = {}
    for row in process_table():
        command = row["command"]
        if "qcluster" in command:
            kind = "cluster"
        elif command.startswith("postgres"):
            kind = "postgres"
        elif "model_server" in command:
            kind = "model server"
        elif row["pid"] == os.getpid():
            kind = "bench (creates, sampling)"
        else:
            continue
        out[kind] = out.get(kind, 0.0) + row["cpu"]
    return out


def connections() -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()")
        return cursor.fetchone()[0]


def settled() -> int:
    from agenttasks.models import Task

    return Task.objects.filter(status__in=TERMINAL).count()


def create(n: int, threads: int = 4, owner=None, text="question", **fields) -> list[str]:
    """Create n chat tasks (of `owner`, else the bench user) in `threads` threads; their ids.

    Their questions are `text` and a number."""
    from django.db import connection

    from agenttasks import lifecycle

    user = owner or bench_user()
    made: list[str] = []

    def make(share: int) -> None:
        try:
            for i in range(share):
                task = lifecycle.create(owner=user, agent_id=AGENT, input=f"{text} {i}", **fields)
                made.append(task.id)
        finally:
            connection.close()

    shares = [n // threads + (1 if k < n % threads else 0) for k in range(threads)]
    workers = [threading.Thread(target=make, args=(share,)) for share in shares]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return made


def measure(n: int, workers: int) -> dict:
    """Run N tasks on a fresh cluster; return the seconds and the peaks."""
    from agenttasks.models import Task

    clean()
    cluster = Cluster(workers)
    peaks = {"rss": 0, "connections": 0}
    done = threading.Event()

    def sample() -> None:
        from django.db import connection

        try:
            while not done.is_set():
                peaks["rss"] = max(peaks["rss"], group_rss_kib(cluster.process.pid))
                peaks["connections"] = max(peaks["connections"], connections())
                if os.environ.get("BENCH_TRACE"):
                    print(f"{time.monotonic():.1f} settled={settled()} model={stats()}", flush=True)
                done.wait(0.2)
        finally:
            connection.close()

    try:
        httpx.post(f"http://127.0.0.1:{MODEL_PORT}/reset", timeout=5)
        sampler = threading.Thread(target=sample)
        sampler.start()
        cpu_before = cpu_seconds()
        started = time.monotonic()
        create(n)
        created = time.monotonic() - started
        ended = wait_until(lambda: settled() >= n, 600, poll=0.05)
        cpu_after = cpu_seconds()
        done.set()
        sampler.join()
        figures = stats()
        completed = Task.objects.filter(status="completed").count()
    finally:
        done.set()
        cluster.stop()
    return {
        "seconds": ended - started,
        "created": created,
        "completed": completed,
        "model_peak": figures["peak"],
        "rss_mib": peaks["rss"] / 1024,
        "connections": peaks["connections"],
        "cpu": {k: round(v - cpu_before.get(k, 0.0), 2) for k, v in cpu_after.items()},
    }


def start_latency(k: int, workers: int) -> list[float]:
    """Seconds from each create to its run's start, one echo task at a time on an idle cluster."""
    from agenttasks import lifecycle
    from agenttasks.models import Run, Task, WorkerProcess

    clean()
    cluster = Cluster(workers)
    user = bench_user()
    try:
        wait_until(lambda: WorkerProcess.objects.count() >= workers, 30)
        seconds = []
        for i in range(k):
            task = lifecycle.create(owner=user, agent_id="echo", input=f"start {i}")
            done = Task.objects.filter(pk=task.id, status__in=TERMINAL)
            wait_until(done.exists, 30)
            started_at = Run.objects.values_list("started_at", flat=True).get(pk=task.run_id)
            seconds.append((started_at - task.created_at).total_seconds())
    finally:
        cluster.stop()
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--latency", type=float, default=2.0)
    parser.add_argument("--pieces", type=int, default=20)
    parser.add_argument("--workers", type=int, default=None, help="default: the demo's")
    parser.add_argument("--slots", type=int, default=None, help="default: the demo's")
    parser.add_argument("--start", type=int, default=0, help="also K single tasks' start latency")
    parser.add_argument("--json", action="store_true", help="print one JSON line (run.py)")
    args = parser.parse_args()
    os.environ["AGENTTASKS_OVERRIDES"] = json.dumps(overrides(args.slots))
    if args.workers is not None:
        os.environ["Q_WORKERS"] = str(args.workers)
    setup_django()
    from django.conf import settings

    workers = settings.Q_CLUSTER["workers"]
    server = model_server(args.latency, args.pieces)
    try:
        result = measure(args.n, workers)
        if args.start:
            result["start"] = start_latency(args.start, workers)
    finally:
        server.terminate()
    result.update(n=args.n, workers=workers, latency=args.latency)
    if args.json:
        print(json.dumps(result))
        return
    print(
        f"P6: {args.n} chat tasks, model {args.latency:g} s, {workers} workers: "
        f"{result['seconds']:.1f} s (ideal {args.latency:g} s), "
        f"{result['completed']} completed, model peak {result['model_peak']}, "
        f"cluster RSS {result['rss_mib']:.0f} MiB, {result['connections']} connections "
        f"(creates took {result['created']:.1f} s)"
    )
    print("CPU seconds:", ", ".join(f"{k} {v:.1f}" for k, v in result["cpu"].items()))
    if args.start:
        ms = sorted(1000 * s for s in result["start"])
        print(f"start latency of a single task: p50 {ms[len(ms) // 2]:.0f} ms, max {ms[-1]:.0f} ms")


if __name__ == "__main__":
    main()
