"""P2 statements per lifecycle step: SQL statements sent (transaction control not counted).

.venv/bin/python bench/statements.py
"""

from common import bench_user, clean, setup_django

CONTROL = ("BEGIN", "COMMIT", "ROLLBACK", "SAVEPOINT", "RELEASE SAVEPOINT")


def count(fn) -> int:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as captured:
        fn()
    return sum(1 for q in captured.captured_queries if not q["sql"].startswith(CONTROL))


def measure() -> list[tuple[str, int]]:
    from agenttasks import lifecycle, store
    from agenttasks.broker import queue
    from agenttasks.delivery import wakeups
    from agenttasks.models import Conversation, Run, Task
    from agenttasks.types import Ending, RunOutcome

    clean()
    user = bench_user()
    rows = []
    with queue.use_backend(queue.RecordingQueue(run_jobs=False)):
        task = None

        def create():
            nonlocal task
            task = lifecycle.create(owner=user, agent_id="echo", input="hello")

        rows.append(("create (REST-style, visible conversation)", count(create)))
        rows.append(("claim", count(lambda: store.claim(task.run_id, "bench"))))
        outcome = RunOutcome(task.run_id, "completed", text="Echo: hello")
        rows.append(
            (
                "finish: record + finalize, no parent",
                count(
                    lambda: lifecycle.on_run_finished(
                        task.conversation_id, outcome, task=Task.objects.read(task.id)
                    )
                ),
            )
        )
        parent = Conversation.objects.create(owner=user, agent="echo")
        Run.objects.create(conversation=parent, agent="echo", trigger="message", status="completed")
        info = None

        def spawn():
            nonlocal info
            info = lifecycle.spawn(parent, "echo", "sub")

        rows.append(("spawn (model path, parent locked and counted)", count(spawn)))
        child = Task.objects.read(info.task_id)
        rows.append(("claim (spawned)", count(lambda: store.claim(child.run_id, "bench"))))
        child = Task.objects.read(child.id)
        outcome = RunOutcome(child.run_id, "completed", text="Echo: sub")
        rows.append(
            (
                "finish with debt: record + finalize, parent",
                count(
                    lambda: store.end(
                        child.id,
                        child.run_id,
                        Ending("completed", summary="Echo: sub", result="Echo: sub"),
                        outcome=outcome,
                    )
                ),
            )
        )
        rows.append(
            ("delivery (one wake-up turn)", count(lambda: wakeups.deliver_pending(parent.id)))
        )
    return rows


def main() -> None:
    setup_django()
    rows = measure()
    print("\nP2 statements per lifecycle step (PostgreSQL)")
    for name, n in rows:
        print(f"  {name:<50} {n:>3}")
    total = rows[0][1] + rows[1][1] + rows[2][1]
    print(f"  {'create -> claim -> finish, no parent (goal <= 20)':<50} {total:>3}")


if __name__ == "__main__":
    main()
