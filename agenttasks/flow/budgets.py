"""The shared budget of each model endpoint: every request of the cluster reserves its start here.

A reservation is a short transaction on the endpoint's row (`ProviderBudget`, locked with
select_for_update, no lock held while the model answers): the request may start at the later of
now, the endpoint's next free start, the time its tokens are free again, and the end of a pause a
refusal asked for; the next free start moves on by one request's share of the rate. So the
cluster's starts are spaced by the endpoint's rate whatever the number of processes and nodes,
and a run that must wait knows how long at once (it waits in its slot, holding no connection).
Where the budgets are kept in Redis (BUDGET_STORE, `in_redis`), each step is one script there
instead (`flow.redis_store`), and the reaper copies the budgets into their rows.

The rate is the endpoint's `requests_per_minute` (MODEL_LIMITS), or the one its refusals taught
if lower: a 429 (or a 503 with a hint) pauses the endpoint for as long as the provider asked and
sets the learned rate below what the cluster was sending; it grows back by GROWTH a second while
no refusal comes. `tokens_per_minute` spaces tokens the same way: a request reserves its
estimated tokens, and the usage the provider reports corrects the reservation. `concurrent`
bounds the requests in flight with a permit each, which lapses if its holder dies.

An endpoint without limits costs no statement until a refusal teaches it a rate: each process
paces its own requests to it, in a slow start (`_Free`, FIRST_RATE and RAMP). A
start further off than the run's horizon (PARK_AFTER) is not reserved: the run parks, told its
place in its owner's line. Each process remembers where each line ended when it last reserved
(`room`), so that its claims take no more runs than the line has room for.
"""

import math
import os
import socket
import threading
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db import IntegrityError, transaction
from django.utils import timezone

from ..broker import queue
from ..conf import app_settings
from ..models import ProviderBudget, ProviderPermit, WorkerProcess
from ..store import postgres
from ..store.locking import one
from . import redis_store

LIMIT_KEYS = ("requests_per_minute", "tokens_per_minute", "concurrent")
# The share of a configured rate the starts are spaced by: a start that comes late (a busy
# process, a slow statement) bunches with the next ones, and the provider counts arrivals.
HEADROOM = 0.9
# A refusal sets the learned rate to this share of the rate the cluster sent: a little below a
# configured rate (the setting is trusted, the refusal may be a moment's bunching) or a learned
# one (measured, or lowered before: the refusal says it grew a little past the limit), well below
# what the cluster sent without a rate, which it only guessed.
SLOWDOWN = {"configured": 0.95, "learned": 0.9, "guessed": 0.7}
GROWTH = 0.05  # the learned rate grows back by this share a second while nothing is refused
QUIET = 5.0  # seconds after a refusal before the learned rate grows again
DROP_EVERY = 1.0  # seconds: the learned rate drops once in this time at most
LEAST_RATE = 0.1  # requests a second: a learned rate never goes below this
PERMIT_SLACK = 30.0  # seconds a permit outlives its request's timeout before it lapses
FREE_CHECK = 1.0  # seconds a process trusts that an endpoint without limits is still free
# A process starts requests to an endpoint it has no rate for at FIRST_RATE a second, plus RAMP
# times what it started in about the last second: a burst's rate grows about sevenfold a second
# (e^2), so the first refusal comes soon after the provider's limit is passed, not after all
# the process could claim was sent at once (a slow start, as TCP's).
FIRST_RATE = 32.0
RAMP = 3.0
# The first refusal of an endpoint without a rate measures the provider's limit: the requests
# the cluster's processes sent in the MEASURED_OVER seconds before the refused one and that the
# provider did not refuse, summed. Each process remembers its requests for KEPT_FOR seconds.
MEASURED_OVER = 1.0
KEPT_FOR = 10.0


@dataclass(frozen=True)
class Limits:
    """One endpoint's configured limits (None: not configured)."""

    requests_per_minute: float | None = None
    tokens_per_minute: float | None = None
    concurrent: int | None = None

    @property
    def configured(self) -> bool:
        return bool(self.requests_per_minute or self.tokens_per_minute or self.concurrent)


