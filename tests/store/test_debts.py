"""Wake-up debt (store/debts.py): a pending wake-up settles once, as states.WAKEUP_TRANSITIONS says."""

import pytest

from agenttasks import store
from agenttasks.models import Wakeup
from agenttasks.states import WAKEUP_TRANSITIONS, WakeupState

from ..factories import RunFactory, WakeupFactory

pytestmark = pytest.mark.django_db

SETTLE = {
    WakeupState.DELIVERED: lambda w: store.mark_delivered(
        [w], RunFactory(conversation_id=w.conversation_id, trigger="wakeup").id
    ),
    WakeupState.CONSUMED: lambda w: int(store.consume_wakeup(w.task_id, w.run_id)),
    WakeupState.DROPPED: lambda w: store.drop_wakeups([w]),
}


def test_the_table_is_what_the_store_does():
    assert {dst for src, dst in WAKEUP_TRANSITIONS if src == WakeupState.PENDING} == set(SETTLE)
    assert all(src in (None, WakeupState.PENDING) for src, _ in WAKEUP_TRANSITIONS)


@pytest.mark.parametrize("first", list(SETTLE))
@pytest.mark.parametrize("second", list(SETTLE))
def test_a_pending_wakeup_settles_once(first, second):
    wakeup = WakeupFactory()
    assert SETTLE[first](wakeup) == 1
    assert Wakeup.objects.get(pk=wakeup.pk).state == first
    assert SETTLE[second](wakeup) == 0  # it left pending: no second settle
    assert Wakeup.objects.get(pk=wakeup.pk).state == first
