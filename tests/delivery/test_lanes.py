"""Delivery lanes (docs/architecture.md#in-flight-runs): a worker process sends callbacks and
pushes on lanes of their own, off its main thread, and one owner takes at most a share of them."""

import time

import pytest
from django.test.utils import override_settings

from agenttasks import lifecycle

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