@dataclass(frozen=True)
class Reservation:
    """A request's turn: it may start at `start`; `permit` is its concurrency permit, if any.
    `busy`: the endpoint's concurrency is used up, try again shortly (nothing was reserved)."""

    endpoint: str
    start: datetime
    tokens: int = 0
    permit: int | None = None
    busy: bool = False
    later: bool = False  # beyond the horizon: nothing reserved; `start` is its place in line
    reserved_at: float = field(default_factory=time.time)  # epoch seconds


def limits_of(endpoint: str) -> Limits:
    """Return the limits MODEL_LIMITS gives `endpoint` (none when it names no limits)."""
    given = (app_settings.MODEL_LIMITS or {}).get(endpoint) or {}
    return Limits(**{key: given.get(key) for key in LIMIT_KEYS})


def described(endpoint: str) -> str:
    """Say an endpoint's configured limits in a line (`requests_per_minute 3000, concurrent 5`)."""
    limits = limits_of(endpoint)
    given = {key: getattr(limits, key) for key in LIMIT_KEYS}
    return ", ".join(f"{key} {value:g}" for key, value in given.items() if value) or "none"


def problems(setting) -> list[str]:
    """Say what is wrong with a MODEL_LIMITS value (the system check agenttasks.E007)."""
    if not isinstance(setting, dict):
        return ["MODEL_LIMITS must be a dict of endpoint names to their limits"]
    found = []
    for endpoint, given in setting.items():
        if not isinstance(given, dict):
            found.append(f"MODEL_LIMITS[{endpoint!r}] must be a dict")
            continue
        unknown = sorted(set(given) - set(LIMIT_KEYS))
        if unknown:
            found.append(f"MODEL_LIMITS[{endpoint!r}] has unknown keys {unknown}")
        for key in LIMIT_KEYS:
            value = given.get(key)
            if value is None:
                continue
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if not number or value <= 0 or (key == "concurrent" and not isinstance(value, int)):
                found.append(f"MODEL_LIMITS[{endpoint!r}][{key!r}] must be a positive number")
    return found


def store_problems(store) -> list[str]:
    """Say what is wrong with a BUDGET_STORE value (the system check agenttasks.E007)."""
    if store not in ("auto", "database", "redis"):
        return [f"BUDGET_STORE must be 'auto', 'database' or 'redis', not {store!r}"]
    if store == "redis":
        try:
            import redis  # noqa: F401
        except ImportError:
            return ["BUDGET_STORE 'redis' needs the redis package (the `redis` extra)"]
    return []


def reserve(
    endpoint: str,
    tokens: int,
    timeout: float,
    horizon: float | None = None,
    *,
    owner: int | None = None,
    priority: int = 0,
    parked_before: bool = False,
) -> Reservation:
    """Reserve a request's start against `endpoint`'s shared budget (see the module's text).

    A start further off than `horizon` seconds is not reserved: the answer is `later`, with the
    request's place in the line of its `owner`'s runs of its `priority` parked so far
    (`parked_lines`). So those come back one after another, and another owner's request, or a
    higher priority, is not queued behind them: the claims, which interleave owners and take
    higher priorities first, take them back in turn. A run `parked_before` that is still too
    far off keeps its place at the front: its place is the next free start, and no line grows.
    """
    limits = limits_of(endpoint)
    if not limits.configured:
        start = _free.start(endpoint)
        if start is not None:
            return Reservation(endpoint, start)
    key = f"{'' if owner is None else owner}:{priority}"
    if in_redis() or postgres.enabled():
        return _reserve_in_one_statement(
            endpoint, limits, tokens, timeout, horizon, key, parked_before
        )
    with transaction.atomic():
        row = _locked(endpoint)
        now = timezone.now()
        permit = None
        if limits.concurrent:
            live = ProviderPermit.objects.filter(endpoint=endpoint, expires_at__gt=now).count()
            if live >= limits.concurrent:
                return Reservation(endpoint, now, busy=True)
        start = max(now, row.next_start or now, row.paused_until or now)
        token_start = max(now, row.next_tokens or now)
        if limits.tokens_per_minute:
            start = max(start, token_start)
        rate = _rate(limits, row)
        _lines.saw(endpoint, start, rate)
        if horizon is not None and (start - now).total_seconds() > horizon:
            if parked_before:
                return Reservation(endpoint, start, later=True)
            return Reservation(endpoint, _place(row, key, start, rate, now), later=True)
        if rate:
            row.next_start = start + timedelta(seconds=1 / rate)
        if limits.tokens_per_minute:
            row.next_tokens = token_start + _token_time(limits, tokens)
        _grow(row, limits, now)
        row.save()
        if limits.concurrent:
            expires = start + timedelta(seconds=timeout + PERMIT_SLACK)
            permit = ProviderPermit.objects.create(endpoint=endpoint, expires_at=expires).pk
    return Reservation(endpoint, start, tokens, permit)


