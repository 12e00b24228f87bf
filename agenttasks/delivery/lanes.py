"""Delivery lanes: a worker process sends callbacks and A2A pushes on threads of their own.

A receiver may take CALLBACK_TIMEOUT to answer, so a delivery job does not POST on the worker
process's main thread (which would hold every job behind it): it hands the delivery to the
process's lanes (DELIVERY_LANES threads) and returns at once, as a run's job hands its run to
a slot (docs/architecture.md#in-flight-runs). One owner's deliveries take at most a quarter of
the lanes at a time (at least one); the rest wait in their owner's line, first come first
served, and the owners' lines are served in turn, so one owner's slow receivers cannot hold
every lane.

What waits here is still owed in the database (its `Delivery` row), so nothing is lost with the
process: a stopping process lets the deliveries in flight finish within its grace and leaves the
others owed, and the reaper sends them again (`outbox.resend_overdue`).
"""

import logging
import os
import threading
from collections import Counter, deque
from collections.abc import Callable, Hashable

from django.db import connection

logger = logging.getLogger(__name__)

SHARE = 4  # one owner takes at most 1/SHARE of the lanes at a time (at least one)


class Lanes:
    """This process's delivery threads, shared out between owners."""

    def __init__(self, size: int):
        self.size = size
        self.share = max(1, size // SHARE)
        self.pid = os.getpid()
        self._lock = threading.Condition()
        # Each owner's deliveries not started, oldest first; the dict's order is the turn.
        self._lines: dict[Hashable, deque] = {}
        self._busy: Counter = Counter()  # each owner's deliveries in flight
        self._keys: set = set()  # waiting or in flight: a job delivered twice is taken once
        self.in_flight = 0
        self.closed = False
        for _ in range(size):
            threading.Thread(target=self._serve, name="agenttasks-lane", daemon=True).start()

    def offer(self, owner: Hashable, key: Hashable, call: Callable, *args) -> None:
        """Queue `call(*args)`, one owner's delivery named `key`, behind that owner's others."""
        with self._lock:
            if self.closed:
                # This process is stopping: the delivery stays owed, and the reaper sends it.
                logger.info("lanes.left_owed key=%s", key)
                return
            if key in self._keys:
                return
            self._keys.add(key)
            self._lines.setdefault(owner, deque()).append((key, call, args))
            self._lock.notify()

    def close(self, grace: float | None) -> int:
        """Start nothing more and wait up to `grace` seconds (None: all) for the deliveries in
        flight; return how many are still in flight (what has not started stays owed)."""
        with self._lock:
            self.closed = True
            waiting = sum(len(line) for line in self._lines.values())
            self._lines.clear()
            self._lock.notify_all()
            if waiting:
                logger.info("lanes.closed left_owed=%d", waiting)
            if not self._lock.wait_for(lambda: not self.in_flight, grace):
                logger.warning("lanes.closed_in_flight count=%d", self.in_flight)
            return self.in_flight

    def _next(self):
        """The first delivery of the next owner in turn that is under its share, or None."""
        for owner, line in self._lines.items():
            if self._busy[owner] < self.share:
                key, call, args = line.popleft()
                del self._lines[owner]
                if line:
                    self._lines[owner] = line  # to the end of the turn
                return owner, key, call, args
        return None

    def _serve(self) -> None:
        while True:
            with self._lock:
                while (picked := None if self.closed else self._next()) is None:
                    if self.closed:
                        return
                    self._lock.wait()
                owner, key, call, args = picked
                self._busy[owner] += 1
                self.in_flight += 1
            try:
                call(*args)
            except Exception:  # a lane must outlive any one delivery
                logger.exception("lanes.delivery_failed key=%s", key)
            finally:
                connection.close()  # this lane's connection goes back (to the pool, if pooled)
                with self._lock:
                    self._busy[owner] -= 1
                    if not self._busy[owner]:
                        del self._busy[owner]
                    self.in_flight -= 1
                    self._keys.discard(key)
                    self._lock.notify_all()


_lanes: Lanes | None = None


def start(size: int) -> Lanes:
    """Give this worker process its delivery lanes (once per process)."""
    global _lanes
    if _lanes is None or _lanes.pid != os.getpid():
        _lanes = Lanes(size)
    return _lanes


def active() -> Lanes | None:
    """This process's lanes; None outside a worker process (a delivery is then sent inline)."""
    lanes = _lanes
    return lanes if lanes is not None and lanes.pid == os.getpid() else None
