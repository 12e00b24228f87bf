"""The model endpoints' shared budgets kept in Redis, for clusters on django-q2's Redis broker.

The same steps as the database's reservation (flow.budgets), each one Lua script that Redis runs
alone, so every process of every node that shares the Redis draws from one budget with one round
trip and no lock held while the model answers. Times are Redis's own clock (TIME), in seconds.

Per endpoint: a hash of the budget's fields (ProviderBudget's, times as epoch seconds), a hash
of the parked lines (owner:priority to the epoch where each ends), a sorted set of the
concurrency permits by expiry, and a counter naming the permits. The keys carry the database's
name, so clusters that share the database share the budget. The reaper copies each budget into
its ProviderBudget row (`mirror`), which the admin and `GET /health` read.
"""

import functools
import json
from datetime import UTC, datetime

from django.db import connection
from django.utils import timezone

from ..models import ProviderBudget

# Shared by the scripts: the parameters, Redis's clock, and the budget's fields.
_PREAMBLE = """
local p = cjson.decode(ARGV[1])
local function given(v) if v == nil or v == cjson.null then return nil end return tonumber(v) end
local function at(s) if s then return tonumber(s) end return nil end
local function f(x) return string.format('%.6f', x) end
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
redis.call('SADD', KEYS[5], p.endpoint)
local b = redis.call('HMGET', KEYS[1], 'next_start', 'next_tokens', 'paused_until',
                     'learned_rate', 'recent_rate', 'recent_at', 'limited_at')
local next_start, next_tokens, paused_until = at(b[1]), at(b[2]), at(b[3])
local learned, recent_rate, recent_at, limited_at = at(b[4]), at(b[5]) or 0, at(b[6]), at(b[7])
local rpm = given(p.requests_per_minute)
local configured = rpm and p.headroom * rpm / 60
local rate = configured
if learned and (not configured or learned < configured) then rate = learned end
local function rated() if rate then return f(rate) end return '' end
"""

# flow.budgets.reserve: answers {kind, start, rate, free_start, permit}; kind is "start",
# "busy" (concurrency used up) or "later" (beyond the horizon: start is the place in line).
_RESERVE = (
    _PREAMBLE
    + """
local tpm, concurrent = given(p.tokens_per_minute), given(p.concurrent)
if concurrent then
    redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', f(now))  -- the lapsed permits
    if redis.call('ZCARD', KEYS[3]) >= concurrent then return {'busy', f(now), '', f(now), ''} end
end
local start = math.max(now, next_start or now, paused_until or now)
local token_start = math.max(now, next_tokens or now)
if tpm then start = math.max(start, token_start) end
local horizon = given(p.horizon)
if horizon and start - now > horizon then
    if p.parked_before then return {'later', f(start), rated(), f(start), ''} end
    local place = math.max(start, at(redis.call('HGET', KEYS[2], p.line)) or start)
    redis.call('HSET', KEYS[2], p.line, f(place + (rate and 1 / rate or 0)))
    local lines = redis.call('HGETALL', KEYS[2])
    for i = 1, #lines, 2 do
        if tonumber(lines[i + 1]) <= now then redis.call('HDEL', KEYS[2], lines[i]) end
    end
    return {'later', f(place), rated(), f(start), ''}
end
-- The start counts in the recent rate; a learned rate grows back once refusals stop.
local elapsed = recent_at and (now - recent_at) or 0
if recent_at then recent_rate = recent_rate * math.exp(-elapsed) + 1 else recent_rate = 1 end
if learned and (not limited_at or now - limited_at > p.quiet) then
    learned = learned * (1 + p.growth * math.min(elapsed, 1))
    if configured and learned >= configured then learned = nil end
end
redis.call('HSET', KEYS[1], 'recent_rate', f(recent_rate), 'recent_at', f(now))
if learned then redis.call('HSET', KEYS[1], 'learned_rate', f(learned))
else redis.call('HDEL', KEYS[1], 'learned_rate') end
if rate then redis.call('HSET', KEYS[1], 'next_start', f(start + 1 / rate)) end
if tpm then
    redis.call('HSET', KEYS[1], 'next_tokens',
               f(token_start + 60 * p.tokens / (p.headroom * tpm)))
end
local permit = ''
if concurrent then
    permit = tostring(redis.call('INCR', KEYS[4]))
    redis.call('ZADD', KEYS[3], f(start + p.timeout + p.permit_slack), permit)
end
return {'start', f(start), rated(), f(start), permit}
"""
)

