"""P1 throughput: N echo tasks end to end through a real cluster, beside bare django-q2 jobs.

Both run on the same PostgreSQL database, the same broker and the same cluster settings, in the
same run:
- baseline: N django-q2 jobs that each insert one row (first enqueue to last row written);
- agenttasks: N echo tasks created through the REST API (served as the README recommends, 8
  concurrent clients), first create to last completed.

    .venv/bin/python bench/throughput.py --n 2000 --workers 2 --broker orm
    .venv/bin/python bench/throughput.py --n 2000 --workers 2 --broker redis
    .venv/bin/python bench/throughput.py --n 2000 --tracing   # TRACING off vs on, interleaved

With `--tracing`, the agenttasks run is measured with TRACING off and on (the web and worker
processes exporting every span by OTLP to a receiver on loopback that decodes and counts them).

`--broker` must match the Q_BROKER environment this process starts with (run.py sees to it).
"""

import argparse
import json
import os
import statistics
import time

from common import (
    Cluster,
    bench_user,
    broker_env,
    clean,
    post_tasks,
    serve,
    setup_django,
    stop,
    wait_until,
)


def bare(n: int) -> float:
    from django.db import connection
    from django_q.tasks import async_task

    def count():
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM bench_rows")
            return cursor.fetchone()[0]

    started = time.monotonic()
    for i in range(n):
        async_task("bench.jobs.write_row", i)
    return n / (wait_until(lambda: count() >= n, 600) - started)


def agenttasks(
    n: int, port: int = 8767, clients: int = 8, env: dict | None = None, drained=None
) -> float:
    """N echo tasks created through the REST API by `clients` clients, run by the cluster; then,
    before the processes are killed, wait until `drained()` (the spans exported) if given."""
    from rest_framework.authtoken.models import Token

    from agenttasks.models import Task

    token = Token.objects.get_or_create(user=bench_user())[0].key
    server = serve(port, env=env)
    try:
        started = time.monotonic()
        post_tasks(port, token, n, clients)
        ended = wait_until(lambda: Task.objects.filter(status="completed").count() >= n, 900)
        if drained is not None:
            wait_until(drained, 30, poll=0.2)
    finally:
        stop(server)
    return n / (ended - started)


def measure(n: int, workers_list: list[int], repeat: int) -> list[tuple[int, float, float]]:
    """Median rates of `repeat` interleaved rounds per worker count (one round varies by 2x here)."""
    rows = []
    for workers in workers_list:
        rates: dict = {bare: [], agenttasks: []}
        for _ in range(repeat):
            for run in (bare, agenttasks):
                clean()
                cluster = Cluster(workers)
                try:
                    rates[run].append(run(n))
                finally:
                    cluster.stop()
        rows.append((workers, statistics.median(rates[bare]), statistics.median(rates[agenttasks])))
    return rows


class SpanSink:
    """An OTLP/HTTP trace receiver on loopback that decodes each export and counts its spans."""

    def __init__(self):
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
        )

        sink = self
        self.spans = 0

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                request = ExportTraceServiceRequest()
                request.ParseFromString(self.rfile.read(int(self.headers["Content-Length"])))
                sink.spans += sum(
                    len(scope.spans) for rs in request.resource_spans for scope in rs.scope_spans
                )
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def traced_env(sink: SpanSink) -> dict:
    overrides = json.loads(os.environ.get("AGENTTASKS_OVERRIDES") or "{}")
    return {
        "AGENTTASKS_OVERRIDES": json.dumps({**overrides, "TRACING": True}),
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": sink.url,
        "OTEL_SERVICE_NAME": "agenttasks-bench",
    }


def tracing_overhead(n: int, repeat: int) -> tuple[float, float, int]:
    """Median agenttasks rates with TRACING off and on, interleaved; the spans received (each
    round waits for its 2 spans a task, the request's and the run's, before it kills the
    processes: the batch exporter sends every 5 s)."""
    sink = SpanSink()
    rates: dict[str, list[float]] = {"off": [], "on": []}
    for _ in range(repeat):
        for mode in ("off", "on"):
            env = traced_env(sink) if mode == "on" else None
            expected = sink.spans + 2 * n
            clean()
            cluster = Cluster(2, env=env)
            try:
                drained = (lambda target=expected: sink.spans >= target) if env else None
                rates[mode].append(agenttasks(n, env=env, drained=drained))
            finally:
                cluster.stop()
    return statistics.median(rates["off"]), statistics.median(rates["on"]), sink.spans


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--workers", type=int, nargs="+", default=[2])
    parser.add_argument("--broker", choices=["orm", "redis"], default="orm")
    parser.add_argument("--repeat", type=int, default=3, help="rounds of each; medians are shown")
    parser.add_argument("--json", action="store_true", help="print one JSON line (run.py)")
    parser.add_argument("--tracing", action="store_true", help="TRACING off vs on (agenttasks)")
    args = parser.parse_args()
    os.environ.update(broker_env(args.broker))
    setup_django()
    if args.tracing:
        off, on, spans = tracing_overhead(args.n, args.repeat)
        if args.json:
            print(json.dumps([off, on, spans]))
            return
        print(f"\nP1 with tracing, N={args.n}, {args.broker} broker, median of {args.repeat}")
        print(f"off {off:.1f} tasks/s, on {on:.1f} tasks/s: {on / off:.2f}x; {spans} spans")
        return
    rows = measure(args.n, args.workers, args.repeat)
    if args.json:
        print(json.dumps(rows))
        return
    print(f"\nP1 throughput, N={args.n}, PostgreSQL, {args.broker} broker, median of {args.repeat}")
    print(
        f"{'workers':>7}  {'bare django-q2 jobs/s':>22}  {'agenttasks tasks/s':>19}  {'ratio':>6}"
    )
    for workers, base, ours in rows:
        print(f"{workers:>7}  {base:>22.1f}  {ours:>19.1f}  {ours / base:>6.2f}")


if __name__ == "__main__":
    main()
