"""The shared budget of a model endpoint (agenttasks.flow.budgets): spacing, tokens, refusals,
concurrency, and threads that reserve at once."""

import time
from datetime import datetime, timedelta

import pytest
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import override_settings
from django.utils import timezone

from agenttasks.execution import reaper
from agenttasks.flow import budgets, redis_store
from agenttasks.models import ProviderBudget, ProviderPermit

from ..conftest import run_threads

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True, params=["database", "redis"])
def store(request, monkeypatch):
    """Every test runs against each store of the budgets: the database's rows and Redis (this
    process's own memory of the endpoints starts afresh as well)."""
    if request.param == "redis":
        pytest.importorskip("redis")
    monkeypatch.setattr(budgets, "_free", budgets._Free())
    monkeypatch.setattr(budgets, "_lines", budgets._Lines())
    monkeypatch.setattr(budgets, "_sends", budgets._Sends())
    with override_settings(AGENTTASKS={"BUDGET_STORE": request.param}):
        if request.param == "redis":
            redis_store.clear()
        yield request.param
        if request.param == "redis":
            redis_store.clear()


def limited(**limits):
    """The limits of the endpoint "llm", in the store the test runs against."""
    return override_settings(AGENTTASKS={**settings.AGENTTASKS, "MODEL_LIMITS": {"llm": limits}})


def lapse(endpoint, permit):
    """Make a permit lapse now, as if its holder had died."""
    if budgets.in_redis():
        redis_store.lapse(endpoint, permit)
    else:
        ProviderPermit.objects.filter(pk=permit).update(expires_at=timezone.now())


def live_permits(endpoint):
    if budgets.in_redis():
        return [int(p) for p in redis_store._client().zrange(redis_store._keys(endpoint)[2], 0, -1)]
    return list(ProviderPermit.objects.values_list("pk", flat=True))


def gaps(reservations):
    starts = sorted(r.start for r in reservations)
    return [(b - a).total_seconds() for a, b in zip(starts, starts[1:], strict=False)]


HEADROOM = budgets.HEADROOM  # the share of a configured rate the starts are spaced by


def test_starts_are_spaced_by_the_configured_rate():
    # One a second: a gap stays exact unless one reservation takes longer than the spacing.
    with limited(requests_per_minute=60):
        made = [budgets.reserve("llm", 10, 30) for _ in range(5)]
    assert made[0].start <= timezone.now()
    assert gaps(made) == pytest.approx([1 / HEADROOM] * 4, abs=0.01)


def test_a_start_beyond_the_horizon_is_a_place_in_the_parked_line_not_a_turn():
    with limited(requests_per_minute=60):  # one every 1.11 s at 90 %
        taken = [budgets.reserve("llm", 10, 30, horizon=1.5) for _ in range(2)]
        parked = [budgets.reserve("llm", 10, 30, horizon=1.5) for _ in range(3)]
        again = budgets.reserve("llm", 10, 30, horizon=1.5, parked_before=True)
        direct = budgets.reserve("llm", 10, 30)  # a run that may not park takes the next turn
    spacing = 1 / HEADROOM
    assert not any(r.later for r in taken) and all(r.later for r in parked + [again])
    assert gaps(taken) == pytest.approx([spacing], abs=0.01)
    # Places one after another from the next free start, which nobody took.
    assert [(r.start - parked[0].start).total_seconds() for r in parked] == pytest.approx(
        [0, spacing, 2 * spacing], abs=0.01
    )
    assert (parked[0].start - taken[1].start).total_seconds() == pytest.approx(spacing, abs=0.01)
    assert again.start == parked[0].start  # a run parked before is not sent to the back
    assert direct.start == parked[0].start and not direct.later
    line = budgets.state("llm").parked_lines[":0"]  # anonymous, priority 0
    # Compared as instants: PostgreSQL writes 30.49132 where Python writes 30.491320.
    assert datetime.fromisoformat(line) == parked[2].start + timedelta(seconds=spacing)


def test_each_owner_and_priority_parks_in_a_line_of_its_own():
    with limited(requests_per_minute=60):
        budgets.reserve("llm", 10, 30)  # the next free start is 1.11 s away
        first = [budgets.reserve("llm", 10, 30, horizon=0.5, owner=1) for _ in range(3)]
        other = budgets.reserve("llm", 10, 30, horizon=0.5, owner=2)
        urgent = budgets.reserve("llm", 10, 30, horizon=0.5, owner=1, priority=50)
    assert other.later and other.start == first[0].start  # not behind owner 1's three
    assert urgent.later and urgent.start == first[0].start
    assert set(budgets.state("llm").parked_lines) == {"1:0", "2:0", "1:50"}


