"""Cost per task: the server's CPU per task, the app and PostgreSQL apart, and where it goes.

The API is served as docs/production.md recommends (gunicorn, 3 workers × 4 threads) beside the
demo's cluster (2 workers), both on the bench database. N tasks are created through
`POST /tasks` by 8 clients (echo: ApacheBench when installed; chat: Python threads, each task's
question marked so the fake model server timestamps its first request). From the first create
until every task has settled, it measures:

- the CPU seconds of the web processes, of the cluster's and of PostgreSQL's (its backends, the
  ones that exited included), per task;
- with `pg_stat_statements` loaded (`shared_preload_libraries`), each statement's calls, rows
  and time per task, the costliest first;
- the peak RSS and PSS of the serving processes (web and cluster);
- chat: the model server's peak in flight, and each task's create → first model request.

    .venv/bin/python bench/cost.py --workload echo --n 2000
    .venv/bin/python bench/cost.py --workload chat --n 1000
    .venv/bin/python bench/cost.py --workload echo --n 2000 --profile web   # py-spy, if installed
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from common import (
    Cluster,
    bench_user,
    clean,
    post_tasks,
    process_table,
    serve,
    setup_django,
    stop,
    wait_until,
)

PORT = 8768
CHAT_AGENT = "chatter"
MODEL_PORT = 8791


def memory_kib(pid: int) -> tuple[int, int]:
    """The RSS and PSS of one process (KiB), from smaps_rollup."""
    rss = pss = 0
    try:
        with open(f"/proc/{pid}/smaps_rollup") as fh:
            for line in fh:
                if line.startswith("Rss:"):
                    rss = int(line.split()[1])
                elif line.startswith("Pss:"):
                    pss = int(line.split()[1])
    except OSError:
        pass
    return rss, pss


def kind_of(row: dict, groups: dict[int, str]) -> str | None:
    if row["pgid"] in groups:
        return groups[row["pgid"]]
    if row["command"].startswith("postgres"):
        return "postgres"
    return None


def cpu_by_kind(groups: dict[int, str]) -> dict[str, float]:
    out: dict[str, float] = {}
    for row in process_table():
        kind = kind_of(row, groups)
        if kind is not None:
            out[kind] = out.get(kind, 0.0) + row["cpu"] + row["reaped"]
    return out


def serving_memory(groups: dict[int, str]) -> tuple[int, int]:
    """RSS and PSS (KiB) of every process of the serving groups (web and cluster)."""
    rss = pss = 0
    for row in process_table():
        if row["pgid"] in groups:
            one = memory_kib(row["pid"])
            rss, pss = rss + one[0], pss + one[1]
    return rss, pss


# --- pg_stat_statements ------------------------------------------------------------------------

POLL_MARK = "/* bench poll */"


def statements_available() -> bool:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('shared_preload_libraries')")
        if "pg_stat_statements" not in cursor.fetchone()[0]:
            return False
        cursor.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
    return True


def reset_statements() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_statements_reset()")


def statement_rows(n: int, top: int) -> tuple[list[dict], dict]:
    """The `top` costliest statements of this database since the reset, per task; and totals."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT query, calls, rows, total_exec_time
              FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
             WHERE d.datname = current_database() AND query NOT LIKE %s
               AND query NOT LIKE '%%pg_stat_statements%%'
             ORDER BY total_exec_time DESC
            """,
            [f"%{POLL_MARK}%"],
        )
        found = cursor.fetchall()
    totals = {
        "statements": sum(r[1] for r in found) / n,
        "ms": sum(r[3] for r in found) / n,
    }
    rows = [
        {
            "query": " ".join(query.split())[:110],
            "calls": calls / n,
            "rows": rows / n,
            "ms": total / n,
            "mean_ms": total / calls if calls else 0.0,
        }
        for query, calls, rows, total in found[:top]
    ]
    return rows, totals


TABLE_COLUMNS = ("n_tup_ins", "n_tup_upd", "n_tup_hot_upd", "seq_scan", "seq_tup_read", "idx_scan")


def table_counts() -> dict[str, list[int]]:
    """Each table's rows inserted and updated (HOT: no index written), scans and rows scanned."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT relname, {', '.join(TABLE_COLUMNS)} FROM pg_stat_user_tables"
            " WHERE relname LIKE 'agenttasks%%' OR relname LIKE 'django_q%%'"
        )
        return {name: [v or 0 for v in values] for name, *values in cursor.fetchall()}


