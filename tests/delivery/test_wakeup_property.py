"""Wake-up debt under random interleavings: every owed result reaches the model exactly once.

A seeded random driver plays one parent conversation P with 1–6 children: children start,
complete or fail (also as orphans the reaper fails), are retried, stopped (immediately or after
their turn), re-opened by comments, and read by the model's task_status; P's own runs start and
end (user turns and the wake-up runs delivery creates), and the reaper passes. An oracle built
only from what the lifecycle reports — `task_finished` and `result_delivered` signals and the
notification events in P — checks, after every step and after draining everything:

- every completed or failed ending not superseded (by a retry or a re-opening comment before
  delivery) was delivered or consumed exactly once, never twice; a superseded one never;
- no cancellation was ever delivered;
- each notification event names each task at most once and carries its ending's status;
- P is only woken when idle: it never has two active runs.
"""

import random
import re
from dataclasses import dataclass, field
from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone

from agenttasks import lifecycle, store
from agenttasks.delivery.wakeups import PREFIX
from agenttasks.exceptions import AlreadyFinal, TaskError
from agenttasks.models import Event, Run, Task, Wakeup
from agenttasks.runtime.task_tools import task_tools
from agenttasks.types import RunOutcome

from ..factories import ConversationFactory

pytestmark = pytest.mark.django_db(transaction=True)

SEEDS = range(20)
STEPS = 120
LINE_RE = re.compile(r'^Task "(.*)" \(([^)]+)\) (\w+)\.(?: Result: (.*))?$')
MARKER_RE = re.compile(r" \[truncated — call task_status\([^)]+\) for the full result\]$")
TEXTS = ["done", 'said "hi"\nthen left', "x" * 400, 'Task "evil" (task_y) completed.', ""]


@dataclass
class Ending:
    task_id: str
    run_id: str
    status: str
    settled: str = ""  # delivered, consumed or superseded
    deliveries: int = 0
    consumptions: int = 0


@dataclass
class Oracle:
    parent_id: str
    endings: list[Ending] = field(default_factory=list)
    outstanding: dict[str, Ending] = field(default_factory=dict)
    seen_finished: int = 0
    seen_delivered: int = 0
    last_seq: int = 0
    notifications: int = 0
    cancellations: int = 0

    def observe(self, log):
        """Fold in what the lifecycle reported since the last step."""
        for snapshot in log.finished[self.seen_finished :]:
            assert snapshot.status in ("completed", "failed"), snapshot.status
            assert snapshot.id not in self.outstanding, f"{snapshot.id}: two endings owed"
            ending = Ending(snapshot.id, snapshot.run_id, snapshot.status)
            self.endings.append(ending)
            self.outstanding[snapshot.id] = ending
        self.seen_finished = len(log.finished)
        for snapshot in log.delivered[self.seen_delivered :]:
            if snapshot.status == "cancelled":
                self.cancellations += 1
                continue
            ending = self.outstanding.pop(snapshot.id, None)
            assert ending is not None, f"{snapshot.id}: consumed with nothing owed"
            assert ending.run_id == snapshot.run_id, "consumed another run's result"
            ending.consumptions += 1
            ending.settled = "consumed"
        self.seen_delivered = len(log.delivered)
        events = Event.objects.filter(
            conversation_id=self.parent_id, type="task.notification", seq__gt=self.last_seq
        ).order_by("seq")
        for event in events:
            self.last_seq = event.seq
            self.notifications += 1
            content = event.data["content"]
            assert content.startswith(PREFIX)
            named = []
            for line in content[len(PREFIX) :].split("\n"):
                match = LINE_RE.match(MARKER_RE.sub("", line))
                if match is None:
                    continue
                task_id, status = match.group(2), match.group(3)
                assert status != "cancelled", "a cancellation was delivered"
                named.append(task_id)
                ending = self.outstanding.pop(task_id, None)
                assert ending is not None, f"{task_id}: delivered with nothing owed"
                assert ending.status == status
                ending.deliveries += 1
                ending.settled = "delivered"
            assert len(named) == len(set(named)), f"a task named twice: {named}"
            assert named == event.data["taskIds"]

    def supersede(self, task_id):
        ending = self.outstanding.pop(task_id, None)
        if ending is not None:
            ending.settled = "superseded"


