"""What an idle demo cluster costs: its processes' and PostgreSQL's CPU while nothing is queued,
with django-q2's own ORM broker (its pusher reads the queue every `poll`, 0.05 s) and with
agenttasks.broker.orm.ListeningORM (it waits for a notification of new jobs), in interleaved
rounds on the bench database (docs/performance.md#cost-per-task).

    .venv/bin/python bench/idle.py --seconds 20 --rounds 2
"""

import argparse
import json
import statistics
import time

from common import Cluster, clean, setup_django
from cost import cpu_by_kind

BROKERS = {"polling": "0", "listening": "1"}


def idle_cpu(listen: str, seconds: float) -> dict[str, float]:
    """Percent of a core used by an idle 2-worker cluster, and by PostgreSQL meanwhile."""
    cluster = Cluster(2, env={"Q_LISTEN": listen})
    try:
        time.sleep(3)  # past the start: the reaper's first pass, the schedules' install
        groups = {cluster.process.pid: "cluster"}
        before, started = cpu_by_kind(groups), time.monotonic()
        time.sleep(seconds)
        after, elapsed = cpu_by_kind(groups), time.monotonic() - started
    finally:
        cluster.stop()
    return {
        kind: round(100 * (after.get(kind, 0) - before.get(kind, 0)) / elapsed, 2)
        for kind in ("cluster", "postgres")
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", action="store_true", help="print one JSON line (run.py)")
    args = parser.parse_args()
    setup_django()
    clean()
    seen: dict[str, list[dict]] = {name: [] for name in BROKERS}
    for _ in range(args.rounds):
        for name, listen in BROKERS.items():
            seen[name].append(idle_cpu(listen, args.seconds))
    result = {
        name: {kind: statistics.median(r[kind] for r in rounds) for kind in ("cluster", "postgres")}
        for name, rounds in seen.items()
    }
    print(json.dumps(result) if args.json else result)


if __name__ == "__main__":
    main()
