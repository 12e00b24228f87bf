"""A2A push notifications through the callbacks machinery (docs/a2a.md#push-notifications).

A task's configs are notified when it enters input-required or a terminal state: one queued job
per config and ending, after commit, recorded as owed with the ending (the reaper queues it
again if it is lost: `agenttasks.delivery.outbox`). The job POSTs a `StreamResponse` (a status update) with
`Content-Type: application/a2a+json`, the config's `Authorization: <scheme> <credentials>` and
its token in `X-A2A-Notification-Token`, to the address `callbacks.check_address` allowed (the
SSRF guard, CALLBACK_ALLOWED_HOSTS and CALLBACK_ALLOWED_PORTS), without following redirects.
Delivery is at least once: a network error, a timeout, a 408, a 429 or a 5xx is tried again,
ATTEMPTS times in all with an exponential backoff; every attempt is a `callback.delivered` or
`callback.failed` event in the task's conversation. In a worker process the job hands the POSTs
to the process's delivery lanes; the ending stays owed until the last attempt is recorded, so a
worker that stops or dies meanwhile leaves it to the reaper. Receivers de-duplicate by the
`X-Agenttasks-Delivery` header, the same on every re-send of one ending to one config.
"""

import json
import logging
import time

import httpx
from a2a.types import a2a_pb2 as pb
from a2a.utils.constants import A2A_JSON_MEDIA_TYPE
from a2a.utils.errors import InvalidParamsError
from google.protobuf import json_format

from .. import __version__, store
from ..conf import app_settings
from ..delivery import callbacks, lanes
from ..delivery import outbox as deliveries
from ..exceptions import ConversationNotFound
from ..models import A2APushConfig, Task
from . import mapping

logger = logging.getLogger(__name__)

ATTEMPTS = 3
BACKOFF = 1.0  # seconds before the second attempt; doubled before each next one
RETRIED = {408, 429}
TOKEN_HEADER = "X-A2A-Notification-Token"


def check_url(url: str) -> None:
    """Refuse a push URL the callbacks guard would refuse (syntax, port, address)."""
    if "\x00" in url:
        raise InvalidParamsError("url must be an http or https URL")
    try:
        callbacks.check_syntax(url)
        callbacks.check_address(url)
    except callbacks.CallbackURLError as exc:
        raise InvalidParamsError(str(exc).replace("callbackUrl", "url")) from None


LIMITS = {"id": 200, "token": 2000, "scheme": 100, "credentials": 4000}


def check_fields(config: pb.TaskPushNotificationConfig) -> None:
    values = {
        "id": config.id,
        "token": config.token,
        "scheme": config.authentication.scheme,
        "credentials": config.authentication.credentials,
    }
    for name, text in values.items():
        if len(text) > LIMITS[name] or "\x00" in text:
            raise InvalidParamsError(f"{name} must be at most {LIMITS[name]} characters, no NUL")


def store_config(task: Task, config: pb.TaskPushNotificationConfig) -> A2APushConfig:
    """Create or replace the task's config with this id (a new id when none is given)."""
    fields = {
        "url": config.url,
        "token": config.token,
        "auth_scheme": config.authentication.scheme,
        "auth_credentials": config.authentication.credentials,
    }
    # Counted under the task's lock (the caller's transaction), so concurrent creates cannot
    # pass the cap together.
    store.lock_task(task.pk)
    configs = A2APushConfig.objects.filter(task=task)
    cap = int(app_settings.MAX_PUSH_CONFIGS_PER_TASK)
    replacing = bool(config.id) and configs.filter(config_id=config.id).exists()
    if not replacing and configs.count() >= cap:
        raise InvalidParamsError(f"A task has at most {cap} push notification configs")
    if config.id:
        row, _ = A2APushConfig.objects.update_or_create(
            task=task, config_id=config.id, defaults=fields
        )
        return row
    return A2APushConfig.objects.create(task=task, **fields)


def present(row: A2APushConfig) -> pb.TaskPushNotificationConfig:
    out = pb.TaskPushNotificationConfig(
        id=row.config_id, task_id=row.task_id, url=row.url, token=row.token
    )
    if row.auth_scheme:
        out.authentication.scheme = row.auth_scheme
        # The credentials are write-only: a read never hands them back.
    return out


# --- scheduling --------------------------------------------------------------------------------


# --- delivery ----------------------------------------------------------------------------------


