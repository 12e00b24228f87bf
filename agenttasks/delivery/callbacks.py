"""Outbound callbacks: one POST per ending to the task's callbackUrl, sent after commit.

The URL is checked when the task is created and again when the callback is sent: its port must
be allowed (CALLBACK_ALLOWED_PORTS), and every address the host resolves to must be global, an
IPv4 address embedded in an IPv6 one included (unless the host is allowed). The connection goes
to the address that was checked, so a DNS answer that changes in between cannot reach a refused
address. No redirects, no retries; the outcome is an event in the task's conversation.

In a worker process the job hands the POST to the process's delivery lanes (`lanes`) and
returns. The ending stays owed until the receiver answered or the failure is recorded, so a
worker that stops or dies mid-POST leaves it to the reaper: delivery is at least once, and each
POST carries the ending's `X-Agenttasks-Delivery` id to de-duplicate by (docs/rest.md#callbacks).

Each POST is signed when CALLBACK_SIGNING_SECRET is set; receivers check the signature and its
age with `verify` (from `agenttasks.delivery.signatures`, which imports nothing from Django, for receivers
that are not Django sites).
"""

import asyncio
import ipaddress
import json
import logging
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
from django.utils import timezone

from .. import __version__, store, tracing
from ..broker import queue
from ..conf import app_settings
from ..exceptions import ConversationNotFound
from ..models import Task
from ..operations import metrics
from ..states import NOTIFIED, TaskStatus
from ..text import iso
from . import lanes
from . import outbox as deliveries
from .signatures import SIGNATURE_HEADER, signature
from .signatures import InvalidSignature as InvalidSignature  # the receiver's side, re-exported
from .signatures import verify as verify

logger = logging.getLogger(__name__)

MAX_URL_LENGTH = 2000
DEFAULT_PORTS = {"http": 80, "https": 443}
# IPv6 prefixes that carry an IPv4 address in their last 32 bits, which a translator reaches:
# IPv4-compatible (deprecated), NAT64 well-known and local-use (RFC 6052, RFC 8215).
EMBEDDING_PREFIXES = [
    ipaddress.ip_network("::/96"),
    ipaddress.ip_network("64:ff9b::/96"),
    ipaddress.ip_network("64:ff9b:1::/48"),
]


class CallbackURLError(ValueError):
    """A callbackUrl that may not be used; the message is the API's."""


def check_syntax(url) -> None:
    """Refuse a callbackUrl that is not a plain http(s) URL."""
    if not isinstance(url, str) or len(url) > MAX_URL_LENGTH:
        if isinstance(url, str):
            raise CallbackURLError(f"callbackUrl must be at most {MAX_URL_LENGTH} characters")
        raise CallbackURLError("callbackUrl must be an http or https URL")
    try:
        parts = urlsplit(url)
        host = parts.hostname
        parts.port  # noqa: B018  (raises on a malformed port)
    except ValueError:
        raise CallbackURLError("callbackUrl must be an http or https URL") from None
    if parts.scheme.lower() not in ("http", "https") or not host:
        raise CallbackURLError("callbackUrl must be an http or https URL")
    if parts.username is not None or parts.password is not None:
        raise CallbackURLError("callbackUrl must not contain credentials")