def test_an_endpoint_without_limits_starts_slowly_then_faster_and_faster():
    before = timezone.now()
    made = [budgets.reserve("free", 10, 30) for _ in range(64)]
    assert made[0].start <= timezone.now() and all(r.permit is None for r in made)
    spacing = gaps(made)
    # The first start's share is FIRST_RATE's; each start raises the rate by RAMP (about one
    # start a second more, since they came in a moment): 64 starts span about
    # ln(1 + 3 * 64 / 32) / 3 = 0.65 s, where they would all have left at once.
    assert spacing[0] == pytest.approx(1 / budgets.FIRST_RATE, rel=0.05)
    assert spacing[-1] < spacing[0] / 5
    assert 0.5 < (made[-1].start - before).total_seconds() < 0.8
    assert budgets.state("free") is None  # no statement: the process paces its own starts


def test_tokens_are_reserved_and_corrected_by_the_usage():
    with limited(tokens_per_minute=6000):  # 100 tokens a second
        first = budgets.reserve("llm", 50, 30)
        second = budgets.reserve("llm", 50, 30)
        spacing = 50 / (100 * HEADROOM)
        assert (second.start - first.start).total_seconds() == pytest.approx(spacing, abs=0.01)
        before = budgets.state("llm").next_tokens
        budgets.release(second, used_tokens=150)  # it used 100 more than it reserved
        after = budgets.state("llm").next_tokens
    assert (after - before).total_seconds() == pytest.approx(100 / (100 * HEADROOM), abs=0.01)


def test_a_refusal_pauses_the_endpoint_and_lowers_its_rate():
    with limited(requests_per_minute=6000):  # 100 a second
        budgets.reserve("llm", 1, 30)
        budgets.refused("llm", 2.0)
        row = budgets.state("llm")
        learned = 100 * HEADROOM * budgets.SLOWDOWN["configured"]
        assert row.learned_rate == pytest.approx(learned)
        assert row.refusals == 1
        after = [budgets.reserve("llm", 1, 30) for _ in range(3)]
    assert after[0].start >= timezone.now() + timedelta(seconds=1.5)
    assert gaps(after) == pytest.approx([1 / learned] * 2, abs=0.002)


def test_the_refusals_of_one_moment_lower_the_rate_once():
    with limited(requests_per_minute=6000):
        for _ in range(5):
            budgets.refused("llm", 0)
    row = budgets.state("llm")
    learned = 100 * HEADROOM * budgets.SLOWDOWN["configured"]
    assert row.learned_rate == pytest.approx(learned) and row.refusals == 5


def test_without_a_setting_the_rate_is_learned_from_what_was_sent():
    for _ in range(20):  # twenty starts in a moment: about twenty a second
        budgets.reserve("free", 1, 30)
    budgets.refused("free", None)
    learned = budgets.state("free").learned_rate
    assert 10 < learned < 20
    made = [budgets.reserve("free", 1, 30) for _ in range(3)]
    assert min(gaps(made)) >= 1 / 20


def test_a_refusal_at_a_learned_rate_lowers_it_by_a_tenth():
    # A rate learned before (measured, or lowered by an earlier refusal) that has grown back
    # a little past the provider's limit: the refusal says by how little.
    budgets.reserve("free", 1, 30)
    budgets.refused("free", None)
    moved_back("free", 2 * budgets.DROP_EVERY)
    before = budgets.state("free").learned_rate
    budgets.refused("free", None, time.time(), time.time())
    after = budgets.state("free").learned_rate
    assert after == pytest.approx(before * budgets.SLOWDOWN["learned"]) and after < before


def test_an_endpoint_that_learned_a_rate_is_read_once_a_free_check_not_at_each_reservation(
    monkeypatch,
):
    budgets.reserve("free", 1, 30)
    budgets.refused("free", None)
    reads = []
    read = budgets._learned_and_paused
    monkeypatch.setattr(budgets, "_learned_and_paused", lambda e: reads.append(e) or read(e))
    turns = [budgets.reserve("free", 1, 30) for _ in range(5)]
    assert reads == ["free"]
    assert min(gaps(turns)) > 0  # each of them a turn at the learned rate


def sent(endpoint, statuses, at):
    """Note requests to `endpoint` sent from `at` (epoch seconds) a millisecond apart, answered
    with these statuses; return their notes ([sent at, status])."""
    notes = []
    for k, status in enumerate(statuses):
        note: list = [None, None]
        budgets.sent(endpoint, note)
        note[0] = at + k / 1000
        budgets.answered(note, status)
        notes.append(note)
    return notes