def body(task: Task, status: str) -> bytes:
    """Return the StreamResponse: a status update in the state the task entered."""
    context_id = mapping.contexts_of([task])[task.id]
    update = pb.TaskStatusUpdateEvent(
        task_id=task.id, context_id=context_id, status=mapping.status(task, context_id)
    )
    update.status.state = mapping.state_of(status)
    payload = json_format.MessageToDict(pb.StreamResponse(status_update=update))
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()


def headers(row: A2APushConfig, version: int) -> dict:
    out = {
        "Content-Type": A2A_JSON_MEDIA_TYPE,
        "User-Agent": f"agenttasks/{__version__}",
        deliveries.DELIVERY_HEADER: deliveries.delivery_id(row.task_id, version, row.pk),
    }
    if row.auth_scheme:
        credentials = f" {row.auth_credentials}" if row.auth_credentials else ""
        out["Authorization"] = f"{row.auth_scheme}{credentials}"
    if row.token:
        out[TOKEN_HEADER] = row.token
    return out


def deliver(config_pk: int, status: str, version: int = 0) -> list[dict]:
    """Hand one ending's push to one config to this process's delivery lanes (the queued job);
    outside a worker process, send it here and return the outcomes."""
    running = lanes.active()
    if running is None or not version:
        return notify(config_pk, status, version)
    configs = A2APushConfig.objects.filter(pk=config_pk)
    owner = configs.values_list("task__owner_id", flat=True).first()
    running.offer(owner, ("push", config_pk, version), notify, config_pk, status, version)
    return []


def lease_seconds() -> float:
    """How long a push may take: every attempt, the pauses between them, a margin."""
    pauses = BACKOFF * (2 ** (ATTEMPTS - 1) - 1)
    return ATTEMPTS * app_settings.CALLBACK_TIMEOUT + pauses + deliveries.LEASE_MARGIN


def notify(config_pk: int, status: str, version: int = 0) -> list[dict]:
    """POST one ending to one config, tried again on transient failures, then settle it."""
    if version and not deliveries.lease_push(config_pk, version, lease_seconds()):
        return []  # sent already, or another job is sending it (a job delivered twice)
    row = A2APushConfig.objects.select_related("task").filter(pk=config_pk).first()
    if row is None:
        return []
    if row.delivered_version >= version > 0:
        deliveries.settle_push(config_pk, version)  # sent before a crash settled it
        return []
    task = row.task
    data = body(task, status)
    outcomes = []
    for attempt in range(1, ATTEMPTS + 1):
        outcome, retry = _attempt(row, task, status, data, attempt, version)
        outcomes.append(outcome)
        if not retry or attempt == ATTEMPTS:
            break
        time.sleep(BACKOFF * 2 ** (attempt - 1))
    if version:
        # Only now is it settled: a crash before this line leaves it owed, sent again.
        A2APushConfig.objects.filter(pk=config_pk, delivered_version__lt=version).update(
            delivered_version=version
        )
        deliveries.settle_push(config_pk, version)
    return outcomes


def _attempt(row, task, status, data, attempt, version) -> tuple[dict, bool]:
    outcome = {"taskId": task.id, "status": status, "channel": "a2a", "configId": row.config_id}
    outcome["attempt"] = attempt
    started = time.monotonic()
    retry = False
    try:
        address = callbacks.check_address(row.url)[0]
        response = callbacks._post(row.url, address, data, headers(row, version), task.traceparent)
    except callbacks.CallbackURLError as exc:
        outcome["error"] = str(exc).replace("callbackUrl", "url")
    except httpx.TimeoutException:
        outcome["error"] = f"timed out after {format(app_settings.CALLBACK_TIMEOUT, 'g')}s"
        retry = True
    except httpx.HTTPError as exc:
        outcome["error"] = str(exc) or type(exc).__name__
        retry = True
    else:
        outcome["httpStatus"] = response.status_code
        if not 200 <= response.status_code < 300:
            outcome["error"] = f"HTTP {response.status_code}"
            retry = response.status_code in RETRIED or response.status_code >= 500
    outcome["durationMs"] = int((time.monotonic() - started) * 1000)
    delivered = "error" not in outcome
    if delivered:
        logger.info("a2a.push_delivered task=%s config=%s", task.id, row.config_id)
    else:
        logger.warning(
            "a2a.push_failed task=%s config=%s attempt=%s error=%s",
            task.id,
            row.config_id,
            attempt,
            outcome["error"],
        )
    event = "callback.delivered" if delivered else "callback.failed"
    try:
        store.append_events(task.conversation_id, [(event, outcome, "", task.id)])
    except ConversationNotFound:
        pass
    return outcome, retry
