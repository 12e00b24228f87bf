"""What a task's triggers cost: its insert and two status changes, with the one row trigger of
migration 0036 (`agenttasks_task_changed_v1`) and with the four triggers it replaced, in one run.

Each round copies N finished tasks as new pending ones, claims them (pending -> running) and ends
them (running -> completed), one statement each from a PL/pgSQL loop, in a transaction that is
rolled back (and vacuumed away before the next round). A round of the replaced triggers runs
migration 0036's way back inside its transaction (their functions stay installed for it).
Medians of interleaved rounds, in microseconds a statement.

    .venv/bin/python bench/triggers.py --n 2000 --rounds 3
"""

import argparse
import importlib
import json
import statistics
import time

from common import bench_user, clean, setup_django

STEPS = {
    "insert": """
        DO $$ DECLARE s agenttasks_task; BEGIN
          FOR s IN SELECT * FROM bench_source LOOP
            INSERT INTO agenttasks_task SELECT s.*;
          END LOOP; END $$""",
    "claim (pending -> running)": """
        DO $$ DECLARE c text; BEGIN
          FOR c IN SELECT id FROM bench_source LOOP
            UPDATE agenttasks_task SET status = 'running', started_at = now(),
                   updated_at = now(), version = version + 1 WHERE id = c;
          END LOOP; END $$""",
    "ending (running -> completed)": """
        DO $$ DECLARE c text; BEGIN
          FOR c IN SELECT id FROM bench_source LOOP
            UPDATE agenttasks_task SET status = 'completed', result = 'done',
                   finished_at = now(), updated_at = now(), version = version + 1 WHERE id = c;
          END LOOP; END $$""",
}


def fill(n: int) -> None:
    """N finished echo tasks to copy from."""
    from agenttasks import lifecycle
    from agenttasks.execution import worker

    user = bench_user()
    for _ in range(n):
        worker.execute_run(lifecycle.create(owner=user, agent_id="echo", input="hello").run_id)


def one_round(n: int, replaced: bool) -> dict[str, float]:
    """Microseconds a statement of each step, in a transaction rolled back at the end."""
    from django.db import connection, transaction

    with connection.cursor() as cursor:
        # The rows earlier rounds wrote and rolled back: gone, so no round steps over more.
        cursor.execute("VACUUM agenttasks_task, agenttasks_taskcount")
    spent = {}
    with transaction.atomic(), connection.cursor() as cursor:
        if replaced:
            # Migration 0036's way back: the four triggers as migrations 0012-0035 left them.
            cursor.execute(importlib.import_module("agenttasks.migrations.0036_task_changes").BACK)
        # Fresh ids and conversation ids (their foreign keys are checked at commit: never).
        cursor.execute(
            "CREATE TEMP TABLE bench_source ON COMMIT DROP AS SELECT * FROM agenttasks_task "
            "WHERE status = 'completed' ORDER BY id LIMIT %s",
            [n],
        )
        cursor.execute(
            "UPDATE bench_source SET status = 'pending', "
            "id = 'task_' || left(md5(random()::text), 21), "
            "conversation_id = 'conv_' || left(md5(random()::text), 21)"
        )
        for step, sql in STEPS.items():
            started = time.perf_counter()
            cursor.execute(sql)
            spent[step] = (time.perf_counter() - started) / n * 1e6
        transaction.set_rollback(True)
    return spent


def measure(n: int, rounds: int) -> dict[str, tuple[float, float]]:
    """{step: (median µs with the replaced triggers, median µs with agenttasks_task_changed)}."""
    clean()
    fill(n)
    runs: dict[bool, list[dict[str, float]]] = {True: [], False: []}
    one_round(n, False)  # warm up: plans, buffers
    for _ in range(rounds):
        for replaced in (True, False):
            runs[replaced].append(one_round(n, replaced))
    return {
        step: (
            statistics.median(r[step] for r in runs[True]),
            statistics.median(r[step] for r in runs[False]),
        )
        for step in STEPS
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON line")
    args = parser.parse_args()
    setup_django()
    figures = measure(args.n, args.rounds)
    if args.json:
        print(json.dumps(figures))
        return
    print(f"\nA task's triggers, µs a statement (N={args.n}, medians of {args.rounds} rounds)")
    print(f"{'statement':<30} {'four triggers':>14} {'one (0036)':>11}")
    for step, (before, after) in figures.items():
        print(f"{step:<30} {before:>14.0f} {after:>11.0f}")


if __name__ == "__main__":
    main()
