"""POST /tasks with 8 concurrent clients and no cluster, served as the README recommends.

The baseline, in the same run and on the same server: GET /agents (authenticated, no write),
the floor of any request through Django, DRF and the token lookup.

    .venv/bin/python bench/creates.py --n 2000
"""

import argparse
import shutil
import threading
import time

from common import (
    WEB_WORKERS,
    ab_seconds,
    bench_user,
    clean,
    post_tasks,
    serve,
    setup_django,
    stop,
)

SERVED = f"gunicorn, {WEB_WORKERS} workers x 4 threads"
PORT = 8768


def get_agents(port: int, token: str, n: int, clients: int = 8) -> float:
    """Answer `n` GET /agents from `clients` connections (as post_tasks sends); return the seconds."""
    import httpx

    url = f"http://127.0.0.1:{port}/api/agents/agents"
    if shutil.which("ab"):
        return ab_seconds(url, token, n, clients)
    headers = {"Authorization": f"Token {token}"}

    def read() -> None:
        with httpx.Client(timeout=60) as client:
            for _ in range(n // clients):
                client.get(url, headers=headers).raise_for_status()

    threads = [threading.Thread(target=read) for _ in range(clients)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.monotonic() - started


def measure(n: int) -> tuple[float, float]:
    """Return (creates/s, GET /agents per s)."""
    from rest_framework.authtoken.models import Token

    clean()
    token = Token.objects.get_or_create(user=bench_user())[0].key
    server = serve(PORT)
    try:
        post_tasks(PORT, token, 80)  # warm up every worker's connection
        created = n / post_tasks(PORT, token, n)
        read = n / get_agents(PORT, token, n)
    finally:
        stop(server)
    return created, read


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=2000)
    args = parser.parse_args()
    setup_django()
    created, read = measure(args.n)
    print(f"POST /tasks, 8 clients, {SERVED}: {created:.0f}/s (GET /agents {read:.0f}/s)")


if __name__ == "__main__":
    main()