def _reserve_in_one_statement(
    endpoint: str,
    limits: Limits,
    tokens: int,
    timeout: float,
    horizon: float | None,
    line: str,
    parked_before: bool,
) -> Reservation:
    """`reserve` in one step: agenttasks_reserve_v1 on PostgreSQL, so the row's lock is held
    for one statement, not for the round trips of a transaction; or a script in Redis."""
    answer = (redis_store.reserve if in_redis() else postgres.reserve)(
        {
            "endpoint": endpoint,
            "tokens": tokens,
            "timeout": timeout,
            "horizon": horizon,
            "line": line,
            "parked_before": parked_before,
            **{key: getattr(limits, key) for key in LIMIT_KEYS},
            "headroom": HEADROOM,
            "growth": GROWTH,
            "quiet": QUIET,
            "permit_slack": PERMIT_SLACK,
        }
    )
    start = datetime.fromisoformat(answer["start"])
    if answer.get("busy"):
        return Reservation(endpoint, start, busy=True)
    _lines.saw(endpoint, datetime.fromisoformat(answer["free_start"]), answer.get("rate"))
    if answer.get("later"):
        return Reservation(endpoint, start, later=True)
    return Reservation(endpoint, start, tokens, answer.get("permit"))


class _Free:
    """The endpoints without limits, a learned rate or a pause, as this process knows them:
    their requests start without a statement (the row is read at most once a FREE_CHECK,
    whether it was free or not), spaced by this process's slow start (FIRST_RATE, RAMP). Each
    process counts its own starts, so that the first refusal can guess the rate the cluster
    sent."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # endpoint: when it was last read (monotonic), and whether it was free then
        self._checked: dict[str, tuple[float, bool]] = {}
        self._recent: dict[str, tuple[float, float]] = {}  # endpoint: (starts a second, at)
        self._next: dict[str, float] = {}  # endpoint: this process's next free start (monotonic)

    def start(self, endpoint: str) -> datetime | None:
        """Take this process's next start on `endpoint` if it is free (None if it is not)."""
        now = time.monotonic()
        with self._lock:
            seen = self._checked.get(endpoint)
        if seen is None or now - seen[0] > FREE_CHECK:
            # Not free is remembered as long: an endpoint with a learned rate keeps it, and
            # each of its reservations would read the row again first.
            learned, paused = _learned_and_paused(endpoint)
            seen = (now, learned is None and (paused is None or paused <= timezone.now()))
            with self._lock:
                self._checked[endpoint] = seen
        if not seen[1]:
            return None
        wall, now = timezone.now(), time.monotonic()  # after the read: its time is not a wait
        with self._lock:
            rate, at = self._recent.get(endpoint, (0.0, now))
            recent = rate * math.exp(-(now - at))
            allowed = FIRST_RATE + RAMP * recent
            start = max(now, self._next.get(endpoint, now))
            self._next[endpoint] = start + 1 / allowed
            self._recent[endpoint] = (recent + 1, now)
        at_start = wall + timedelta(seconds=start - now)
        _lines.saw(endpoint, at_start, allowed)  # the claims take what its line has room for
        return at_start

    def forget(self, endpoint: str) -> None:
        with self._lock:
            self._checked.pop(endpoint, None)

    def cluster_rate(self, endpoint: str) -> float:
        """Guess the starts a second the cluster sent: this process's, times the processes."""
        with self._lock:
            rate, at = self._recent.get(endpoint, (0.0, time.monotonic()))
        mine = rate * math.exp(-(time.monotonic() - at))
        seen_since = timezone.now() - timedelta(seconds=app_settings.LEASE_TIMEOUT)
        processes = WorkerProcess.objects.filter(seen_at__gte=seen_since).count()
        return mine * max(processes, 1)


