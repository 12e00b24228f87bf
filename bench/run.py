"""`make bench`: every benchmark in one run on PostgreSQL, printed as one table.

.venv/bin/python bench/run.py [--quick]
"""

import argparse
import statistics

import latency
import list_scale
import memory
import statements
import throughput
from common import setup_django


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="smaller N everywhere (a smoke run)")
    args = parser.parse_args()
    n, k, scale, memory_n = (
        (300, 10, 20_000, 2_000) if args.quick else (2_000, 30, 1_000_000, 10_000)
    )
    setup_django()
    rows: list[tuple[str, str, str, str]] = []

    for workers, base, ours in throughput.measure(n, [2, 4]):
        rows.append(
            (
                f"P1 throughput, {workers} workers, N={n}",
                f"{ours:.1f} tasks/s",
                f"bare django-q2 {base:.1f} jobs/s",
                f"{ours / base:.2f}x (goal >= 0.7x)",
            )
        )

    print_table(rows)
    steps = statements.measure()
    for name, count in steps:
        rows.append((f"P2 statements: {name}", str(count), "", ""))
    total = steps[0][1] + steps[1][1] + steps[2][1]
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
    running, newest, total_tasks = list_scale.measure(scale, 1000, 8766)
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