def moved_back(endpoint, seconds):
    """Move the endpoint's last drop (`limited_at`) `seconds` into the past."""
    if budgets.in_redis():
        key = redis_store._keys(endpoint)[0]
        was = float(redis_store._client().hget(key, "limited_at"))
        redis_store._client().hset(key, "limited_at", str(was - seconds))
    else:
        row = ProviderBudget.objects.get(pk=endpoint)
        row.limited_at -= timedelta(seconds=seconds)
        row.save()


def test_the_first_refusal_without_a_rate_measures_what_the_cluster_saw_accepted(monkeypatch):
    # This process: 30 requests accepted in the second before the refused one, 5 refused.
    notes = sent("free", [200] * 30 + [429] * 5, time.time() - 0.5)
    refused_at = notes[30][0]
    budgets.refused("free", 1.0, refused_at)
    assert budgets.state("free").learned_rate == pytest.approx(HEADROOM * 30)
    # Another process: 20 accepted before that refused request (and 7 after it, which do not
    # count), then a refusal of its own in the same moment: the cluster's limit is 50.
    monkeypatch.setattr(budgets, "_sends", budgets._Sends())
    monkeypatch.setattr(budgets, "process_name", lambda: "other-host:1")
    others = sent("free", [200] * 20, refused_at - 0.9) + sent("free", [200] * 7, refused_at + 0.01)
    budgets.refused("free", 1.0, others[-1][0] + 0.01)
    row = budgets.state("free")
    assert row.learned_rate == pytest.approx(HEADROOM * 50)
    assert sorted(row.accepted_reports["counts"].values()) == [20, 30]


def test_a_refusal_of_a_request_sent_before_the_last_drop_changes_nothing():
    with limited(requests_per_minute=6000):  # 100 a second
        budgets.refused("llm", 1.0, time.time())
        moved_back("llm", 2 * budgets.DROP_EVERY)  # long enough ago for another drop
        before = budgets.state("llm")
        budgets.refused("llm", 5.0, before.limited_at.timestamp() - 0.1)
        after = budgets.state("llm")
        assert after.learned_rate == pytest.approx(before.learned_rate)
        assert after.paused_until == before.paused_until
        assert after.refusals == before.refusals + 1
        budgets.refused("llm", 1.0, time.time())  # sent since: a new drop
        assert budgets.state("llm").learned_rate < before.learned_rate


def test_a_refusal_of_a_turn_given_before_the_last_drop_sent_since_changes_nothing():
    with limited(requests_per_minute=6000):  # 100 a second
        budgets.refused("llm", 1.0, time.time())
        moved_back("llm", 2 * budgets.DROP_EVERY)  # long enough ago for another drop
        before = budgets.state("llm")
        # Sent just now, from a turn given at the rate the last drop replaced (the line runs
        # ahead): the drop lowered that rate and paused the endpoint already.
        given = before.limited_at.timestamp() - 0.1
        budgets.refused("llm", 5.0, time.time(), given)
        after = budgets.state("llm")
        assert after.learned_rate == pytest.approx(before.learned_rate)
        assert after.paused_until == before.paused_until
        budgets.refused("llm", 5.0, time.time(), time.time())  # a turn given since
        after = budgets.state("llm")
        assert after.learned_rate < before.learned_rate
        assert after.paused_until >= timezone.now() + timedelta(seconds=4)


def test_the_learned_rate_grows_back_once_refusals_stop():
    now = timezone.now()
    seen = {"learned_rate": 10.0, "limited_at": now - timedelta(minutes=1)}
    seen["recent_at"] = now - timedelta(seconds=1)
    if budgets.in_redis():
        as_text = {k: str(v.timestamp() if hasattr(v, "timestamp") else v) for k, v in seen.items()}
        redis_store._client().hset(redis_store._keys("llm")[0], mapping=as_text)
    else:
        ProviderBudget.objects.create(endpoint="llm", **seen)
    with limited(requests_per_minute=6000):
        budgets.reserve("llm", 1, 30)
    assert budgets.state("llm").learned_rate == pytest.approx(10 * (1 + budgets.GROWTH), rel=0.01)


