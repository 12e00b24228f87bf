"""Delivery lanes (docs/architecture.md#in-flight-runs): a worker process sends callbacks and
pushes on lanes of their own, off its main thread, and one owner takes at most a share of them."""

import threading
import time

import pytest
from django.test.utils import override_settings

from agenttasks import lifecycle
from agenttasks.delivery.lanes import Lanes

from ..conftest import wait_for
from ..factories import UserFactory
from ..receiver import Receiver

pytestmark = pytest.mark.django_db(transaction=True)

SETTINGS = {"CALLBACK_ALLOWED_HOSTS": ["127.0.0.1"], "MAX_ACTIVE_TASKS_PER_USER": 0}


def test_one_owners_slow_receivers_do_not_delay_anothers_callbacks(start_cluster, receiver):
    bob, alice = UserFactory(), UserFactory()
    slow, fast = receiver, Receiver()
    slow.delay = 3
    try:
        with override_settings(AGENTTASKS=SETTINGS):
            start_cluster(workers=1, **SETTINGS)
            for i in range(12):
                lifecycle.create(owner=bob, agent_id="echo", input=f"b{i}", callback_url=slow.url)
            wait_for(lambda: slow.requests, timeout=30, message="bob's callbacks under way")
            began = time.monotonic()
            lifecycle.create(owner=alice, agent_id="echo", input="a", callback_url=fast.url)
            # Bob's twelve take 3 s each; alice's is not sent behind them.
            wait_for(lambda: fast.requests, timeout=6, message="alice's callback")
            assert fast.requests[0]["at"] - began < 6
            assert len(slow.requests) < 12
            wait_for(lambda: len(slow.requests) == 12, timeout=60, message="bob's callbacks")
        # One owner holds at most a quarter of the 8 lanes at a time.
        assert slow.most_in_flight == 2
    finally:
        fast.close()


def test_lanes_share_out_between_owners_take_a_key_once_and_close_leaving_the_rest():
    lanes = Lanes(4)  # one owner: at most one lane at a time
    release = threading.Event()
    started: list[str] = []

    def hold(name):
        started.append(name)
        release.wait(10)

    for i in range(3):
        lanes.offer("bob", ("callback", f"b{i}"), hold, f"b{i}")
    lanes.offer("bob", ("callback", "b0"), hold, "b0 again")  # the same job delivered twice
    lanes.offer("alice", ("callback", "a0"), hold, "a0")
    wait_for(lambda: len(started) == 2, message="one of bob's and alice's")
    assert sorted(started) == ["a0", "b0"]  # bob's second waits for his first; alice's does not
    assert lanes.close(0.2) == 2  # both still in flight after the grace
    release.set()
    wait_for(lambda: lanes.in_flight == 0, message="the two in flight")
    assert sorted(started) == ["a0", "b0"]  # what had not started was left (it stays owed)
    lanes.offer("alice", ("callback", "a1"), hold, "a1")  # a closed process starts nothing
    assert lanes.in_flight == 0 and sorted(started) == ["a0", "b0"]
