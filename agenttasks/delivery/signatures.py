"""The signature of a callback: made when it is sent, checked by whoever receives it.

`X-Agenttasks-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>." + body>` (docs/rest.md#callbacks).
This module imports nothing from Django, so a receiver that is not a Django site can use it:

    from agenttasks.delivery.signatures import InvalidSignature, verify
"""

import hashlib
import hmac
import time

SIGNATURE_HEADER = "X-Agenttasks-Signature"


def _digest(secret: str, timestamp: int, body: bytes) -> str:
    return hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()


def signature(secret: str, timestamp: int, body: bytes) -> str:
    """Return the X-Agenttasks-Signature header value for a body sent at `timestamp`."""
    return f"t={timestamp},v1={_digest(secret, timestamp, body)}"


class InvalidSignature(ValueError):
    """A callback whose signature is missing, wrong, or outside the time window."""


def verify(headers, body, secret: str, tolerance: int = 300, *, now: float | None = None) -> None:
    """Check a received callback's signature and its age; raise InvalidSignature if not good.

    `headers` is any mapping of the request's headers (the name is matched in any case),
    `body` the exact bytes received. The signed timestamp must be within `tolerance` seconds
    of `now` (this machine's clock) either way, which bounds how long a captured callback can
    be replayed.
    """
    header = next(
        (v for k, v in dict(headers).items() if str(k).lower() == SIGNATURE_HEADER.lower()), None
    )
    if not header:
        raise InvalidSignature(f"No {SIGNATURE_HEADER} header")
    timestamp, candidates = None, []
    for part in str(header).split(","):
        key, _, value = part.strip().partition("=")
        if key == "t" and value.isascii() and value.isdigit():
            timestamp = int(value)
        elif key == "v1":
            candidates.append(value)
    if timestamp is None or not candidates:
        raise InvalidSignature(f"Malformed {SIGNATURE_HEADER} header")
    raw = body.encode() if isinstance(body, str) else bytes(body)
    expected = _digest(secret, timestamp, raw)
    if not any(hmac.compare_digest(expected, c) for c in candidates):
        raise InvalidSignature("The signature does not match the body")
    age = (time.time() if now is None else now) - timestamp
    if abs(age) > tolerance:
        raise InvalidSignature(f"The signature is {int(abs(age))}s old; the limit is {tolerance}s")
