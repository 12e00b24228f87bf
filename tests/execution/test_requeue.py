"""The reaper never floods the queue: at most one outstanding job per queued run."""

import json
import os
import time
from datetime import timedelta

import pytest
from django.db.models import F
from django.test.utils import override_settings
from django.utils import timezone
from django_q.conf import Conf
from django_q.models import OrmQ

from agenttasks import lifecycle, store
from agenttasks.broker import queue
from agenttasks.execution import reaper
from agenttasks.models import Run, Task
from agenttasks.store import sweeps
from agenttasks.types import ActionRequest, NewTask

from ..cluster import run_jobs
from ..conftest import wait_for

PAST = timedelta(hours=1)
SECOND = timedelta(seconds=1)


def stale(task_id: str) -> str:
    """Make a task's queued run look forgotten (queued an hour ago); return its id."""
    run_id = Task.objects.get(pk=task_id).run_id
    Run.objects.filter(pk=run_id).update(queued_at=timezone.now() - PAST)
    return run_id


@pytest.mark.django_db
def test_without_the_orm_broker_a_run_is_requeued_with_a_backoff(user, recording_queue):
    task = store.create_task(NewTask(owner=user, agent="echo", input="x"))
    run_id = stale(task.id)
    after = timedelta(seconds=60)  # REQUEUE_AFTER's default

    lifecycle.recover()
    assert recording_queue.run_ids == [run_id]
    run = Run.objects.get(pk=run_id)
    assert run.requeues == 1
    assert run.requeue_at - timezone.now() > 1.9 * after  # then twice REQUEUE_AFTER

    for _ in range(5):  # passes inside the backoff send nothing
        lifecycle.recover()
    assert recording_queue.run_ids == [run_id]

    Run.objects.filter(pk=run_id).update(requeue_at=timezone.now() - timedelta(seconds=1))
    lifecycle.recover()
    assert recording_queue.run_ids == [run_id, run_id]
    run = Run.objects.get(pk=run_id)
    assert run.requeues == 2
    assert run.requeue_at - timezone.now() > 3.9 * after  # and four times after that
    assert run.queued_at < timezone.now() - PAST + timedelta(minutes=1)  # how long it waited

    # Capped at 64 times REQUEUE_AFTER.
    Run.objects.filter(pk=run_id).update(requeues=40, requeue_at=None)
    lifecycle.recover()
    run = Run.objects.get(pk=run_id)
    assert run.requeue_at - timezone.now() < 64 * after + timedelta(seconds=5)


@pytest.mark.django_db
def test_a_resumed_run_starts_its_backoff_afresh(user, recording_queue):
    task = store.create_task(NewTask(owner=user, agent="approver", input="prod"))
    run_id = stale(task.id)
    Run.objects.filter(pk=run_id).update(requeues=5, requeue_at=timezone.now() + PAST)
    claimed = store.claim(run_id, "w1")
    assert claimed is not None
    approval = ActionRequest(kind="approval", tool_name="deploy", tool_call_id="call-1", args={})
    store.pause(task.id, run_id, actions=[approval])
    action = Task.objects.get(pk=task.id).run.actions.get()
    store.answer(task.id, run_id, action.id, {"status": "approved"})
    run = Run.objects.get(pk=run_id)
    assert (run.status, run.requeues, run.requeue_at) == ("queued", 0, None)


@pytest.mark.django_db(transaction=True)
def test_with_the_orm_broker_only_a_run_whose_job_is_gone_is_requeued(user, real_queue):
    kept = lifecycle.create(owner=user, agent_id="echo", input="kept")
    lost = lifecycle.create(owner=user, agent_id="echo", input="lost")
    kept_run, lost_run = stale(kept.id), stale(lost.id)
    assert queue.queued_runs(60) == {kept_run, lost_run}  # each create wrote its job
    # The job of one run is gone (acknowledged by a worker that then lost its claim, say).
    for job in OrmQ.objects.all():
        if job.task["args"] == (lost_run,):
            job.delete()
    assert queue.queued_runs(60) == {kept_run}

    out = reaper.preview()
    assert out["requeue"] == [lost_run]
    lifecycle.recover()
    assert queue.queued_runs(60) == {kept_run, lost_run}
    assert OrmQ.objects.count() == 2
    assert Run.objects.get(pk=lost_run).requeues == 1
    assert Run.objects.get(pk=kept_run).requeues == 0

    # Later passes (their look-again time staged as passed) find both jobs waiting.
    for _ in range(3):
        Run.objects.update(requeue_at=None)
        lifecycle.recover()
    assert OrmQ.objects.count() == 2


