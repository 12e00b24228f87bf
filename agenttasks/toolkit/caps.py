"""Caps on open events streams and status waits: per user across server processes, and per process.

Each principal has `limit` numbered places per kind, rows of `Slot` keyed `kind:principal:n`. A
request takes a free place (no row, or a row whose lease expired) with an insert or a
compare-and-set update, so two processes can never hold the same place; it renews the lease while
it lasts and deletes the row when it ends. A server that dies leaves its rows to expire after
SLOT_LEASE_SECONDS. A request that finds every place held is answered 429.

A stream served by a WSGI server, and every wait, holds one of the server process's threads while
it lasts: MAX_HELD_PER_PROCESS caps how many one process holds at once, whoever asks, so a server
with a fixed pool of threads (gunicorn's gthread, uWSGI, mod_wsgi) keeps the rest for other
requests. A stream under ASGI holds no thread, and Django's own servers (runserver, the test live
server) start a thread per connection: neither is counted, nor is the test client.

Whether a WSGI client has gone is read from its socket (a closed connection reads as end of
file), since a stream would otherwise learn it only at its next write, the keep-alive.
"""

import errno
import logging
import math
import os
import secrets
import select
import socket
import stat
import threading
from datetime import timedelta

from django.core.handlers.asgi import ASGIRequest
from django.db import IntegrityError, transaction
from django.utils import timezone

from ..conf import app_settings
from ..models import Slot
from . import errors
from .identity import user_of
from .throttling import client_address

logger = logging.getLogger("agenttasks.api")

STREAM = "stream"
WAIT = "wait"
REFUSALS = {
    STREAM: "You already have {limit} open event streams; close one and try again",
    WAIT: "You already have {limit} status waits in progress; let one return and try again",
}
BUSY = "This server is holding {limit} open streams and waits; try again shortly"
BUSY_RETRY_AFTER = 5  # seconds: waits return within MAX_STATUS_WAIT, streams reconnect


class _ProcessPlaces:
    """The places of this server process (MAX_HELD_PER_PROCESS), shared by its threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.held = 0

    def take(self, request, kind: str) -> bool:
        """Take one for a request that holds a thread (True), or raise 429 when none is free."""
        limit = int(app_settings.MAX_HELD_PER_PROCESS)
        if not limit or not _holds_a_pooled_thread(getattr(request, "_request", request), kind):
            return False
        with self._lock:
            if self.held < limit:
                self.held += 1
                return True
        raise errors.ApiError(
            429,
            "rate_limited",
            BUSY.format(limit=limit),
            {"limit": limit, "retryAfter": BUSY_RETRY_AFTER},
            {"Retry-After": str(BUSY_RETRY_AFTER)},
        )

    def give_back(self) -> None:
        with self._lock:
            self.held -= 1


process_places = _ProcessPlaces()


def _holds_a_pooled_thread(request, kind: str) -> bool:
    if isinstance(request, ASGIRequest):
        return kind == WAIT  # a wait is a sync view: it runs in a thread of its own meanwhile
    # A server names itself (gunicorn/23.0.0, waitress, Apache/…). wsgiref's server, which
    # runserver and the test live server extend, starts a thread per connection; Django's test
    # client is no server at all.
    server = request.META.get("SERVER_SOFTWARE") or ""
    return bool(server) and not server.startswith("WSGIServer/")


def principal_key(request) -> str:
    """Return the principal a cap counts for: the user, or the client address of the anonymous one."""
    user = user_of(request)
    if user is not None:
        return f"user:{user.pk}"
    return "addr:" + client_address(request)[:64]


class Held:
    """A place taken under a cap; `renew` keeps it, `release` gives it back (both idempotent)."""

    def __init__(self, key: str | None, holder: str, seconds: float, *, in_process: bool = False):
        self.key, self.holder, self.seconds = key, holder, seconds
        self.in_process = in_process  # it also holds one of this process's places
        self.released = False

    def renew(self) -> bool:
        """Push the lease's expiry on; False if it lapsed and another request took the place."""
        if self.released or self.key is None:
            return True
        expires = timezone.now() + timedelta(seconds=self.seconds)
        return bool(Slot.objects.filter(pk=self.key, holder=self.holder).update(expires_at=expires))

    def release(self) -> None:
        if self.released:
            return
        self.released = True
        if self.in_process:
            process_places.give_back()
        if self.key is None:
            return
        try:
            Slot.objects.filter(pk=self.key, holder=self.holder).delete()
        except Exception:  # the lease expires anyway; never turn an ending into a fault
            logger.exception("api.slot_release_failed key=%s", self.key)


def take(request, kind: str, limit: int, seconds: float) -> Held:
    """Take a place of this process and one among the principal's `limit` for `seconds`, or
    raise 429 (0: no cap)."""
    in_process = process_places.take(request, kind)
    try:
        return _take_principals(request, kind, limit, seconds, in_process)
    except BaseException:
        if in_process:
            process_places.give_back()
        raise


def _take_principals(request, kind: str, limit: int, seconds: float, in_process: bool) -> Held:
    holder = secrets.token_hex(16)
    if not limit:
        return Held(None, holder, seconds, in_process=in_process)
    prefix = f"{kind}:{principal_key(request)}:"
    keys = [f"{prefix}{n}" for n in range(int(limit))]
    now = timezone.now()
    expires = now + timedelta(seconds=seconds)
    held = dict(Slot.objects.filter(pk__in=keys).values_list("pk", "expires_at"))
    for key in keys:
        if key not in held:
            try:
                with transaction.atomic():
                    Slot.objects.create(key=key, holder=holder, expires_at=expires)
            except IntegrityError:
                continue  # another request took it first
            return Held(key, holder, seconds, in_process=in_process)
        if held[key] <= now and Slot.objects.filter(pk=key, expires_at__lte=now).update(
            holder=holder, expires_at=expires
        ):
            return Held(key, holder, seconds, in_process=in_process)
    soonest = min(held.values(), default=expires)
    wait = max(1, min(math.ceil((soonest - now).total_seconds()), int(seconds)))
    raise errors.ApiError(
        429,
        "rate_limited",
        REFUSALS[kind].format(limit=limit),
        {"limit": int(limit), "retryAfter": wait},
        {"Retry-After": str(wait)},
    )


# --- has the client gone? --------------------------------------------------------------------


def client_socket(request) -> int | None:
    """Return the file descriptor of a WSGI request's connection, when the server exposes it."""
    environ = getattr(request, "META", {})
    sock = environ.get("gunicorn.socket")
    if sock is not None:
        return _socket_fd(sock)
    stream = environ.get("wsgi.input")
    # wsgiref and runserver wrap the connection's file in a stream that keeps its bound read.
    for _ in range(3):
        if stream is None:
            return None
        fd = _socket_fd(stream)
        if fd is not None:
            return fd
        stream = getattr(getattr(stream, "_read", None), "__self__", None)
    return None


def _socket_fd(stream) -> int | None:
    try:
        fd = stream.fileno()
        return fd if stat.S_ISSOCK(os.fstat(fd).st_mode) else None
    except (AttributeError, OSError, ValueError):
        return None


def gone(fd: int | None) -> bool:
    """Say whether the peer closed (or reset) this connection; never blocks."""
    if fd is None:
        return False
    try:
        poller = select.poll()  # not select(): it cannot watch descriptors above 1023
        poller.register(fd, select.POLLIN)
        if not poller.poll(0):
            return False
        with socket.socket(fileno=os.dup(fd)) as peer:
            return peer.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError as exc:
        return exc.errno in (errno.ECONNRESET, errno.EBADF, errno.ENOTCONN, errno.EPIPE)