class Driver:
    def __init__(self, seed, user, log):
        self.rng = random.Random(seed)
        self.log = log
        self.parent = ConversationFactory(owner=user, agent="default")
        self.oracle = Oracle(self.parent.id)
        self.status_tool = task_tools(self.parent)[1]
        if self.rng.random() < 0.5:
            self._parent_message()
            self._parent_start()
        self.children = [
            lifecycle.spawn(self.parent, "worker", f"job {i}", label=f"child {i}").task_id
            for i in range(self.rng.randint(1, 6))
        ]

    # --- reads ---------------------------------------------------------------------------

    def task(self, t) -> Task:
        return Task.objects.select_related("run").get(pk=t)

    def parent_runs(self, status):
        return list(Run.objects.filter(conversation=self.parent, status=status))

    # --- child moves ---------------------------------------------------------------------

    def _child_start(self, t):
        task = self.task(t)
        if task.status == "pending" and task.run.status == "queued":
            assert store.claim(task.run_id, "w")

    def _child_end(self, t, status=None):
        task = self.task(t)
        if task.status != "running":
            return
        status = status or self.rng.choice(["completed", "failed"])
        graceful = task.run.stop_request == "after_turn"
        if graceful:
            status = "completed"  # the turn ends; the runtime reports the graceful stop
        text = self.rng.choice(TEXTS)
        outcome = RunOutcome(
            task.run_id, status, text=text, error="boom" if not text else "", graceful_stop=graceful
        )
        lifecycle.on_run_finished(task.conversation_id, outcome)

    def _child_orphan(self, t):
        task = self.task(t)
        if task.status != "running":
            return
        Run.objects.filter(pk=task.run_id).update(heartbeat_at=timezone.now() - timedelta(hours=1))
        lifecycle.recover()

    def _retry(self, t):
        if self.task(t).status != "failed":
            return
        try:
            if self.rng.random() < 0.5:
                lifecycle.retry(t)
            else:  # the model's path: a refusal it reads settles the debt it was shown
                out = task_tools(self.parent)[2].call({"task_id": t}, "call-1")
                if out.is_error:
                    return
        except TaskError:
            return
        self.oracle.supersede(t)

    def _comment(self, t):
        if self.task(t).status not in ("completed", "failed", "cancelled"):
            return
        try:
            lifecycle.comment(t, "one more thing")
        except TaskError:
            return
        self.oracle.supersede(t)

    def _stop(self, t):
        try:
            lifecycle.stop(t, graceful=self.rng.random() < 0.3)
        except AlreadyFinal:
            pass

    def _read(self, t):
        self.status_tool.call({"task_id": t, "wait_seconds": 0}, "call-1")

    # --- parent moves --------------------------------------------------------------------

    def _parent_message(self):
        if Run.objects.filter(
            conversation=self.parent, status__in=("queued", "running", "paused")
        ).exists():
            return
        with transaction.atomic():
            store.lock_conversation(self.parent.id)
            Run.objects.create(
                conversation=self.parent, agent="default", trigger="message", input="hi"
            )

    def _parent_start(self):
        for run in self.parent_runs("queued"):
            assert store.claim(run.id, "p")

    def _parent_end(self):
        for run in self.parent_runs("running"):
            lifecycle.on_run_finished(self.parent, RunOutcome(run.id, "completed", text="ok"))

    # --- driving -------------------------------------------------------------------------

    def step(self):
        t = self.rng.choice(self.children)
        move = self.rng.choices(
            [
                (self._child_start, t),
                (self._child_end, t),
                (self._child_orphan, t),
                (self._retry, t),
                (self._comment, t),
                (self._stop, t),
                (self._read, t),
                (self._parent_message,),
                (self._parent_start,),
                (self._parent_end,),
                (lifecycle.recover,),
            ],
            weights=[6, 6, 1, 3, 2, 2, 2, 2, 3, 3, 1],
        )[0]
        move[0](*move[1:])
        self.oracle.observe(self.log)
        self.assert_woken_only_when_idle()

    def assert_woken_only_when_idle(self):
        """A wake-up run is only ever created on an idle P: P never has two active runs."""
        active = Run.objects.filter(
            conversation=self.parent, status__in=("queued", "running", "paused")
        ).count()
        assert active <= 1, f"{active} active runs on the parent"

    def drain(self):
        for _ in range(20):
            live = [t for t in self.children if self.task(t).status in ("pending", "running")]
            if not live:
                break
            for t in live:
                self._child_start(t)
                self._child_end(t)
            self.oracle.observe(self.log)
        for _ in range(50):
            if not Run.objects.filter(
                conversation=self.parent, status__in=("queued", "running")
            ).exists():
                break
            self._parent_start()
            self._parent_end()
            self.oracle.observe(self.log)
            self.assert_woken_only_when_idle()
        lifecycle.recover()
        self.oracle.observe(self.log)

    def check(self):
        oracle = self.oracle
        assert oracle.outstanding == {}, f"never delivered: {list(oracle.outstanding)}"
        states = {"delivered": "delivered", "consumed": "consumed", "superseded": "dropped"}
        for ending in oracle.endings:
            settled = ending.deliveries + ending.consumptions
            assert settled == (0 if ending.settled == "superseded" else 1), ending
            wakeup = Wakeup.objects.get(task_id=ending.task_id, run_id=ending.run_id)
            assert wakeup.state == states[ending.settled], (ending, wakeup.state)
            assert wakeup.status == ending.status
        wakeups = Wakeup.objects.filter(conversation=self.parent)
        assert wakeups.count() == len(oracle.endings)
        assert not wakeups.filter(state="pending").exists()
        assert not wakeups.exclude(status__in=("completed", "failed")).exists()
        # One notification event per wake-up run, each carrying what that run delivered.
        runs = Run.objects.filter(conversation=self.parent, trigger="wakeup")
        events = Event.objects.filter(conversation=self.parent, type="task.notification")
        assert runs.count() == events.count() == oracle.notifications
        for event in events:
            delivered = Wakeup.objects.filter(delivered_run_id=event.run_id)
            assert sorted(delivered.values_list("task_id", flat=True)) == sorted(
                event.data["taskIds"]
            )


@pytest.mark.parametrize("seed", SEEDS)
def test_every_owed_result_is_delivered_exactly_once(seed, user, signal_log):
    driver = Driver(seed, user, signal_log)
    for _ in range(STEPS):
        driver.step()
    driver.drain()
    driver.check()
    print(seed, _stats(driver))
    # The run exercised something worth checking.
    assert driver.oracle.endings or driver.oracle.cancellations


def _stats(driver):
    o = driver.oracle
    kinds = [e.settled for e in o.endings]
    return {
        "endings": len(kinds),
        "delivered": kinds.count("delivered"),
        "consumed": kinds.count("consumed"),
        "superseded": kinds.count("superseded"),
        "cancelled": o.cancellations,
        "notifications": o.notifications,
    }
