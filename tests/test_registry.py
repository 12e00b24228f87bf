"""The registry of agents: settings and code together (docs/delegation.md#agents)."""

import sys
import threading

import pytest
from django.core.exceptions import ImproperlyConfigured

from agenttasks import registry


def test_an_agent_in_settings_whose_module_registers_it_is_an_error_not_a_hang(settings):
    # The README's settings name mysite.agents.summarize, and its Agents example registers that
    # agent when the module is imported: reading the registry imported it under its own lock.
    settings.AGENTTASKS = {
        "AGENTS": {
            "summarize": {"runtime": "callable", "handler": "tests.self_registering.summarize"}
        }
    }
    said: list[str] = []

    def read():
        try:
            registry.agents()
        except ImproperlyConfigured as exc:
            said.append(str(exc))

    reader = threading.Thread(target=read, daemon=True)
    try:
        reader.start()
        reader.join(10)
        assert not reader.is_alive(), "the registry hangs"
        assert said == ["agent 'summarize': defined both in AGENTTASKS['AGENTS'] and in code"]
    finally:
        registry.unregister("summarize")
        sys.modules.pop("tests.self_registering", None)


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"steerable": "yes"}, "agent 'a': steerable must be True, False or None, not 'yes'"),
        (
            {"steer_fallback": "steer"},
            "agent 'a': steer_fallback must be one of reject, enqueue, interrupt, rollback",
        ),
    ],
)
def test_steering_fields_are_checked(fields, message):
    with pytest.raises(ImproperlyConfigured) as refused:
        registry.build("a", runtime="callable", handler="tests.agents.echo", **fields)
    assert str(refused.value) == message


def test_chat_agents_take_steering_and_callables_only_when_they_say_so():
    assert registry.build("a").takes_steering
    assert not registry.build("b", runtime="callable", handler="tests.agents.echo").takes_steering
    steerable = registry.build("c", runtime="callable", handler="tests.agents.echo", steerable=True)
    assert steerable.takes_steering and steerable.steer_fallback == "enqueue"
