"""P4 list at scale: 1,000,000 tasks across 1,000 users, then the list endpoint's latency.

Bulk-loads the rows with SQL (one transaction), then times `GET /tasks?status=running`, a
user's newest page, a page by cursor deep in the user's list (after offset 500) and a Prometheus
scrape (`GET /metrics`, goal under 100 ms), over HTTP against the server: the median of 50
requests each (20 scrapes), with the query plans (which must use the indexes; the cursor page's
keyset read starts its index scan at the cursor).

    .venv/bin/python bench/list_scale.py --tasks 1000000 --users 1000
"""

import argparse
import random
import statistics
import time

from common import clean, setup_django
from latency import start_server

LOAD = """
INSERT INTO auth_user (password, is_superuser, username, first_name, last_name, email, is_staff,
                       is_active, date_joined)
SELECT '!', false, 'scale' || u, '', '', '', false, true, now() FROM generate_series(1, %(users)s) u
ON CONFLICT (username) DO NOTHING;

CREATE TEMP TABLE scale_users AS
SELECT row_number() OVER (ORDER BY id) AS n, id FROM auth_user WHERE username LIKE 'scale%%';

INSERT INTO agenttasks_conversation (id, owner_id, agent, title, metadata, hidden, last_seq,
                                     created_at, updated_at)
SELECT 'conv_' || lpad(i::text, 21, '0'), u.id, 'echo', '',
       jsonb_build_object('source', 'task', 'taskId', 'task_' || lpad(i::text, 21, '0')), false, 2,
       now() - (i || ' seconds')::interval, now() - (i || ' seconds')::interval
FROM generate_series(1, %(tasks)s) i JOIN scale_users u ON u.n = 1 + i %% %(users)s;

INSERT INTO agenttasks_task (id, run_id, attempt, owner_id, agent, input, label, kind, state, inherit,
                             depth, conversation_id, tool_call_id, delegation_key, status,
                             stop_reason, continuations, summary, result, error, callback_url, metadata,
                             version, callback_version, created_at, updated_at)
SELECT 'task_' || lpad(i::text, 21, '0'), 'run_' || lpad(i::text, 22, '0'), 1, c.owner_id, 'echo',
       'job ' || i, 'job ' || i, '', NULL, '{}', 1, c.id, '', '',
       (ARRAY['completed','completed','completed','failed','cancelled','running','pending',
              'completed','completed','waiting_for_input'])[1 + i %% 10],
       '', 0, '', '', '', '', '{}', 1, 0, c.created_at, c.created_at
FROM generate_series(1, %(tasks)s) i JOIN agenttasks_conversation c ON c.id = 'conv_' || lpad(i::text, 21, '0');

INSERT INTO agenttasks_run (id, conversation_id, task_id, agent, trigger, input, attempt, status,
                            stop_request, worker, queued_at, started_at, heartbeat_at, output,
                            error, graceful_stop, turns, tool_calls, prompt_tokens,
                            completion_tokens, total_tokens, usage_known, exec_seconds,
                            counted_usage, created_at)
SELECT t.run_id, t.conversation_id, t.id, 'echo', 'initial', t.input, 1,
       CASE t.status WHEN 'pending' THEN 'queued' WHEN 'waiting_for_input' THEN 'paused' ELSE t.status END,
       '', '', t.created_at,
       -- A claimed run has started and sent a heartbeat (the claim writes both).
       CASE WHEN t.status = 'pending' THEN NULL ELSE t.created_at END,
       CASE WHEN t.status = 'pending' THEN NULL ELSE t.created_at END,
       '', '', false, 0, 0, 0, 0, 0, false, 0, NULL, t.created_at
FROM agenttasks_task t;
"""


def load(tasks: int, users: int) -> float:
    from django.db import connection, transaction

    started = time.monotonic()
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(LOAD, {"tasks": tasks, "users": users})
    with connection.cursor() as cursor:
        # What autovacuum does after a large insert: statistics and the visibility map (without
        # it every index-only scan still reads the table).
        cursor.execute("VACUUM ANALYZE")
    return time.monotonic() - started


