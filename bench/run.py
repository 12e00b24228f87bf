"""`make bench`: every benchmark in one run on PostgreSQL, each figure beside its baseline.

.venv/bin/python bench/run.py [--quick]

P1 runs in subprocesses (one per broker: django-q2 reads its broker when it is imported), the
rest in this process.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import creates
import inprocess
import latency
import list_scale
import memory
import startup
import statements
import triggers
from common import setup_django

HERE = Path(__file__).resolve().parent
# P1's goals (docs/performance.md#cost-per-task): agenttasks beside bare django-q2, by broker.
P1_GOALS = {"orm": 0.8, "redis": 0.6}


def last_json(script: str, *args: str):
    """Run a bench script in a subprocess (its settings are read at Django's setup); return the
    JSON of its last line."""
    output = subprocess.run(
        [sys.executable, script, *args, "--json"],
        cwd=HERE,
        env=os.environ.copy(),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return json.loads(output.strip().splitlines()[-1])


def throughput(n: int, broker: str) -> tuple[float, float]:
    """P1 for one broker, in a subprocess: (bare django-q2 jobs/s, agenttasks tasks/s)."""
    ((_, base, ours),) = last_json("throughput.py", f"--n={n}", "--workers=2", f"--broker={broker}")
    return base, ours


def tracing_overhead(n: int) -> tuple[float, float, int]:
    """P1 on the ORM broker with TRACING off and on, in a subprocess: (off, on, spans)."""
    off, on, spans = last_json("throughput.py", f"--n={n}", "--broker=orm", "--tracing")
    return off, on, spans


def cost(n_echo: int, n_chat: int, rounds: int = 3) -> dict[str, dict]:
    """The server's CPU per task (web, cluster, PostgreSQL) and the serving's peak PSS, echo and
    chat interleaved, in subprocesses: the medians of `rounds` runs of bench/cost.py."""
    runs: dict[str, list[dict]] = {"echo": [], "chat": []}
    for _ in range(rounds):
        for workload, n in (("echo", n_echo), ("chat", n_chat)):
            runs[workload].append(last_json("cost.py", f"--workload={workload}", f"--n={n}"))
    medians = {}
    for workload, results in runs.items():
        cpu = {
            part: statistics.median(r["cpu_ms"].get(part, 0.0) for r in results)
            for part in ("web", "cluster", "postgres")
        }
        medians[workload] = {
            "cpu_ms": cpu,
            "pss_mib": statistics.median(r["pss_mib"] for r in results),
            "seconds": statistics.median(r["seconds"] for r in results),
            "statements": statistics.median(
                r.get("statement_totals", {}).get("statements", 0.0) for r in results
            ),
        }
    return medians


def in_flight(n: int, slots: int | None = None, start: int = 0) -> dict:
    """P6 in a subprocess (its AGENTTASKS overrides are read at Django's setup)."""
    command = [sys.executable, "inflight.py", f"--n={n}", f"--start={start}", "--json"]
    if slots is not None:
        command.append(f"--slots={slots}")
    output = subprocess.run(
        command, cwd=HERE, env=os.environ.copy(), capture_output=True, text=True, check=True
    ).stdout
    return json.loads(output.strip().splitlines()[-1])


def provider_limits(n: int, scenario: str, configured: bool = True, broker: str = "orm") -> dict:
    """P9 in a subprocess: one scenario of bench/limits.py against a provider of 50 requests/s."""
    command = [sys.executable, "limits.py", f"--n={n}", f"--scenario={scenario}", "--json"]
    command.append(f"--broker={broker}")
    if not configured:
        command.append("--unconfigured")
    output = subprocess.run(
        command, cwd=HERE, env=os.environ.copy(), capture_output=True, text=True, check=True
    ).stdout
    return json.loads(output.strip().splitlines()[-1])


def limit_rows(n: int) -> list[tuple[str, str, str, str]]:
    """P9: the provider's limit, configured and learned; fairness; priority; two clusters."""
    rows = []
    for configured in (True, False):
        burst = provider_limits(n, "burst", configured)
        failed = burst["statuses"].get("failed", 0)
        rows.append(
            (
                f"P9 {n} chat tasks against 50 requests/s, the limit "
                + ("configured" if configured else "learned from 429s"),
                f"{burst['seconds']:.1f} s",
                f"{burst['seconds'] / burst['ideal']:.2f}x ideal {burst['ideal']:g} s; {failed} "
                f"failed, {burst['refused']} 429s, busiest second {burst['busiestSecond']}",
                "goal <= 1.2x, 0 failed" + (", 0 429s" if configured else ""),
            )
        )
    for broker, shared in (("orm", "one database"), ("redis", "one Redis (the budget there)")):
        two = provider_limits(n, "two-clusters", broker=broker)
        rows.append(
            (
                f"P9 two clusters on {shared}, {n} tasks, the limit configured",
                f"{two['seconds']:.1f} s",
                f"{two['refused']} 429s, busiest second {two['busiestSecond']}",
                "goal busiest second <= 50",
            )
        )
    fair = provider_limits(n, "fairness")
    rows.append(
        (
            f"P9 fairness: user B's 10 tasks, one a second, behind user A's {n}",
            f"p95 {fair['b_request_p95']:.2f} s to its first model request",
            f"p50 {fair['b_request_p50']:.2f} s; claimed p95 {fair['b_claimed_p95']:.2f} s, "
            f"p50 {fair['b_claimed_p50']:.2f} s; A drained in {fair['a_seconds']:.1f} s",
            "goal p95 <= 2 s",
        )
    )
    urgent = provider_limits(n, "priority")
    rows.append(
        (
            f"P9 priority: a priority-100 task behind {n} queued",
            f"{urgent['urgent_request']:.2f} s to its first model request",
            f"claimed after {urgent['urgent_claimed']:.2f} s",
            "goal <= 1 s",
        )
    )
    return rows


def in_process_unprepared(n: int) -> dict[str, list]:
    """The in-process figures without prepared statements, in a subprocess."""
    output = subprocess.run(
        [sys.executable, "inprocess.py", f"--n={n}", "--json"],
        cwd=HERE,
        env={**os.environ, "DB_PREPARED": "0"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return json.loads(output.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="smaller N everywhere (a smoke run)")
    args = parser.parse_args()
    n, k, scale, memory_n, steps, flying = (
        (300, 10, 20_000, 2_000, 100, 300)
        if args.quick
        else (2_000, 30, 1_000_000, 10_000, 500, 1_000)
    )
    rows: list[tuple[str, str, str, str]] = []

    started = startup.imports(3 if args.quick else 7)
    rows.append(
        (
            "P10 start-up: manage.py check, imports of agenttasks and its surfaces",
            f"{started['ours_ms']:.0f} ms",
            f"all imports {started['every_ms']:.0f} ms",
            "goal < 1000 ms",
        )
    )
    print_table(rows)

    rows.extend(limit_rows(flying))
    print_table(rows)

    many = in_flight(flying, start=k)
    one = in_flight(100, slots=1)
    rows.append(
        (
            f"P6 in flight: {flying} chat tasks, model {many['latency']:g} s, demo cluster "
            f"({many['workers']} workers)",
            f"{many['seconds']:.1f} s",
            f"ideal {many['latency']:g} s; model peak {many['model_peak']}",
            "goal <= 15 s, peak >= 300",
        )
    )
    rows.append(
        (
            "P6 at that peak: cluster memory, PostgreSQL connections",
            f"{many['rss_mib']:.0f} MiB",
            f"{many['connections']} connections",
            "goal <= 1024 MiB, <= 50",
        )
    )
    rows.append(
        (
            "P6 one slot per process: 100 chat tasks, the same model",
            f"{one['seconds']:.1f} s",
            f"model peak {one['model_peak']}",
            "",
        )
    )
    start_ms = [1000 * seconds for seconds in many["start"]]
    rows.append(
        (
            f"P3 a single task's start after its create, {k} tasks",
            f"p50 {statistics.median(start_ms):.0f} ms",
            f"p95 {latency.percentile(start_ms, 0.95):.0f} ms",
            "goal p50 <= 100 ms",
        )
    )
    print_table(rows)

    for broker in ("orm", "redis"):
        base, ours = throughput(n, broker)
        rows.append(
            (
                f"P1 end to end, {broker} broker, 2 workers, N={n}, median of 3",
                f"{ours:.1f} tasks/s",
                f"bare django-q2 {base:.1f} jobs/s",
                f"{ours / base:.2f}x (goal >= {P1_GOALS[broker]}x)",
            )
        )
        print_table(rows)

    goals = {"echo": "goal <= 10 ms app + 5 ms PostgreSQL", "chat": "goal <= 15 + 6 ms"}
    for workload, figures in cost(n, flying).items():
        cpu = figures["cpu_ms"]
        rows.append(
            (
                f"Cost per {workload} task through REST (gunicorn 3x4 --preload, 2 workers), "
                f"N={n if workload == 'echo' else flying}, median of 3 interleaved",
                f"web {cpu['web']:.1f} + cluster {cpu['cluster']:.1f} ms, "
                f"PostgreSQL {cpu['postgres']:.1f} ms CPU a task",
                f"{figures['statements']:.1f} statements a task, serving PSS "
                f"{figures['pss_mib']:.0f} MiB, {figures['seconds']:.1f} s",
                goals[workload] + ("; PSS <= 400 MiB" if workload == "chat" else ""),
            )
        )
    idle = last_json("idle.py", "--seconds=20", "--rounds=2")
    rows.append(
        (
            "An idle demo cluster (2 workers) for 20 s, medians of 2 interleaved",
            f"{idle['listening']['cluster']:.1f} % of a core + PostgreSQL "
            f"{idle['listening']['postgres']:.1f} % (ListeningORM)",
            f"django-q2's ORM broker (poll 0.05 s): {idle['polling']['cluster']:.1f} % + "
            f"{idle['polling']['postgres']:.1f} %",
            "no idle polling",
        )
    )
    print_table(rows)

    off, on, spans = tracing_overhead(n)
    rows.append(
        (
            f"P1 with TRACING on (OTLP to a receiver on loopback), orm broker, N={n}, median of 3",
            f"{on:.1f} tasks/s ({spans} spans received)",
            f"off {off:.1f} tasks/s",
            f"{on / off:.2f}x (goal >= 0.9x)",
        )
    )
    print_table(rows)

    setup_django()
    for step, (ms, count) in inprocess.measure(steps).items():
        rows.append(
            (
                f"In process: {step}, median of {steps}",
                f"{ms:.2f} ms",
                f"{count} statements",
                "goal <= 3 ms",
            )
        )
    for step, (ms, _) in in_process_unprepared(steps).items():
        rows.append((f"  the same without prepared statements: {step}", f"{ms:.2f} ms", "", ""))
    for step, (before, after) in triggers.measure(steps, 3).items():
        rows.append(
            (
                f"A task's {step}: the statement with its triggers, N={steps}, median of 3",
                f"{after:.0f} µs",
                f"with the four triggers before migration 0036: {before:.0f} µs",
                "",
            )
        )
    rate, base = creates.measure(n)
    rows.append(
        (
            f"POST /tasks, 8 clients, {creates.SERVED}",
            f"{rate:.0f} creates/s",
            f"GET /agents {base:.0f}/s",
            "goal >= 300/s",
        )
    )
    print_table(rows)

    steps_counted = statements.measure()
    for name, count in steps_counted:
        rows.append((f"P2 statements: {name}", str(count), "", ""))
    total = steps_counted[0][1] + steps_counted[1][1] + steps_counted[2][1]
    rows.append(("P2 statements: create -> claim -> finish", str(total), "", "goal <= 20"))

    print_table(rows)
    for name, values in latency.measure(k, 8765).items():
        ms = [max(v, 0) * 1000 for v in values]
        rows.append(
            (
                f"P3 wake latency: {name}",
                f"p50 {statistics.median(ms):.1f} ms",
                f"p95 {latency.percentile(ms, 0.95):.1f} ms",
                "goal p50 <= 100 ms",
            )
        )

    print_table(rows)
    scale_figures = list_scale.measure(scale, 1000, 8766)
    total_tasks = int(scale_figures["tasks"])
    running, newest = scale_figures["running"], scale_figures["newest"]
    rows.append(
        (
            f"P4 list, {total_tasks:,} tasks: status=running",
            f"median {running:.1f} ms",
            "",
            "goal <= 30 ms",
        )
    )
    rows.append(
        (
            f"P4 list, {total_tasks:,} tasks: newest page",
            f"median {newest:.1f} ms",
            "",
            "goal <= 30 ms",
        )
    )
    rows.append(
        (
            f"P4 list, {total_tasks:,} tasks: a cursor page after offset 500",
            f"median {scale_figures['cursor']:.1f} ms",
            "",
            "goal <= 30 ms",
        )
    )
    rows.append(
        (
            f"P4 metrics scrape, {total_tasks:,} tasks",
            f"median {scale_figures['scrape']:.1f} ms",
            "",
            "goal < 100 ms",
        )
    )

    samples = memory.measure(memory_n, 1000)
    warm, last = samples[0][1], samples[-1][1]
    rows.append(
        (
            f"P5 worker RSS over {memory_n} tasks",
            f"{last / 1024:.1f} MiB",
            f"after warm-up {warm / 1024:.1f} MiB",
            f"{100 * (last - warm) / warm:+.1f}% (goal <= 10%)",
        )
    )

    print_table(rows)


def print_table(rows) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    print(flush=True)
    for row in rows:
        print("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)), flush=True)


if __name__ == "__main__":
    main()