@pytest.mark.django_db(transaction=True)
def test_a_job_a_worker_took_and_lost_before_the_claim_does_not_count(user, real_queue):
    task = lifecycle.create(owner=user, agent_id="echo", input="x")
    run_id = stale(task.id)
    (job,) = OrmQ.objects.all()
    retry = Conf.RETRY
    # Taken by a cluster just now (django-q2 locks it for `retry` seconds): outstanding.
    OrmQ.objects.update(lock=timezone.now() + timedelta(seconds=retry))
    assert queue.queued_runs(60) == {run_id}
    lifecycle.recover()
    assert OrmQ.objects.count() == 1
    # Taken two minutes ago and the run never claimed: its worker died holding it.
    OrmQ.objects.update(lock=timezone.now() + timedelta(seconds=retry - 120))
    assert queue.queued_runs(60) == set()
    Run.objects.update(requeue_at=None)
    lifecycle.recover()
    assert OrmQ.objects.count() == 2
    assert queue.queued_runs(60) == {run_id}  # the new job waits


# `make fuzz` soaks at the full size (AGENTTASKS_SOAK=1): 5,000 runs, passes of 1,000 (the
# reaper's own batch). `make test` keeps the shape at a tenth: 500 runs, passes of 100.
SOAK = bool(os.environ.get("AGENTTASKS_SOAK"))
RUNS = 5000 if SOAK else 500
PASSES = 10


@pytest.mark.timeout(900)
def test_a_stalled_cluster_keeps_one_job_per_run(start_cluster, user, tmp_path, monkeypatch):
    """RUNS queued runs, REQUEUE_AFTER 1 s, no worker: 10 passes add no job; then each runs once."""
    monkeypatch.setattr(sweeps, "REQUEUE_BATCH", RUNS // 5)  # ten passes look at each run twice
    settings = {"MAX_ACTIVE_TASKS_PER_USER": 0, "REQUEUE_AFTER": 1, "REAP_INTERVAL": 1}
    log = tmp_path / "executions.log"
    with override_settings(AGENTTASKS=settings):
        started = time.monotonic()
        ids = [
            lifecycle.create(
                owner=user, agent_id="counter", input=f"job {i}", metadata={"log": str(log)}
            ).id
            for i in range(RUNS)
        ]
        create_seconds = time.monotonic() - started
        assert OrmQ.objects.count() == RUNS
        Run.objects.update(queued_at=timezone.now() - PAST)  # everything is past REQUEUE_AFTER
        # A few jobs were lost (a broker failure after the commit, say): those runs get one each.
        lost = list(Run.objects.filter(task_id__in=ids[:10]).values_list("pk", flat=True))
        Run.objects.filter(pk__in=lost).update(queued_at=timezone.now() - 2 * PAST)
        lost_jobs = [job.pk for job in OrmQ.objects.all() if job.task["args"][0] in lost]
        OrmQ.objects.filter(pk__in=lost_jobs).delete()

        pass_seconds = []
        for _ in range(PASSES):
            # A REQUEUE_AFTER passes between two passes; each looks at the RUNS / 5 runs it
            # looked at least recently, so ten passes look at every run twice.
            Run.objects.exclude(requeue_at=None).update(requeue_at=F("requeue_at") - SECOND)
            begun = time.monotonic()
            reaper.reap()
            pass_seconds.append(time.monotonic() - begun)
            assert OrmQ.objects.count() == RUNS
        assert sorted(queue.queued_runs(60)) == sorted(Run.objects.values_list("pk", flat=True))
        assert Run.objects.filter(pk__in=lost, requeues=1).count() == len(lost)
        assert not Run.objects.exclude(pk__in=lost).filter(requeues__gt=0).exists()
        assert not Run.objects.filter(requeue_at=None).exists()  # every run was looked at

        cluster = start_cluster(workers=2, **settings)
        begun = time.monotonic()
        wait_for(
            lambda: Task.objects.filter(status="completed").count() == RUNS,
            timeout=600,
            interval=1,
            message="every task to complete",
        )
        drain_seconds = time.monotonic() - begun
        # The running jobs claimed most runs before their own jobs came up (several runs a
        # claim): those jobs are left, and each costs one claim statement that finds its run
        # taken (about 110 a second on SQLite's single writer, for up to RUNS of them).
        wait_for(lambda: run_jobs() == 0, timeout=180, message="the queue to empty")

    executions = log.read_text().split()
    assert len(executions) == RUNS
    assert sorted(executions) == sorted(Task.objects.values_list("run_id", flat=True))
    assert cluster.process.poll() is None
    print(
        json.dumps(
            {
                "runs": RUNS,
                "passes": PASSES,
                "jobs_after_passes": RUNS,
                "create_seconds": round(create_seconds, 1),
                "slowest_pass_seconds": round(max(pass_seconds), 3),
                "drain_seconds": round(drain_seconds, 1),
            }
        )
    )
