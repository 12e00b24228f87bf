"""P5 worker memory: the RSS of one worker process over 10,000 tasks (growth after warm-up).

.venv/bin/python bench/memory.py --n 10000
"""

import argparse

from common import Cluster, bench_user, clean, setup_django, wait_until


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise SystemExit(f"no RSS for {pid}")


def measure(n: int, batch: int) -> list[tuple[int, int]]:
    """Run n echo tasks through one worker; return (tasks done, RSS KiB) after each batch."""
    from agenttasks import lifecycle
    from agenttasks.models import Task

    clean()
    user = bench_user()
    # django-q2 recycles a worker after `recycle` jobs; keep the one we measure for the whole run.
    cluster = Cluster(workers=1, env={"Q_RECYCLE": str(n * 2)})
    pid = cluster.pids[0]
    samples = []
    try:
        done = 0
        while done < n:
            for i in range(batch):
                lifecycle.create(owner=user, agent_id="echo", input=f"m{done + i}")
            done += batch
            wait_until(lambda d=done: Task.objects.filter(status="completed").count() >= d, 900)
            samples.append((done, rss_kib(pid)))
    finally:
        cluster.stop()
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=1_000)
    args = parser.parse_args()
    setup_django()
    samples = measure(args.n, args.batch)
    warm, last = samples[0][1], samples[-1][1]
    print(f"\nP5 worker memory, 1 worker, {args.n} echo tasks")
    for count, kib in samples:
        print(f"  after {count:>6} tasks: {kib / 1024:7.1f} MiB")
    print(
        f"growth after warm-up ({samples[0][0]} tasks): {100 * (last - warm) / warm:+.1f}% (goal <= 10%)"
    )


if __name__ == "__main__":
    main()