def test_concurrency_is_bounded_by_permits_that_lapse():
    with limited(concurrent=2):
        one, two = budgets.reserve("llm", 1, 30), budgets.reserve("llm", 1, 30)
        assert not one.busy and not two.busy
        assert budgets.reserve("llm", 1, 30).busy
        budgets.release(one)
        three = budgets.reserve("llm", 1, 30)
        assert not three.busy
        # A holder that died: its permit lapses at its expiry.
        lapse("llm", two.permit)
        assert not budgets.reserve("llm", 1, 30).busy
        assert budgets.reserve("llm", 1, 30).busy


def test_the_reaper_forgets_the_permits_of_dead_holders():
    with limited(concurrent=5):
        kept, lapsed = budgets.reserve("llm", 1, 30), budgets.reserve("llm", 1, 30)
    lapse("llm", lapsed.permit)
    reaper.reap()
    assert live_permits("llm") == [kept.permit]


def test_threads_reserving_at_once_get_distinct_spaced_starts():
    """The row lock makes each reservation see the one before (PostgreSQL: real row locks)."""
    with limited(requests_per_minute=60 * 50):  # 50 a second
        made = run_threads(lambda i: budgets.reserve("llm", 1, 30), 8)
    assert all(isinstance(r, budgets.Reservation) for r in made), made
    assert min(gaps(made)) >= 0.02 - 1e-6


def test_concurrency_holds_across_threads():
    with limited(concurrent=3):
        made = run_threads(lambda i: budgets.reserve("llm", 1, 30), 8)
    assert sum(not r.busy for r in made) == 3, made


@pytest.mark.parametrize(
    "setting, problem",
    [
        ([], "MODEL_LIMITS must be a dict"),
        ({"llm": 5}, "MODEL_LIMITS['llm'] must be a dict"),
        ({"llm": {"rpm": 5}}, "unknown keys ['rpm']"),
        ({"llm": {"requests_per_minute": 0}}, "['requests_per_minute'] must be a positive number"),
        ({"llm": {"concurrent": 2.5}}, "['concurrent'] must be a positive number"),
        ({"llm": {"tokens_per_minute": True}}, "['tokens_per_minute'] must be a positive number"),
    ],
)
def test_bad_limits_fail_the_system_check(setting, problem):
    with override_settings(AGENTTASKS={"MODEL_LIMITS": setting}):
        with pytest.raises(SystemCheckError) as raised:
            call_command("check")
    assert "agenttasks.E007" in str(raised.value) and problem in str(raised.value)


def test_an_unknown_budget_store_fails_the_system_check():
    with override_settings(AGENTTASKS={"BUDGET_STORE": "memcached"}):
        with pytest.raises(SystemCheckError) as raised:
            call_command("check")
    assert "agenttasks.E007" in str(raised.value)
    assert "BUDGET_STORE must be 'auto', 'database' or 'redis'" in str(raised.value)


def test_good_limits_pass_the_system_check():
    good = {"llm": {"requests_per_minute": 3000, "tokens_per_minute": 10**6, "concurrent": 5}}
    with override_settings(AGENTTASKS={"MODEL_LIMITS": good}):
        call_command("check")


def test_the_room_left_in_a_line_is_what_this_process_last_saw():
    with limited(requests_per_minute=600):  # 9 a second at 90 %
        for _ in range(5):
            budgets.reserve("llm", 10, 30)
        fits = budgets.room(1.0)["llm"]
    # Five turns hold about 0.56 s of the line: about 4 more fit before it is 1 s long.
    assert fits in (3, 4)
    with limited(requests_per_minute=600):
        for _ in range(6):
            budgets.reserve("llm", 10, 30)
        fits = budgets.room(1.0)["llm"]
    assert fits == 0  # full: nothing more until the line moves
    # An endpoint without a rate that this process has not used takes a second of its slow
    # start's first rate; once used, what its line has room for at the rate it reached.
    assert budgets.room(1.0, ["no-rate"])["no-rate"] == budgets.FIRST_RATE
    budgets.reserve("no-rate", 10, 30)
    assert budgets.room(1.0, ["no-rate"])["no-rate"] in (30, 31)


def test_after_a_reaper_pass_the_budgets_row_says_what_the_store_holds():
    """The admin and `GET /health` read the rows; with Redis, the reaper copies them there."""
    with limited(requests_per_minute=600):
        budgets.reserve("llm", 10, 30)
        budgets.refused("llm", 5.0)
    reaper.reap()
    row = ProviderBudget.objects.get(pk="llm")
    held = budgets.state("llm")
    assert row.refusals == held.refusals == 1
    assert row.learned_rate == pytest.approx(held.learned_rate)
    assert row.paused_until == held.paused_until
    assert row.paused_until > timezone.now() + timedelta(seconds=4)
