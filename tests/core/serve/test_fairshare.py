"""lokid.core.serve.fairshare: who is admitted next where requests wait for an engine's slots."""

from __future__ import annotations

import pytest

from lokid.core.serve.fairshare import KEEP_ONE, RECENT, UNLIMITED, FairShare, QueueFull, Ticket


def order(fs: FairShare, tickets: list[Ticket], now: float = 0.0) -> list[str]:
    """Each admitted ticket ends, one at a time, in admission order: the keys admitted
    after the first ones, in their order."""
    seen: list[str] = []
    running = [t for t in tickets if t.admitted]
    while running:
        t = running.pop(0)
        for n in fs.leave(t, now):
            seen.append(n.key)
            running.append(n)
    return seen


def test_a_free_slot_admits_at_once() -> None:
    fs = FairShare()
    t = fs.arrive("p", "anonymous", slots=2, now=0.0)
    assert t.admitted and t.waited() == 0.0
    assert fs.arrive("p", "anonymous", slots=2, now=0.0).admitted
    third = fs.arrive("p", "anonymous", slots=2, now=0.0)
    assert not third.admitted
    assert fs.leave(t, 1.0) == [third] and third.waited() == 1.0


def test_a_flooding_key_does_not_push_another_behind_all_its_requests() -> None:
    fs = FairShare()
    flood = [fs.arrive("p", "flood", slots=2, now=0.0) for _ in range(10)]
    one = fs.arrive("p", "other", slots=2, now=0.0)
    assert [t.admitted for t in flood[:2]] == [True, True] and not one.admitted
    assert fs.position(one) == 0
    got = order(fs, flood + [one])
    assert got.index("other") == 0, got
    assert len(got) == 9


def test_three_keys_share_in_turn_and_each_keeps_its_order() -> None:
    fs = FairShare()
    tickets = [fs.arrive("p", k, slots=1, now=0.0) for k in ("a",) * 4 + ("b",) * 4]
    tickets += [fs.arrive("p", "c", slots=1, now=0.0) for _ in range(2)]
    got = order(fs, tickets)
    assert got[:6] == ["b", "c", "a", "b", "c", "a"], got
    a_seq = [t.seq for t in tickets if t.key == "a"]
    assert a_seq == sorted(a_seq)


def test_interactive_before_batch() -> None:
    fs = FairShare()
    first = fs.arrive("p", "job", batch=True, slots=1, now=0.0)
    batch = [fs.arrive("p", "job", batch=True, slots=1, now=0.0) for _ in range(3)]
    person = fs.arrive("p", "alice", slots=1, now=0.0)
    assert fs.position(person) == 0 and fs.position(batch[0]) == 1
    assert fs.leave(first, 1.0) == [person]


def test_max_in_flight_holds_only_that_key() -> None:
    fs = FairShare()
    a = [fs.arrive("p", "a", limit=1, slots=4, now=0.0) for _ in range(3)]
    b = fs.arrive("p", "b", slots=4, now=0.0)
    assert [t.admitted for t in a] == [True, False, False] and b.admitted
    assert fs.leave(a[0], 1.0) == [a[1]]


def test_max_in_flight_counts_every_preset() -> None:
    fs = FairShare()
    x = fs.arrive("x", "a", limit=1, slots=4, now=0.0)
    y = fs.arrive("y", "a", limit=1, slots=4, now=0.0)
    assert x.admitted and not y.admitted
    assert fs.leave(x, 1.0) == [y]


def test_a_batch_flood_leaves_the_interactive_reserve() -> None:
    fs = FairShare()
    person = fs.arrive("p", "alice", slots=4, now=0.0)
    fs.leave(person, 1.0)   # an interactive key came: one slot is kept for it
    batch = [fs.arrive("p", "job", batch=True, slots=4, now=2.0) for _ in range(8)]
    assert sum(t.admitted for t in batch) == 3
    assert fs.reserve("p", 2.0) == 1
    bob = fs.arrive("p", "bob", slots=4, now=3.0)
    assert bob.admitted
    assert fs.leave(bob, 4.0) == []   # its slot stays free for the next person
    # once the interactive keys have been gone KEEP_ONE seconds, batch has every slot
    assert fs.reserve("p", 4.0 + RECENT + 1) == 1
    later = 4.0 + KEEP_ONE + 1
    assert fs.reserve("p", later) == 0
    assert len(fs.leave(next(t for t in batch if t.admitted), later)) == 2
    assert fs.running("p") == 4


