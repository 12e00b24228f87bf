"""Throttling the anonymous principal by client address: X-Forwarded-For only from trusted proxies."""

import pytest
from django.test.utils import override_settings

from .conftest import agenttasks

pytestmark = pytest.mark.django_db(transaction=True)

ANONYMOUS_WRITES = {"ALLOW_ANONYMOUS": True, "THROTTLE_RATES": {"write": "5/min"}}


def statuses(api, forwarded_for: list[str], remote="203.0.113.9") -> list[int]:
    return [
        api.post(
            "/conversations",
            {"agentId": "echo"},
            REMOTE_ADDR=remote,
            HTTP_X_FORWARDED_FOR=header,
        ).status_code
        for header in forwarded_for
    ]


SPOOFED = [f"198.51.100.{i}" for i in range(7)]


@pytest.mark.parametrize("num_proxies", ["unset", 0])
def test_without_trusted_proxies_the_header_is_ignored(anonymous, settings, num_proxies):
    rest = {k: v for k, v in settings.REST_FRAMEWORK.items() if k != "NUM_PROXIES"}
    if num_proxies != "unset":
        rest["NUM_PROXIES"] = num_proxies
    with override_settings(REST_FRAMEWORK=rest), agenttasks(**ANONYMOUS_WRITES):
        assert statuses(anonymous, SPOOFED) == [201] * 5 + [429] * 2
        # Another client (another REMOTE_ADDR) has its own budget.
        assert statuses(anonymous, SPOOFED[:1], remote="203.0.113.10") == [201]


def test_behind_one_proxy_the_address_it_saw_counts(anonymous, settings):
    rest = {**settings.REST_FRAMEWORK, "NUM_PROXIES": 1}
    with override_settings(REST_FRAMEWORK=rest), agenttasks(**ANONYMOUS_WRITES):
        # The proxy appends the address it saw; what the client wrote before it is not trusted.
        same_client = [f"{spoof}, 192.0.2.1" for spoof in SPOOFED]
        assert statuses(anonymous, same_client, remote="10.0.0.2") == [201] * 5 + [429] * 2
        assert statuses(anonymous, ["192.0.2.2"], remote="10.0.0.2") == [201]