_free = _Free()


class _Sends:
    """This process's requests of the last KEPT_FOR seconds, per endpoint: when each was sent
    and the status its answer began with (None until it comes)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sent: dict[str, deque[list]] = {}

    def sent(self, endpoint: str, note: list) -> None:
        note[:] = [time.time(), None]
        with self._lock:
            notes = self._sent.setdefault(endpoint, deque())
            notes.append(note)
            while notes[0][0] < note[0] - KEPT_FOR:
                notes.popleft()

    def answered(self, note: list, status: int) -> None:
        with self._lock:
            note[1] = status

    def accepted(self, endpoint: str, begin: float, end: float) -> int:
        """Count the requests sent from `begin` until `end` (epoch seconds) and not refused."""
        with self._lock:
            return sum(
                begin <= at < end and status not in (429, 503)
                for at, status in self._sent.get(endpoint, ())
            )


_sends = _Sends()


def sent(endpoint: str, note: list) -> None:
    """Note in `note` ([sent at, status], kept for `answered`) a request to `endpoint` sent now."""
    _sends.sent(endpoint, note)


def answered(note: list, status: int) -> None:
    """Note the status the answer to a request (its note from `sent`) began with."""
    _sends.answered(note, status)


def process_name() -> str:
    """Name this process among the cluster's (its host and pid)."""
    return f"{socket.gethostname()}:{os.getpid()}"


def _learned_and_paused(endpoint: str) -> tuple[float | None, datetime | None]:
    """The endpoint's learned rate and pause, from wherever its budget is kept."""
    if in_redis():
        return redis_store.free_state(endpoint)
    row = (
        ProviderBudget.objects.filter(pk=endpoint)
        .values_list("learned_rate", "paused_until")
        .first()
    )
    return row if row is not None else (None, None)


class _Lines:
    """Where each endpoint's line of turns ended when this process last reserved, and its rate:
    the claims of this process take no more runs than the line has room for (`room`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen: dict[str, tuple[datetime, float]] = {}

    def saw(self, endpoint: str, start: datetime, rate: float | None) -> None:
        with self._lock:
            if rate:
                self._seen[endpoint] = (start + timedelta(seconds=1 / rate), rate)
            else:
                self._seen.pop(endpoint, None)

    def room(self, within: float, now: datetime) -> dict[str, int]:
        """For each endpoint with a rate: how many more requests its line takes before it
        reaches `within` seconds from now."""
        found = {}
        with self._lock:
            for endpoint, (end, rate) in self._seen.items():
                ahead = max((end - now).total_seconds(), 0.0)
                # One at least while the line is shorter than `within`: a slow endpoint's
                # turns are further apart than that.
                fits = math.floor((within - ahead) * rate + 1e-9)
                found[endpoint] = max(fits, 1 if ahead < within else 0)
        return found


_lines = _Lines()


def room(within: float, endpoints: Iterable[str] = ()) -> dict[str, int]:
    """Say how many more requests each endpoint's line, as this process last saw it, takes
    before it reaches `within` seconds from now. One of `endpoints` (or of MODEL_LIMITS) that
    this process has not used yet takes `within` seconds of its configured rate, or of its slow
    start's first rate (FIRST_RATE) when it has none."""
    found = _lines.room(within, timezone.now())
    for endpoint in {*endpoints, *(app_settings.MODEL_LIMITS or {})}:
        if endpoint in found:
            continue
        rate = limits_of(endpoint).requests_per_minute
        per_second = HEADROOM * rate / 60 if rate else FIRST_RATE
        found[endpoint] = max(math.floor(within * per_second), 1)
    return found


