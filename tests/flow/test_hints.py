"""A provider's refusal read for when to come back (agenttasks.flow.hints)."""

from datetime import UTC, datetime

import pytest

from agenttasks.flow.hints import LONGEST, duration, retry_after


@pytest.mark.parametrize(
    "text, seconds",
    [("1", 1.0), ("0.5", 0.5), ("1s", 1.0), ("20ms", 0.02), ("6m0s", 360.0), ("1h2m3.5s", 3723.5)],
)
def test_durations(text, seconds):
    assert duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "soon", "5x", "m"])
def test_what_is_not_a_duration(text):
    assert duration(text) is None


def test_retry_after_in_seconds_and_as_a_date():
    assert retry_after({"Retry-After": "2"}) == 2.0
    now = datetime(2026, 12, 5, 7, 28, 0, tzinfo=UTC)
    assert retry_after({"retry-after": "Sat, 05 Dec 2026 07:28:30 GMT"}, now) == 30.0
    assert retry_after({"retry-after-ms": "250"}) == 0.25


def test_the_reset_of_the_limit_that_is_used_up_counts():
    headers = {
        "x-ratelimit-remaining-requests": "0",
        "x-ratelimit-reset-requests": "2s",
        "x-ratelimit-remaining-tokens": "5000",
        "x-ratelimit-reset-tokens": "30s",
    }
    assert retry_after(headers) == 2.0
    assert retry_after({**headers, "x-ratelimit-remaining-tokens": "0"}) == 30.0


def test_no_hint_and_the_cap():
    assert retry_after({"Content-Type": "application/json"}) is None
    assert retry_after({"Retry-After": "bogus"}) is None
    assert retry_after({"Retry-After": "86400"}) == LONGEST