def median_ms(client, url: str, headers: dict, n: int = 50) -> float:
    client.get(url, headers=headers)  # warm the server and the cache
    times = []
    for _ in range(n):
        started = time.perf_counter()
        response = client.get(url, headers=headers)
        times.append((time.perf_counter() - started) * 1000)
        assert response.status_code == 200, response.text
    return statistics.median(times)


def measure(tasks: int, users: int, port: int) -> dict[str, float]:
    """Load, time the list requests and a scrape, print the plans.

    Returns the medians in ms (`running`, `newest`, `cursor`, `scrape`) and `tasks`, the count.
    """
    import json
    import os

    import httpx
    from django.contrib.auth import get_user_model
    from rest_framework.authtoken.models import Token

    from agenttasks.api.views.tasks import TASK_ORDER
    from agenttasks.models import Task

    clean()
    seconds = load(tasks, users)
    user = get_user_model().objects.get(username=f"scale{random.Random(1).randint(1, users)}")
    token = Token.objects.get_or_create(user=user)[0].key
    overrides = json.loads(os.environ.get("AGENTTASKS_OVERRIDES") or "{}")
    os.environ["AGENTTASKS_OVERRIDES"] = json.dumps({**overrides, "METRICS_ENABLED": True})
    server = start_server(port)
    base = f"http://127.0.0.1:{port}/api/agents"
    headers = {"Authorization": f"Token {token}"}
    try:
        with httpx.Client(timeout=30) as client:
            running = median_ms(client, f"{base}/tasks?status=running", headers)
            newest = median_ms(client, f"{base}/tasks?limit=20", headers)
            deep = client.get(f"{base}/tasks?limit=20&offset=500", headers=headers).json()
            cursor = deep["nextCursor"]
            by_cursor = median_ms(client, f"{base}/tasks?limit=20&cursor={cursor}", headers)
            scrape = median_ms(client, f"{base}/metrics", {}, n=20)
    finally:
        server.kill()
    total = Task.objects.count()
    print(f"P4: {total:,} tasks, {users} users, loaded in {seconds:.0f} s; query plans:")
    for name, qs in (
        ("status=running", Task.objects.filter(owner=user, status__in=["running"])),
        ("newest page", Task.objects.filter(owner=user)),
    ):
        plan = qs.order_by("-created_at", "-id")[:20].explain()
        print(f"  {name}: " + " | ".join(line.strip() for line in plan.splitlines()[:4]))
    after = TASK_ORDER.after(TASK_ORDER.position(cursor))
    plan = Task.objects.filter(owner=user).filter(after).order_by(*TASK_ORDER.ordering)[:21]
    print("  cursor page: " + " | ".join(line.strip() for line in plan.explain().splitlines()[:4]))
    clean()
    return {
        "running": running,
        "newest": newest,
        "cursor": by_cursor,
        "scrape": scrape,
        "tasks": total,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tasks", type=int, default=1_000_000)
    parser.add_argument("--users", type=int, default=1_000)
    parser.add_argument("--port", type=int, default=8766)
    args = parser.parse_args()
    setup_django()
    figures = measure(args.tasks, args.users, args.port)
    print(f"\nP4 list at scale: {figures['tasks']:,} tasks")
    print(f"  GET /tasks?status=running   median {figures['running']:6.1f} ms (goal <= 30 ms)")
    print(f"  GET /tasks (newest page)    median {figures['newest']:6.1f} ms (goal <= 30 ms)")
    print(f"  GET /tasks?cursor= (deep)   median {figures['cursor']:6.1f} ms (goal <= 30 ms)")
    print(f"  GET /metrics (a scrape)     median {figures['scrape']:6.1f} ms (goal < 100 ms)")


if __name__ == "__main__":
    main()
