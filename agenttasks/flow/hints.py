"""What a provider's refusal says about when to come back: `Retry-After`, `retry-after-ms` and the
`x-ratelimit-reset-*` headers of OpenAI-compatible servers."""

import re
from collections.abc import Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

LONGEST = 300.0  # seconds: a hint beyond this is read as this
# "1s", "6m0s", "20ms", "1h2m3.5s": the durations of x-ratelimit-reset-*.
DURATION = re.compile(
    r"^(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m(?!s))?(?:(\d+(?:\.\d+)?)s)?(?:(\d+(?:\.\d+)?)ms)?$"
)


def duration(text: str) -> float | None:
    """Return the seconds of a Go-style duration ("6m0s", "20ms") or a bare number, or None."""
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        pass
    match = DURATION.match(text)
    if not text or not match or not any(match.groups()):
        return None
    hours, minutes, seconds, millis = (float(g) if g else 0.0 for g in match.groups())
    return hours * 3600 + minutes * 60 + seconds + millis / 1000


def retry_after(headers: Mapping[str, str], now: datetime | None = None) -> float | None:
    """Return the seconds a refusal asks to wait (the longest hint it gives), or None."""
    lowered = {key.lower(): value for key, value in headers.items()}
    waits: list[float] = []
    if "retry-after-ms" in lowered:
        millis = duration(lowered["retry-after-ms"])
        if millis is not None:
            waits.append(millis / 1000)
    if "retry-after" in lowered:
        waits.extend(_retry_after_value(lowered["retry-after"], now))
    for kind in ("requests", "tokens"):
        reset = lowered.get(f"x-ratelimit-reset-{kind}")
        remaining = lowered.get(f"x-ratelimit-remaining-{kind}")
        # A reset counts when that limit is the one used up (or the server does not say).
        if reset is not None and remaining in (None, "0"):
            seconds = duration(reset)
            if seconds is not None:
                waits.append(seconds)
    if not waits:
        return None
    return min(max(max(waits), 0.0), LONGEST)


def _retry_after_value(value: str, now: datetime | None) -> list[float]:
    seconds = duration(value)
    if seconds is not None:
        return [seconds]
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return []
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return [(when - (now or datetime.now(UTC))).total_seconds()]
