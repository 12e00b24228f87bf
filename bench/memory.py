"""P5 worker memory: the RSS of one worker process over 10,000 tasks (growth after warm-up).

A worker process holds up to WORKER_SLOTS runs at once, and its memory rises with the most it
has held (about 50 KiB a run). So the warm-up is a burst of twice its slots, which it claims as
fast as it can, and the growth after it is what a leak would show.

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
    """Run a warm-up burst, then n echo tasks through one worker; return (tasks done, RSS KiB)
    after the warm-up and after each batch."""
    from django.db import transaction

    from agenttasks import lifecycle
    from agenttasks.execution.worker import slots_per_process
    from agenttasks.models import Task

    clean()
    user = bench_user()
    # django-q2 recycles a worker after `recycle` jobs; keep the one we measure for the whole run.
    burst = 2 * slots_per_process()
    cluster = Cluster(workers=1, env={"Q_RECYCLE": str((n + burst) * 2)})
    pid = cluster.pids[0]
    samples = []

    def run(count: int, offset: int) -> None:
        with transaction.atomic():  # queued all at once: a claim takes as many as it has slots
            for i in range(count):
                lifecycle.create(owner=user, agent_id="echo", input=f"m{offset + i}")
        wait_until(lambda: Task.objects.filter(status="completed").count() >= offset + count, 900)

    try:
        run(burst, 0)  # the warm-up: every slot held at once
        samples.append((0, rss_kib(pid)))
        for done in range(0, n, batch):
            run(batch, burst + done)
            samples.append((done + batch, rss_kib(pid)))
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
    print(f"growth after the warm-up: {100 * (last - warm) / warm:+.1f}% (goal <= 10%)")


if __name__ == "__main__":
    main()