# flow.budgets.refused: pause the endpoint and lower its rate (once per drop_every at most; not
# for a request whose turn was given before the last drop); at the first refusal of an endpoint
# without a rate, the processes' reports of what the provider accepted (measure_counts) set it.
_REFUSED = (
    _PREAMBLE
    + """
local wait, sent_at = given(p.wait), given(p.sent_at)
local given_at = given(p.reserved_at) or sent_at
local stale = limited_at and given_at and given_at < limited_at
if wait and wait > 0 and not stale then paused_until = math.max(paused_until or now, now + wait) end
local measure_at = at(redis.call('HGET', KEYS[1], 'measure_at'))
if not stale and (not limited_at or now - limited_at >= p.drop_every) then
    local sent, slowdown = rate, p.slowdown
    if not sent then
        slowdown = p.guessed_slowdown
        local decayed = recent_at and recent_rate * math.exp(-(now - recent_at)) or 0
        sent = math.max(decayed, given(p.cluster_rate) or 0)
    end
    redis.call('HSET', KEYS[1], 'learned_rate', f(math.max(p.least_rate, sent * slowdown)),
               'limited_at', f(now))
    if not rate and sent_at then
        measure_at = tonumber(f(sent_at))
        redis.call('HSET', KEYS[1], 'measure_at', f(sent_at), 'measure_counts', '{}')
    else
        measure_at = nil
        redis.call('HDEL', KEYS[1], 'measure_at', 'measure_counts')
    end
end
local report_at = given(p.report_at)
if measure_at and given(p.report) and report_at and math.abs(report_at - measure_at) < 1e-5 then
    local counts = cjson.decode(redis.call('HGET', KEYS[1], 'measure_counts') or '{}')
    counts[p.process] = p.report
    local sum = 0
    for _, n in pairs(counts) do sum = sum + n end
    redis.call('HSET', KEYS[1], 'measure_counts', cjson.encode(counts))
    if sum > 0 then
        redis.call('HSET', KEYS[1], 'learned_rate', f(math.max(p.least_rate, p.headroom * sum)))
    end
end
if paused_until then redis.call('HSET', KEYS[1], 'paused_until', f(paused_until)) end
redis.call('HSET', KEYS[1], 'next_start', f(math.max(next_start or now, paused_until or now)))
redis.call('HINCRBY', KEYS[1], 'refusals', 1)
return 1
"""
)

# flow.budgets.release: give back a permit; move the tokens' next free time by p.tokens_seconds.
_RELEASE = """
local p = cjson.decode(ARGV[1])
if p.permit ~= cjson.null then redis.call('ZREM', KEYS[3], tostring(p.permit)) end
if p.tokens_seconds ~= 0 and redis.call('HEXISTS', KEYS[1], 'next_tokens') == 1 then
    redis.call('HINCRBYFLOAT', KEYS[1], 'next_tokens', p.tokens_seconds)
end
return 1
"""


@functools.cache
def _client():
    from django_q.brokers.redis_broker import Redis

    return Redis.get_connection()  # django-q2's Redis settings (Q_CLUSTER["redis"])


@functools.cache
def _script(text: str):
    return _client().register_script(text)


def _index() -> str:
    return f"agenttasks:budgets:{connection.settings_dict['NAME']}"


def _keys(endpoint: str) -> list[str]:
    """The endpoint's budget, lines, permits and permit counter, and the index of endpoints."""
    base = f"agenttasks:budget:{connection.settings_dict['NAME']}:{endpoint}"
    return [base, f"{base}:lines", f"{base}:permits", f"{base}:permit-ids", _index()]