def table_rows(before: dict, after: dict, n: int) -> list[dict]:
    """The tables' counts between two readings, per task, the busiest first."""
    rows = []
    for name, values in after.items():
        old = before.get(name, [0] * len(values))
        per_task = {c: (v - o) / n for c, v, o in zip(TABLE_COLUMNS, values, old, strict=True)}
        if any(per_task.values()):
            rows.append({"table": name, **per_task})
    return sorted(rows, key=lambda r: -(r["n_tup_ins"] + r["n_tup_upd"] + r["seq_tup_read"]))


def settled() -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT {POLL_MARK} count(*) FROM agenttasks_task"
            " WHERE status IN ('completed', 'failed', 'cancelled')"
        )
        return cursor.fetchone()[0]


# --- the two workloads -------------------------------------------------------------------------


def chat_overrides() -> dict:
    return {
        "MODEL_BASE_URL": f"http://127.0.0.1:{MODEL_PORT}/v1",
        "DEFAULT_MODEL": "fake",
        "AGENTS": {CHAT_AGENT: {"runtime": "chat", "does": "answers", "stream": True}},
    }


def post_chat_tasks(token: str, n: int, clients: int) -> dict[str, float]:
    """Create n marked chat tasks through POST /tasks from `clients` threads; their create times."""
    import httpx

    url = f"http://127.0.0.1:{PORT}/api/agents/tasks"
    headers = {"Authorization": f"Token {token}"}
    created: dict[str, float] = {}
    failures: list[str] = []

    def create(k: int) -> None:
        with httpx.Client(timeout=60) as client:
            for i in range(k, n, clients):
                mark = f"mark:{i}"
                answer = client.post(
                    url, json={"agentId": CHAT_AGENT, "input": mark}, headers=headers
                )
                if answer.status_code != 201:
                    failures.append(answer.text)
                created[mark] = time.time()

    threads = [threading.Thread(target=create, args=(k,)) for k in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise SystemExit(f"{len(failures)} creates failed, e.g. {failures[0]}")
    return created


def model_stats() -> dict:
    import httpx

    return httpx.get(f"http://127.0.0.1:{MODEL_PORT}/stats", timeout=5).json()


def py_spy(pid: int, seconds: int, out: str) -> subprocess.Popen | None:
    """Sample one process with py-spy (when installed) into a collapsed-stack file."""
    spy = shutil.which("py-spy", path=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    if spy is None:
        print("py-spy is not installed: pip install py-spy")
        return None
    return subprocess.Popen(
        [
            spy,
            "record",
            "--pid",
            str(pid),
            "--duration",
            str(seconds),
            "--rate",
            "200",
            "--format",
            "raw",
            "--output",
            out,
            "--nonblocking",
            "--subprocesses",
            "--gil",  # only the thread holding the GIL: where the CPU goes, not the waits
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def create(workload: str, token: str, n: int, clients: int) -> dict[str, float]:
    """Create n tasks of the workload through POST /tasks; chat: each one's create time."""
    if workload == "echo":
        post_tasks(PORT, token, n, clients)
        return {}
    return post_chat_tasks(token, n, clients)


def analyze() -> None:
    from django.apps import apps
    from django.db import connection

    with connection.cursor() as cursor:
        for model in apps.get_app_config("agenttasks").get_models():
            cursor.execute(f"ANALYZE {model._meta.db_table}")


def measure(workload: str, n: int, clients: int, top: int, profile: str | None, warm: bool) -> dict:
    from rest_framework.authtoken.models import Token

    token = Token.objects.get_or_create(user=bench_user())[0].key
    with_statements = statements_available()
    clean()
    cluster = Cluster(2)
    web = serve(PORT)
    groups = {web.pid: "web", cluster.process.pid: "cluster"}
    peaks = {"rss": 0, "pss": 0}
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            rss, pss = serving_memory(groups)
            peaks["rss"], peaks["pss"] = max(peaks["rss"], rss), max(peaks["pss"], pss)
            done.wait(0.5)

    sampler = threading.Thread(target=sample, daemon=True)
    spy = None
    try:
        import httpx

        if warm:
            # Steady state, not a fresh database: a first round fills the tables, ANALYZE gives
            # the planner their size (the plans each connection keeps for the SQL functions are
            # made again), and only the second round is measured.
            create(workload, token, n, clients)
            wait_until(lambda: settled() >= n, 900, poll=0.2)
            analyze()
        if workload == "chat":
            httpx.post(f"http://127.0.0.1:{MODEL_PORT}/reset", timeout=5)
        if profile:
            target = web.pid if profile == "web" else cluster.process.pid
            spy = py_spy(target, 600, f"/tmp/cost-{workload}-{profile}.txt")
        done_before = settled()
        tables_before = table_counts()
        if with_statements:
            reset_statements()
        sampler.start()
        before = cpu_by_kind(groups)
        started = time.monotonic()
        created = create(workload, token, n, clients)
        ended = wait_until(lambda: settled() >= done_before + n, 900, poll=0.2)
        after = cpu_by_kind(groups)
        time.sleep(1.5)  # backends report their table counts within a second (PostgreSQL 15)
        tables = table_rows(tables_before, table_counts(), n)
        done.set()
        sampler.join()
        statements = statement_rows(n, top) if with_statements else None
        model = model_stats() if workload == "chat" else None
    finally:
        done.set()
        if spy is not None:
            spy.send_signal(2)  # SIGINT: py-spy writes what it sampled
            spy.wait(30)
        stop(web)
        cluster.stop()
    result = {
        "workload": workload,
        "n": n,
        "seconds": ended - started,
        "cpu_ms": {k: 1000 * (v - before.get(k, 0.0)) / n for k, v in after.items()},
        "rss_mib": peaks["rss"] / 1024,
        "pss_mib": peaks["pss"] / 1024,
        "load": os.getloadavg()[0],
        "tables": tables,
    }
    if statements is not None:
        result["statements"], result["statement_totals"] = statements
    if model is not None:
        firsts = [
            model["marks"][mark] - at for mark, at in created.items() if mark in model["marks"]
        ]
        result["model_peak"] = model["peak"]
        result["first_request_p50_ms"] = 1000 * statistics.median(firsts) if firsts else None
    return result


def report(result: dict) -> None:
    cpu = result["cpu_ms"]
    print(
        f"\n{result['workload']}: {result['n']} tasks in {result['seconds']:.1f} s "
        f"(load {result['load']:.1f}); CPU per task: web {cpu.get('web', 0):.1f} ms, "
        f"cluster {cpu.get('cluster', 0):.1f} ms, PostgreSQL {cpu.get('postgres', 0):.1f} ms; "
        f"serving peak RSS {result['rss_mib']:.0f} MiB, PSS {result['pss_mib']:.0f} MiB"
    )
    if "model_peak" in result:
        first = result["first_request_p50_ms"]
        print(f"model peak {result['model_peak']}, create → first model request p50 {first:.0f} ms")
    print(
        f"{'ins/task':>9} {'upd/task':>9} {'HOT':>6} {'seq scans':>9} {'rows seq':>9}"
        f" {'idx scans':>9}  table"
    )
    for row in result["tables"]:
        print(
            f"{row['n_tup_ins']:>9.2f} {row['n_tup_upd']:>9.2f} {row['n_tup_hot_upd']:>6.2f}"
            f" {row['seq_scan']:>9.2f} {row['seq_tup_read']:>9.1f} {row['idx_scan']:>9.2f}"
            f"  {row['table']}"
        )
    if "statements" not in result:
        print("pg_stat_statements is not loaded: no statement table")
        return
    totals = result["statement_totals"]
    print(
        f"statements per task {totals['statements']:.1f}, "
        f"their execution {totals['ms']:.2f} ms per task"
    )
    print(f"{'calls/task':>10} {'rows/task':>9} {'ms/task':>8} {'mean ms':>8}  statement")
    for row in result["statements"]:
        print(
            f"{row['calls']:>10.2f} {row['rows']:>9.2f} {row['ms']:>8.3f} {row['mean_ms']:>8.3f}"
            f"  {row['query']}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workload", choices=["echo", "chat"], default="echo")
    parser.add_argument("--n", type=int, default=None, help="default: 2000 echo, 1000 chat")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--top", type=int, default=15, help="statements shown")
    parser.add_argument("--profile", choices=["web", "cluster"], default=None)
    parser.add_argument(
        "--fresh",
        action="store_true",
        help="measure the first round on emptied tables (default: a warm-up round, then ANALYZE)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON line (run.py)")
    args = parser.parse_args()
    n = args.n or (2000 if args.workload == "echo" else 1000)
    overrides = json.loads(os.environ.get("AGENTTASKS_OVERRIDES") or "{}")
    overrides.update({"MAX_ACTIVE_TASKS_PER_USER": 0, "METRICS_ENABLED": False})
    server = None
    if args.workload == "chat":
        from inflight import model_server

        overrides.update(chat_overrides())
        server = model_server(2.0, port=MODEL_PORT)
    os.environ["AGENTTASKS_OVERRIDES"] = json.dumps(overrides)
    setup_django()
    try:
        result = measure(args.workload, n, args.clients, args.top, args.profile, not args.fresh)
    finally:
        if server is not None:
            server.terminate()
    if args.json:
        print(json.dumps(result))
    else:
        report(result)


if __name__ == "__main__":
    main()