def test_the_reserve_follows_the_interactive_demand() -> None:
    fs = FairShare()
    people = [fs.arrive("p", f"u{i}", slots=4, now=0.0) for i in range(3)]
    for t in people:
        fs.leave(t, 1.0)
    batch = [fs.arrive("p", "job", batch=True, slots=4, now=2.0) for _ in range(4)]
    assert sum(t.admitted for t in batch) == 1   # three people chatted: three kept
    assert fs.reserve("p", 2.0) == 3
    # after RECENT seconds without them one slot stays theirs, after KEEP_ONE none
    running = next(t for t in batch if t.admitted)
    admitted = fs.leave(running, 2.0 + RECENT + 1)
    assert len(admitted) == 3 and fs.reserve("p", 2.0 + RECENT + 1) == 1
    assert not fs.arrive("p", "job", batch=True, slots=4, now=2.0 + RECENT + 1).admitted
    admitted = fs.leave(admitted[0], 2.0 + KEEP_ONE + 1)
    assert len(admitted) == 1 and fs.reserve("p", 2.0 + KEEP_ONE + 1) == 0


def test_one_slot_has_no_reserve() -> None:
    fs = FairShare()
    fs.leave(fs.arrive("p", "alice", slots=1, now=0.0), 1.0)
    assert fs.arrive("p", "job", batch=True, slots=1, now=2.0).admitted


def test_bounds_refuse_with_position_and_retry_after() -> None:
    fs = FairShare(max_queue=3, max_queue_per_key=2)
    running = fs.arrive("p", "a", slots=1, now=0.0)
    fs.arrive("p", "a", slots=1, now=0.0)
    fs.arrive("p", "a", slots=1, now=0.0)
    with pytest.raises(QueueFull) as e:
        fs.arrive("p", "a", slots=1, now=0.0)
    assert e.value.scope == "key" and e.value.bound == 2 and "number 3" in str(e.value)
    fs.arrive("p", "b", slots=1, now=0.0)
    with pytest.raises(QueueFull) as e:
        fs.arrive("p", "c", slots=1, now=0.0)
    assert e.value.scope == "preset" and "preset 'p'" in str(e.value)
    assert e.value.retry_after >= 1
    # the pace is measured: a request that held its slot 10 s makes the wait longer
    fs.leave(running, 10.0)
    fs.arrive("p", "d", slots=1, now=10.0)   # the queue full again
    with pytest.raises(QueueFull) as e:
        fs.arrive("p", "c", slots=1, now=10.0)
    assert e.value.retry_after >= 30   # 3 waiting + this one, 10 s each, 1 slot


def test_anonymous_has_the_preset_bound_only() -> None:
    fs = FairShare(max_queue=5, max_queue_per_key=1)
    for _ in range(6):
        fs.arrive("p", "anonymous", slots=1, now=0.0, per_key_bound=False)
    with pytest.raises(QueueFull):
        fs.arrive("p", "anonymous", slots=1, now=0.0, per_key_bound=False)


def test_a_waiter_that_leaves_frees_its_place() -> None:
    fs = FairShare(max_queue=1)
    running = fs.arrive("p", "a", slots=1, now=0.0)
    gone = fs.arrive("p", "b", slots=1, now=0.0)
    with pytest.raises(QueueFull):
        fs.arrive("p", "c", slots=1, now=0.0)
    assert fs.leave(gone, 1.0) == []
    c = fs.arrive("p", "c", slots=1, now=1.0)
    assert fs.leave(running, 2.0) == [c]
    assert fs.leave(running, 2.0) == []   # twice: nothing twice


def test_an_idle_key_claims_no_credit() -> None:
    fs = FairShare()
    # a served 3 at a time while b was idle; then b floods: a's next one is not behind
    for _ in range(3):
        fs.leave(fs.arrive("p", "a", slots=1, now=0.0), 0.0)
    hold = fs.arrive("p", "x", slots=1, now=0.0)
    b = [fs.arrive("p", "b", slots=1, now=0.0) for _ in range(5)]
    a = fs.arrive("p", "a", slots=1, now=0.0)
    assert order(fs, [hold, *b, a]).index("a") <= 1


def test_state_is_dropped_when_idle() -> None:
    fs = FairShare()
    for i in range(1000):
        fs.leave(fs.arrive("p", f"k{i}", batch=True, slots=4, now=0.0), 0.0)
    assert "p" not in fs.presets and not fs.in_flight


def test_unlimited_slots_keep_only_the_key_limit() -> None:
    fs = FairShare()
    got = [fs.arrive("api", "a", limit=2, slots=UNLIMITED, now=0.0) for _ in range(3)]
    assert [t.admitted for t in got] == [True, True, False]
    assert fs.estimate("api", 3) >= 0