def _run(text: str, p: dict):
    """Run one of the scripts on the budget of p["endpoint"]; return its answer."""
    return _script(text)(keys=_keys(p["endpoint"]), args=[json.dumps(p)])


def reserve(p: dict) -> dict:
    """Reserve a request's turn (the parameters and the answer of agenttasks_reserve_v1)."""
    kind, start, rate, free_start, permit = (v.decode() for v in _run(_RESERVE, p))
    return {
        "start": _instant(start).isoformat(),
        "free_start": _instant(free_start).isoformat(),
        "rate": float(rate) if rate else None,
        "busy": kind == "busy",
        "later": kind == "later",
        "permit": int(permit) if permit else None,
    }


def refused(p: dict) -> None:
    """Pause the endpoint and lower its rate (the steps of flow.budgets.refused)."""
    _run(_REFUSED, p)


def measure_at(endpoint: str) -> float | None:
    """When the request was sent whose refusal began the endpoint's measure under way, if any."""
    value = _client().hget(_keys(endpoint)[0], "measure_at")
    return float(value) if value else None


def release(endpoint: str, permit: int | None, tokens_seconds: float) -> None:
    """Give back a permit, and move the tokens' next free time by `tokens_seconds`."""
    p = {"endpoint": endpoint, "permit": permit, "tokens_seconds": tokens_seconds}
    _run(_RELEASE, p)


def free_state(endpoint: str) -> tuple[float | None, datetime | None]:
    """Return the endpoint's learned rate and pause (None, None when it has no budget yet)."""
    learned, paused = _client().hmget(_keys(endpoint)[0], "learned_rate", "paused_until")
    return (float(learned) if learned else None), (_instant(paused) if paused else None)


def state(endpoint: str) -> ProviderBudget | None:
    """Return the endpoint's budget as an unsaved ProviderBudget (None when it has none)."""
    budget_key, lines_key = _keys(endpoint)[:2]
    fields = {k.decode(): v.decode() for k, v in _client().hgetall(budget_key).items()}
    if not fields:
        return None
    lines = {k.decode(): v.decode() for k, v in _client().hgetall(lines_key).items()}
    times = ("next_start", "next_tokens", "paused_until", "recent_at", "limited_at")
    return ProviderBudget(
        endpoint=endpoint,
        **{name: _instant(fields[name]) for name in times if name in fields},
        learned_rate=float(fields["learned_rate"]) if "learned_rate" in fields else None,
        recent_rate=float(fields.get("recent_rate", 0)),
        refusals=int(fields.get("refusals", 0)),
        parked_lines={line: _instant(at).isoformat() for line, at in lines.items()},
        accepted_reports={
            "at": float(fields["measure_at"]),
            "counts": json.loads(fields.get("measure_counts") or "{}"),
        }
        if "measure_at" in fields
        else None,
    )


def endpoints() -> list[str]:
    """Return the endpoints that have a budget in Redis."""
    return sorted(e.decode() for e in _client().smembers(_index()))


def mirror() -> int:
    """Copy each endpoint's budget into its ProviderBudget row (for the admin and
    `GET /health`); return how many were copied."""
    copied = 0
    for endpoint in endpoints():
        budget = state(endpoint)
        if budget is not None:
            budget.save()  # an insert or an update of the row the primary key names
            copied += 1
    return copied


def forget_lapsed() -> int:
    """Drop the permits whose holders died; return how many."""
    now = timezone.now().timestamp()
    return sum(
        _client().zremrangebyscore(_keys(endpoint)[2], "-inf", now) for endpoint in endpoints()
    )


def lapse(endpoint: str, permit: int) -> None:
    """Make a permit lapse now, as if its holder had died (tests)."""
    _client().zadd(_keys(endpoint)[2], {str(permit): timezone.now().timestamp()})


def clear() -> None:
    """Delete every budget of this database (tests)."""
    for endpoint in endpoints():
        _client().delete(*_keys(endpoint)[:4])
    _client().delete(_index())


def _instant(epoch: str) -> datetime:
    return datetime.fromtimestamp(float(epoch), tz=UTC)
