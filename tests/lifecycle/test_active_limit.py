"""One rule for MAX_ACTIVE_TASKS_PER_USER, whatever the entry point (docs/lifecycle.md).

A user's active tasks are the live tasks they own, however they were made; delegates and tasks in
a tree being deleted do not count. At the limit every way of starting more work is refused with
ActiveTaskLimit and writes nothing: the Python API, a model's spawn in the user's conversation, a
message to a chat, a comment re-opening a finished task and a retry. The REST answers (429) are in
tests/api/test_api_cancel_retry.py, interrupted deletes in tests/lifecycle/test_deletion.py.
"""

import pytest
from django.test import override_settings

from agenttasks import lifecycle
from agenttasks.exceptions import ActiveTaskLimit
from agenttasks.models import Run, Task
from agenttasks.states import TaskStatus

from ..factories import ConversationFactory, TaskFactory

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("limit_of_two"),
]


@pytest.fixture
def limit_of_two():
    with override_settings(AGENTTASKS={"MAX_ACTIVE_TASKS_PER_USER": 2}):
        yield


@pytest.fixture
def at_the_limit(user):
    """Two live tasks of the user, made through the Python API (pending: nothing executes)."""
    return [lifecycle.create(owner=user, agent_id="worker", input=f"job {i}") for i in (1, 2)]


def _counts() -> tuple[int, int]:
    return Task.objects.count(), Run.objects.count()


def test_the_python_api_is_refused_at_the_limit(user, at_the_limit):
    before = _counts()
    with pytest.raises(ActiveTaskLimit):
        lifecycle.create(owner=user, agent_id="worker", input="one more")
    assert _counts() == before


def test_a_model_spawning_in_the_users_conversation_is_refused(user, at_the_limit):
    lead = ConversationFactory(owner=user, agent="default")
    before = _counts()
    with pytest.raises(ActiveTaskLimit):
        lifecycle.spawn(lead, "worker", "help me")
    assert _counts() == before


def test_a_message_to_a_chat_is_refused(user, at_the_limit):
    chat = lifecycle.create_conversation(owner=user, agent_id="default")
    with pytest.raises(ActiveTaskLimit):
        lifecycle.post_message(chat.id, "hello")
    assert not Run.objects.filter(conversation=chat).exists()
    assert chat.events.count() == 0


def test_reopening_a_finished_task_is_refused(user, at_the_limit):
    failed = TaskFactory(owner=user, status=TaskStatus.FAILED, error="boom")
    with pytest.raises(ActiveTaskLimit):
        lifecycle.retry(failed.id)
    with pytest.raises(ActiveTaskLimit):
        lifecycle.comment(failed.id, "try again")
    failed.refresh_from_db()
    assert (failed.status, failed.attempt_no()) == (TaskStatus.FAILED, 1)
    assert Run.objects.filter(task_id=failed.id).count() == 1


def test_finished_and_other_users_tasks_do_not_count(user, at_the_limit, django_user_model):
    lifecycle.stop(at_the_limit[0].id)
    assert Task.objects.get(pk=at_the_limit[0].id).status == TaskStatus.CANCELLED
    lifecycle.create(owner=user, agent_id="worker", input="takes the freed place")
    other = django_user_model.objects.create(username="other")
    lifecycle.create(owner=other, agent_id="worker", input="counted apart")
    with pytest.raises(ActiveTaskLimit):
        lifecycle.create(owner=user, agent_id="worker", input="over again")