def resolve(host: str, port: int) -> list[str]:
    """Return every address a host name resolves to (tests replace this with a stub)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses an IPv6 address carries: 6to4, Teredo (server and client), NAT64."""
    found = []
    if ip.sixtofour is not None:
        found.append(ip.sixtofour)
    if ip.teredo is not None:
        found.extend(ip.teredo)
    if any(ip in prefix for prefix in EMBEDDING_PREFIXES):
        found.append(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
    return found


def _global(ip) -> bool:
    return ip.is_global and not (
        ip.is_multicast
        or ip.is_reserved
        or ip.is_loopback
        or ip.is_link_local
        or ip.is_unspecified
        or ip.is_private
    )


def is_public(address: str) -> bool:
    """Say whether an address is global: not loopback, private, link-local, shared, reserved, …

    An IPv6 address that embeds an IPv4 address (mapped, 6to4, Teredo, NAT64) is public only if
    the embedded address is too: a relay or translator would deliver to it.
    """
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if isinstance(ip, ipaddress.IPv6Address):
        if not all(_global(embedded) for embedded in _embedded_ipv4(ip)):
            return False
    return _global(ip)


def allowed_port(scheme: str, port: int, host: str) -> bool:
    """Say whether callbacks may go to this port (CALLBACK_ALLOWED_PORTS).

    By default: the scheme's own port (80, 443), and any port of a host in
    CALLBACK_ALLOWED_HOSTS. A list, when set, is the whole policy.
    """
    ports = app_settings.CALLBACK_ALLOWED_PORTS
    if ports is not None:
        return port in {int(p) for p in ports}
    allowed = {h.lower() for h in app_settings.CALLBACK_ALLOWED_HOSTS or ()}
    return port == DEFAULT_PORTS[scheme] or host in allowed


def check_address(url: str) -> list[str]:
    """Check the URL's port, resolve its host and return its addresses, refusing any that is
    not public."""
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    scheme = parts.scheme.lower()
    port = parts.port or DEFAULT_PORTS[scheme]
    if not allowed_port(scheme, port, host):
        raise CallbackURLError(f"callbackUrl port {port} is not allowed")
    allowed = {h.lower() for h in app_settings.CALLBACK_ALLOWED_HOSTS or ()}
    try:
        addresses = [str(ipaddress.ip_address(host))]
    except ValueError:
        try:
            addresses = resolve(host, port)
        except (OSError, UnicodeError):
            addresses = []
    if not addresses:
        raise CallbackURLError(f"callbackUrl host could not be resolved: {host}")
    if host not in allowed:
        for address in addresses:
            if not is_public(address):
                raise CallbackURLError(f"callbackUrl resolves to a non-public address: {address}")
    return addresses


def schedule(task, status: str) -> None:
    """Queue the callback of a task entering `status`, once per ending, if it has a URL.

    The ending recorded it as owed (docs/rest.md#callbacks): if this job is lost, the reaper
    queues it again.
    """
    if task.callback_url and status in NOTIFIED:
        queue.enqueue_job(deliveries.CALLBACK_JOB, task.id, status, task.version)


def send(task_id: str, status: str, version: int = 0) -> dict | None:
    """Hand one ending's callback to this process's delivery lanes (the queued job); outside a
    worker process, send it here and return the outcome."""
    running = lanes.active()
    if running is None or not version:
        return deliver(task_id, status, version)
    owner = Task.objects.filter(pk=task_id).values_list("owner_id", flat=True).first()
    running.offer(owner, ("callback", task_id, version), deliver, task_id, status, version)
    return None


def deliver(task_id: str, status: str, version: int = 0) -> dict | None:
    """POST the callback of one ending; record and log the outcome, then settle it."""
    lease = app_settings.CALLBACK_TIMEOUT + deliveries.LEASE_MARGIN
    if version and not deliveries.lease_callback(task_id, version, lease):
        return None  # sent already, or another job is sending it (a job delivered twice)
    # A delete always wins: a task whose tree is being deleted (or is gone) is owed nothing.
    task = (
        Task.objects.visible()
        .filter(pk=task_id)
        .only("id", "callback_url", "error", "conversation_id", "callback_version", "traceparent")
        .first()
    )
    if task is None or not task.callback_url or task.callback_version >= version > 0:
        # Nothing to send, or this ending (or a later one) was sent before a crash settled it.
        if version:
            deliveries.settle_callback(task_id, version)
        return None
    payload: dict[str, Any] = {"taskId": task.id, "status": status}
    if status == TaskStatus.FAILED:
        payload["error"] = task.error
    payload["timestamp"] = iso(timezone.now())
    body = json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()
    headers = {
        "Content-Type": "application/json",
        "User-Agent": f"agenttasks/{__version__}",
        deliveries.DELIVERY_HEADER: deliveries.delivery_id(task.id, version),
    }
    if app_settings.CALLBACK_SIGNING_SECRET:
        headers[SIGNATURE_HEADER] = signature(
            app_settings.CALLBACK_SIGNING_SECRET, int(time.time()), body
        )
    started = time.monotonic()
    outcome: dict[str, Any] = {"taskId": task.id, "status": status}
    host = urlsplit(task.callback_url).hostname or ""
    try:
        address = check_address(task.callback_url)[0]
        response = _post(task.callback_url, address, body, headers, task.traceparent)
    except CallbackURLError as exc:
        outcome["error"] = str(exc)
    except httpx.TimeoutException:
        outcome["error"] = f"timed out after {format(app_settings.CALLBACK_TIMEOUT, 'g')}s"
    except httpx.HTTPError as exc:
        outcome["error"] = str(exc) or type(exc).__name__
    else:
        outcome["httpStatus"] = response.status_code
        if not 200 <= response.status_code < 300:
            outcome["error"] = f"HTTP {response.status_code}"
    outcome["durationMs"] = int((time.monotonic() - started) * 1000)
    delivered = "error" not in outcome
    if delivered:
        logger.info("Callback delivered: task_id=%s status=%s", task.id, outcome["httpStatus"])
    elif "httpStatus" in outcome:
        logger.warning("Callback failed: task_id=%s status=%s", task.id, outcome["httpStatus"])
    else:
        logger.warning(
            "Error sending callback to %s: task_id=%s error=%s", host, task.id, outcome["error"]
        )
    metrics.count("agenttasks_callbacks_total", outcome="delivered" if delivered else "failed")
    event = "callback.delivered" if delivered else "callback.failed"
    try:
        store.append_events(task.conversation_id, [(event, outcome, "", task.id)])
    except ConversationNotFound:
        pass
    if version:
        # Only now is it settled: a crash before this line leaves it owed, sent again.
        Task.objects.filter(pk=task.id, callback_version__lt=version).update(
            callback_version=version
        )
        deliveries.settle_callback(task.id, version)
    return outcome


def _post(
    url: str, address: str, body: bytes, headers: dict, traceparent: str = ""
) -> httpx.Response:
    """POST to the checked address, naming the host in Host and in TLS (SNI, certificate).

    CALLBACK_TIMEOUT bounds the whole exchange, not each read: a receiver that sends its answer a
    byte at a time is cut off at the deadline (an httpx timeout only bounds each socket
    operation), so the exchange runs on an event loop that can cancel it. With tracing on, it is
    a `POST` span in the task's trace (`traceparent`), whose context the request carries.
    """
    attributes = {"http.request.method": "POST", "url.full": url, "server.address": address}
    with tracing.continued(traceparent, "POST", attributes) as traced:
        response = _post_now(url, address, body, {**headers, **tracing.headers()})
        traced.set("http.response.status_code", response.status_code)
        return response


def _post_now(url: str, address: str, body: bytes, headers: dict) -> httpx.Response:
    timeout = float(app_settings.CALLBACK_TIMEOUT)
    exchange = _exchange(url, address, body, headers, timeout)
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(exchange)
    # Called from a coroutine's thread (an ASGI test, say): run it on a loop of its own.
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, exchange).result()


async def _exchange(
    url: str, address: str, body: bytes, headers: dict, timeout: float
) -> httpx.Response:
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = f"[{address}]" if ":" in address else address
    if parts.port:
        netloc += f":{parts.port}"
    pinned = urlunsplit((parts.scheme, netloc, parts.path or "/", parts.query, ""))
    host_header = host if not parts.port else f"{host}:{parts.port}"
    if ":" in host:
        host_header = f"[{host}]" + (f":{parts.port}" if parts.port else "")
    async with httpx.AsyncClient(
        timeout=timeout, follow_redirects=False, trust_env=False
    ) as client:
        request = client.build_request(
            "POST",
            pinned,
            content=body,
            headers={**headers, "Host": host_header},
            extensions={"sni_hostname": host},
        )
        try:
            return await asyncio.wait_for(client.send(request), timeout)
        except TimeoutError:
            raise httpx.TimeoutException(f"the exchange took over {timeout:g}s") from None
