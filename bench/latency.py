"""P3 wake latency: from the commit of an ending to the return of every kind of waiter.

One process (this one) commits the ending of a running task. Waiting meanwhile:
- `GET /tasks/{id}/wait` against a web server in another process (uvicorn);
- `lifecycle.status(id, wait=…)` (what the `task_status` tool calls) in a third process;
- an SSE client on the task's conversation stream (`?until=terminal`).
p50 and p95 over K endings.

    .venv/bin/python bench/latency.py --k 30
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time

from common import ROOT, bench_user, clean, setup_django, wait_until

WAITER = r"""
import json, os, sys, time
sys.path.insert(0, os.getcwd())
import django
django.setup()
from agenttasks import lifecycle
print("ready", flush=True)
for line in sys.stdin:
    info = lifecycle.status(line.strip(), wait=30)
    print(json.dumps({"status": info.status, "returned": time.time()}), flush=True)
"""


def percentile(values, q):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def start_server(port: int) -> subprocess.Popen:
    # uvicorn (ASGI): the sync views run on one thread that keeps its database connection, as in
    # a production server; runserver opens a connection per request thread.
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "project.asgi:application",
            "--port",
            str(port),
            "--no-access-log",
        ],
        cwd=ROOT,
        env={
            **os.environ,
            "DB_POOL": "1",
        },  # each ASGI request has its own thread: pool connections
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    import httpx

    wait_until(lambda: _answers(httpx, port), 30, poll=0.2)
    return server


def _answers(httpx, port) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/api/agents/agents", timeout=1).status_code in (
            200,
            401,
        )
    except httpx.HTTPError:
        return False


def _completed(data: str) -> bool:
    """Whether an SSE data line is the task's change to completed."""
    event = json.loads(data)
    return isinstance(event, dict) and (event.get("data") or event).get("to") == "completed"


def measure(k: int, port: int) -> dict[str, list[float]]:
    import httpx
    from rest_framework.authtoken.models import Token

    from agenttasks import lifecycle, store
    from agenttasks.broker import queue
    from agenttasks.models import Task
    from agenttasks.types import RunOutcome

    clean()
    user = bench_user()
    token = Token.objects.get_or_create(user=user)[0].key
    server = start_server(port)
    waiter = subprocess.Popen(
        [sys.executable, "-c", WAITER],
        cwd=ROOT,
        env=os.environ.copy(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert waiter.stdout.readline().strip() == "ready"
    results: dict[str, list[float]] = {
        "GET /tasks/{id}/wait": [],
        "task_status(wait_seconds)": [],
        "SSE stream": [],
    }
    headers = {"Authorization": f"Token {token}"}
    base = f"http://127.0.0.1:{port}/api/agents"
    commits: list[float] = []
    end = store.end

    def timed_end(*args, **kwargs):
        ended = end(*args, **kwargs)
        commits.append(time.time())  # the ending's transaction has just committed
        return ended

    store.end = timed_end
    try:
        with (
            queue.use_backend(queue.RecordingQueue(run_jobs=False)),
            httpx.Client(timeout=60) as client,
        ):
            for _ in range(k):
                task = lifecycle.create(owner=user, agent_id="echo", input="hi")
                store.claim(task.run_id, "bench")
                returned: dict[str, float] = {}

                def wait_http(task_id=task.id, returned=returned):
                    client.get(f"{base}/tasks/{task_id}/wait?timeout=30", headers=headers)
                    returned["wait"] = time.time()

                listening = threading.Event()

                def stream(
                    conversation_id=task.conversation_id, returned=returned, listening=listening
                ):
                    url = f"{base}/conversations/{conversation_id}/events/stream?until=terminal"
                    with client.stream("GET", url, headers=headers) as response:
                        response.raise_for_status()
                        for line in response.iter_lines():
                            if line == "event: snapshot":
                                listening.set()
                            if line.startswith("data:") and _completed(line[5:]):
                                returned["sse"] = time.time()
                                return

                threads = [threading.Thread(target=wait_http), threading.Thread(target=stream)]
                for thread in threads:
                    thread.start()
                waiter.stdin.write(task.id + "\n")
                waiter.stdin.flush()
                if not listening.wait(30):
                    raise SystemExit("the SSE stream did not start")
                time.sleep(0.3)  # let every waiter block before the ending is committed
                lifecycle.on_run_finished(
                    task.conversation_id,
                    RunOutcome(task.run_id, "completed", text="done"),
                    task=Task.objects.read(task.id),
                )
                committed = commits[-1]
                reply = json.loads(waiter.stdout.readline())
                for thread in threads:
                    thread.join(30)
                results["GET /tasks/{id}/wait"].append(returned["wait"] - committed)
                results["task_status(wait_seconds)"].append(reply["returned"] - committed)
                results["SSE stream"].append(returned["sse"] - committed)
    finally:
        store.end = end
        waiter.kill()
        server.kill()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--k", type=int, default=30)
    parser.add_argument("--port", type=int, default=8765)
    args = parser.parse_args()
    setup_django()
    results = measure(args.k, args.port)
    print(f"\nP3 wake latency, commit to return, PostgreSQL, K={args.k}")
    for name, values in results.items():
        ms = [max(v, 0) * 1000 for v in values]
        print(
            f"  {name:<28} p50 {statistics.median(ms):7.1f} ms   p95 {percentile(ms, 0.95):7.1f} ms"
        )


if __name__ == "__main__":
    main()
