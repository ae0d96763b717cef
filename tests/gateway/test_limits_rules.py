"""The rules of lokid.gateway.limits without a process: the windows, the budgets, the
daemon's totals, and what a refused client reads (the same code the gateway runs; its
tests through the real gateway and engine are test_limits.py)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from lokid.core.serve.keys import ANONYMOUS, Identity, Limits, legacy_identity
from lokid.gateway.limits import SPAN, Limiter, LimitReached, Window

NOON = datetime(2026, 12, 7, 12, 3, 0, tzinfo=UTC).timestamp()


def key(**limits: int) -> Identity:
    return Identity("bob", limits=Limits(**limits))


def test_a_window_counts_the_last_minute_only() -> None:
    w = Window()
    w.add(5, NOON)
    w.add(3, NOON + 30.5)
    assert w.used(NOON + 59.9) == 8
    assert w.used(NOON + 60) == 3          # the first second left the window
    assert w.frees(3, NOON + 60) == NOON + 31 + SPAN - 1   # when the 3 of 12:03:30 leave
    assert w.used(NOON + 91) == 0
    w.add(1, NOON + 1000)                   # long after: nothing left of before
    assert w.used(NOON + 1000) == 1
    w.add(7, NOON + 900)                    # older than the window (clock stepped back)
    assert w.used(NOON + 1000) == 1


def test_a_window_is_bounded_whatever_the_rate() -> None:
    w = Window()
    for i in range(100_000):
        w.add(1, NOON + i / 1000)
    assert len(w.counts) == SPAN and w.used(NOON + 100) == 100_000 - 41_000


def test_requests_per_minute() -> None:
    limiter = Limiter()
    bob = key(requests_per_minute=3)
    for i in range(3):
        limiter.check(bob, NOON + i)
    with pytest.raises(LimitReached) as e:
        limiter.check(bob, NOON + 10)
    err = e.value
    assert err.status == 429 and err.code == "rate_limit_exceeded" and err.kind == "requests"
    assert err.message == "key 'bob': 3 requests per minute, next at 12:04:00 UTC"
    assert err.headers == {"Retry-After": "50"}
    with pytest.raises(LimitReached):   # a refused request does not count
        limiter.check(bob, NOON + 59.5)
    limiter.check(bob, NOON + 60)       # the first one left the window
    with pytest.raises(LimitReached):
        limiter.check(bob, NOON + 60.5)
    limiter.prune(NOON + 130)           # a key idle a minute keeps nothing
    assert limiter.requests == {}
    limiter.check(bob, NOON + 130)


def test_tokens_per_minute_counts_what_ended() -> None:
    limiter = Limiter()
    bob = key(tokens_per_minute=100)
    limiter.check(bob, NOON)
    limiter.check(bob, NOON)            # both admitted: their tokens are not known yet
    limiter.spent(bob, 70, NOON + 5)
    limiter.check(bob, NOON + 6)
    limiter.spent(bob, 70, NOON + 7)    # the requests in flight passed the limit
    with pytest.raises(LimitReached) as e:
        limiter.check(bob, NOON + 8)
    assert e.value.kind == "tokens" and e.value.code == "rate_limit_exceeded"
    assert "100 tokens per minute (140 used in the last minute), next at 12:04:05 UTC" \
        in e.value.message
    limiter.check(bob, NOON + 65)       # the first 70 left at 12:04:05: 70 < 100


def test_a_day_budget_names_the_reset_and_a_month_too() -> None:
    limiter = Limiter()
    bob = key(tokens_per_day=1000, tokens_per_month=5000)
    limiter.spent(bob, 1200, NOON)
    with pytest.raises(LimitReached) as e:
        limiter.check(bob, NOON + 1)
    err = e.value
    assert err.code == "insufficient_quota" and err.kind == "insufficient_quota"
    assert err.message == ("key 'bob': its budget of 1000 tokens per day is used (1200 tokens "
                           "today); it resets at 2026-12-08 00:00 UTC")
    assert int(err.headers["Retry-After"]) == 12 * 3600 - 4 * 60 + 59
    tomorrow = NOON + 86400
    limiter.check(bob, tomorrow)        # a new UTC day
    limiter.spent(bob, 3900, tomorrow)  # the month: 1200 + 3900
    with pytest.raises(LimitReached) as e:
        limiter.check(bob, tomorrow + 60)
    assert "5000 tokens per month is used (5100 tokens this month); it resets at " \
        "2027-01-01 00:00 UTC" in e.value.message


def test_the_daemons_totals_are_added_once() -> None:
    limiter = Limiter()
    bob = key(tokens_per_day=1000)
    limiter.spent(bob, 300, NOON)
    # a read asked now: the 300 were reported before it, the daemon's answer holds them
    for budgets in (limiter.days, limiter.months):
        for b in budgets.values():
            b.asked = b.counted
    limiter.spent(bob, 50, NOON + 1)    # after the question: not in the answer
    limiter.totals({"bob": (900, 4000), "carol": (10, 20)}, NOON)
    assert limiter.days["bob"].used() == 950 and limiter.months["bob"].used() == 4050
    assert limiter.days["carol"].used() == 10
    limiter.check(bob, NOON + 2)
    limiter.spent(bob, 50, NOON + 3)
    with pytest.raises(LimitReached):
        limiter.check(bob, NOON + 4)
    # the next day's answer (asked before bob's last 100) drops the days past
    limiter.totals({"carol": (0, 30)}, NOON + 86400)
    assert "bob" not in limiter.days and limiter.days["carol"].used() == 0
    assert limiter.months["bob"].used() == 100 and limiter.months["carol"].used() == 30


def test_a_key_without_limits_is_never_refused_and_keeps_no_state() -> None:
    limiter = Limiter()
    for who in (ANONYMOUS, legacy_identity("sk-x"), Identity("alice")):
        for i in range(10_000):
            limiter.check(who, NOON + i / 100)
    assert not limiter.requests and not limiter.tokens