def release(reservation: Reservation, used_tokens: int | None = None) -> None:
    """End a request: give back its permit, and correct its tokens by the usage reported."""
    limits = limits_of(reservation.endpoint)
    moved = timedelta(0)  # how far the tokens' next free time moves: used minus reserved
    if used_tokens is not None and limits.tokens_per_minute:
        moved = _token_time(limits, used_tokens - reservation.tokens)
    if in_redis():
        if reservation.permit is not None or moved:
            redis_store.release(reservation.endpoint, reservation.permit, moved.total_seconds())
        return
    if reservation.permit is not None:
        ProviderPermit.objects.filter(pk=reservation.permit).delete()
    if not moved:
        return
    with transaction.atomic():
        row = _locked(reservation.endpoint)
        if row.next_tokens is not None:
            row.next_tokens += moved
            row.save(update_fields=["next_tokens"])


def forget_lapsed() -> int:
    """Delete the permits whose holders died (the reaper's pass); return how many. With the
    budgets in Redis, also copy them into their rows, which the admin and health read."""
    if in_redis():
        redis_store.mirror()
        return redis_store.forget_lapsed()
    deleted, _ = ProviderPermit.objects.filter(expires_at__lte=timezone.now()).delete()
    return deleted


def refused(
    endpoint: str,
    wait: float | None,
    sent_at: float | None = None,
    reserved_at: float | None = None,
) -> None:
    """A provider refused a request (sent at `sent_at`, its turn reserved at `reserved_at`,
    epoch seconds) for its limit: pause the endpoint and lower its rate.

    The rate drops once per DROP_EVERY at most. A request whose turn was reserved before the
    last drop neither drops it nor extends the pause: the turns given at the old rate are still
    sent (the line runs up to PARK_AFTER ahead) and refused too, and they say nothing new (each
    pushing the pause on would leave a gap with no start after the line). Except after the
    first refusal of an endpoint without a rate: each refusal of the DROP_EVERY after it
    reports what its process saw the provider accept (`_measured`), and the rate is set from
    the reports summed.
    """
    limits = limits_of(endpoint)
    _free.forget(endpoint)
    if in_redis():
        # The process's report is for the window of the measure under way, or of the one this
        # refusal may begin; the script keeps it only if that is the measure it holds.
        at = redis_store.measure_at(endpoint) or sent_at
        redis_store.refused(
            {
                "endpoint": endpoint,
                "wait": wait,
                "sent_at": sent_at,
                "reserved_at": reserved_at,
                "process": process_name(),
                "report_at": at,
                "report": _report(endpoint, at) if at is not None else None,
                "requests_per_minute": limits.requests_per_minute,
                "cluster_rate": None
                if limits.requests_per_minute
                else _free.cluster_rate(endpoint),
                "slowdown": SLOWDOWN["configured" if limits.requests_per_minute else "learned"],
                "guessed_slowdown": SLOWDOWN["guessed"],
                "headroom": HEADROOM,
                "drop_every": DROP_EVERY,
                "least_rate": LEAST_RATE,
            }
        )
        return
    with transaction.atomic():
        row = _locked(endpoint)
        now = timezone.now()
        # A request whose turn was given before the last drop was refused for what that drop
        # knew: the drop paused the endpoint already.
        dropped_at = row.limited_at.timestamp() if row.limited_at is not None else -math.inf
        stale = (reserved_at or sent_at or math.inf) < dropped_at
        if wait and not stale:
            row.paused_until = max(row.paused_until or now, now + timedelta(seconds=wait))
        if not stale and (
            row.limited_at is None or (now - row.limited_at).total_seconds() >= DROP_EVERY
        ):
            rate = _rate(limits, row)
            # With a rate, starts follow it; without, each process paced its own (its slow start).
            sent = rate or max(_decayed(row, now), _free.cluster_rate(endpoint))
            kind = "configured" if limits.requests_per_minute else "learned" if rate else "guessed"
            slowdown = SLOWDOWN[kind]
            row.learned_rate = max(LEAST_RATE, sent * slowdown)
            row.limited_at = now
            measuring = rate is None and sent_at is not None
            row.accepted_reports = {"at": sent_at, "counts": {}} if measuring else None
        measured = _measured(row, endpoint) if row.accepted_reports else 0
        if measured:
            row.learned_rate = max(LEAST_RATE, HEADROOM * measured)
        row.next_start = max(row.next_start or now, row.paused_until or now)
        row.refusals += 1
        row.save()


