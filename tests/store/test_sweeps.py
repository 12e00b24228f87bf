"""The reaper's sweeps (store/sweeps.py): the orphans a lapsed lease leaves."""

from datetime import timedelta

import pytest
from django.utils import timezone

from agenttasks import store
from agenttasks.models import Run, Wakeup

from .support import APPROVAL, reload, started

pytestmark = pytest.mark.django_db


# --- fail_orphans ----------------------------------------------------------------------------


class TestFailOrphans:
    def test_keeps_paused_tasks(self, parent):
        # 7.7.9
        old = timezone.now() - timedelta(hours=1)
        orphan = started(parent)
        paused = started(parent)
        fresh = started(parent)
        store.pause(paused.id, paused.run_id, actions=[APPROVAL])
        Run.objects.filter(pk__in=[orphan.run_id, paused.run_id]).update(heartbeat_at=old)
        result = store.fail_orphans()
        assert [t.id for t in result] == [orphan.id] and result[0].status == "failed"
        orphan = reload(orphan)
        assert orphan.summary == orphan.error == "The server stopped while the task was running"
        assert orphan.run.status == "failed"
        assert reload(paused).status == "waiting_for_input" and reload(fresh).status == "running"
        assert Wakeup.objects.get().task_id == orphan.id
        last = orphan.conversation.events.order_by("-seq").first()
        assert last.data["reason"] == "lease expired" and last.data["from"] == "running"
        assert store.fail_orphans() == []