def _measured(row: ProviderBudget, endpoint: str) -> int:
    """Report in the row how many of this process's requests sent in the MEASURED_OVER seconds
    before the refused one the provider did not refuse (as far as it knows by now); return the
    reports summed: the provider's limit as the cluster measured it."""
    reports = row.accepted_reports or {}
    end, counts = reports["at"], dict(reports["counts"])
    report = _report(endpoint, end)
    if report is not None:
        counts[process_name()] = report
    row.accepted_reports = {"at": end, "counts": counts}
    return sum(counts.values())


def _report(endpoint: str, end: float) -> int | None:
    """How many of this process's requests sent in the MEASURED_OVER seconds before `end` the
    provider did not refuse (None: too long ago, its notes of then are forgotten)."""
    if time.time() - end >= KEPT_FOR / 2:
        return None
    return _sends.accepted(endpoint, end - MEASURED_OVER, end)


def in_redis() -> bool:
    """Say whether the budgets are kept in Redis (BUDGET_STORE; "auto": where django-q2's broker
    is its Redis broker) rather than in the database."""
    store = app_settings.BUDGET_STORE
    return store == "redis" or (store == "auto" and queue.uses_redis())


def state(endpoint: str) -> ProviderBudget | None:
    """Return the endpoint's budget as it stands (None before its first use)."""
    if in_redis():
        return redis_store.state(endpoint)
    return one(ProviderBudget.objects.filter(pk=endpoint))


def _locked(endpoint: str) -> ProviderBudget:
    """Return the endpoint's row, locked for this transaction (made on its first use)."""
    row = one(ProviderBudget.objects.select_for_update().filter(pk=endpoint))
    if row is not None:
        return row
    try:
        with transaction.atomic():
            ProviderBudget.objects.create(endpoint=endpoint)
    except IntegrityError:
        pass  # another process made it first
    return ProviderBudget.objects.select_for_update().get(pk=endpoint)


def _place(
    row: ProviderBudget, key: str, start: datetime, rate: float | None, now: datetime
) -> datetime:
    """Give a parking request its place in the line `key` (owner:priority), and move that line
    on by one request's share of the rate (the lines already passed are forgotten)."""
    lines = {k: datetime.fromisoformat(at) for k, at in (row.parked_lines or {}).items()}
    place = max(start, lines.get(key, start))
    lines[key] = place + timedelta(seconds=1 / rate if rate else 0)
    row.parked_lines = {k: at.isoformat() for k, at in lines.items() if at > now}
    row.save(update_fields=["parked_lines"])
    return place


def _rate(limits: Limits, row: ProviderBudget) -> float | None:
    """The requests a second the endpoint may start: the configured or the learned, the lower."""
    configured = limits.requests_per_minute and HEADROOM * limits.requests_per_minute / 60
    rates = [r for r in (configured, row.learned_rate) if r]
    return min(rates) if rates else None


def _token_time(limits: Limits, tokens: int) -> timedelta:
    per_minute = HEADROOM * float(limits.tokens_per_minute or math.inf)
    return timedelta(seconds=60 * tokens / per_minute)


def _decayed(row: ProviderBudget, now: datetime) -> float:
    """The recent starts a second, decayed to now (an exponential average over about a second)."""
    if row.recent_at is None:
        return 0.0
    return row.recent_rate * math.exp(-(now - row.recent_at).total_seconds())


def _grow(row: ProviderBudget, limits: Limits, now: datetime) -> None:
    """Count one start in the recent rate; let a learned rate grow back once refusals stop."""
    elapsed = (now - row.recent_at).total_seconds() if row.recent_at else 0.0
    row.recent_rate, row.recent_at = _decayed(row, now) + 1, now
    quiet = row.limited_at is None or (now - row.limited_at).total_seconds() > QUIET
    if row.learned_rate is not None and quiet:
        row.learned_rate *= 1 + GROWTH * min(elapsed, 1.0)
        configured = limits.requests_per_minute and HEADROOM * limits.requests_per_minute / 60
        if configured and row.learned_rate >= configured:
            row.learned_rate = None  # the configured rate bounds it again
