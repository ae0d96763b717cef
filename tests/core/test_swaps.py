"""lokid.core.swaps: which preset of a GPU group runs next, and when its swap may happen.

The rule, table by table, and whole runs of it on a simulated clock (each request served
in SERVE seconds, a start taking START): A B A A C B with A running costs 2 swaps where
FIFO costs 4; a preset flooded with its own requests does not starve another; a start
nobody waits for is given up for another preset's request, and kept otherwise."""

from __future__ import annotations

from dataclasses import replace

import pytest

from lokid.core.swaps import MAX_WAIT, Decision, Holder, Waiting, changes, decide

SERVE, START, DRAIN = 1.0, 0.5, 120.0


def holder(preset: str = "A", ready: bool = True, since: float = -100.0, in_flight: int = 0,
           drain: float = DRAIN) -> Holder:
    return Holder(preset, ready, since, in_flight, drain)


def simulate(arrivals: list[tuple[float, str]], running: str = "A", drain: float = DRAIN,
             until: float = 1000.0) -> tuple[list[tuple[str, float, float]], int]:
    """The group's run: each request (arrival time, preset) served SERVE seconds from its
    admission (or from its preset's READY when admitted during the start); returns each
    request's (preset, arrival, service start) in the order admitted, and the swaps."""
    pending = sorted(enumerate(arrivals), key=lambda x: (x[1][0], x[0]))
    waiting: list[Waiting] = []
    ends: list[float] = []
    served: list[tuple[str, float, float]] = []
    current = Holder(running, True, -100.0, 0, drain) if running else None
    ready_at, swaps, t = 0.0, 0, 0.0
    while t <= until:
        while pending and pending[0][1][0] <= t:
            key, (at, preset) = pending.pop(0)
            waiting.append(Waiting(key, preset, at))
        if current is not None:
            ready = current.ready or t >= ready_at
            current = replace(current, ready=ready, in_flight=sum(e > t for e in ends))
        d = decide(current, waiting, t)
        if d.admit:
            assert current is not None
            for key in d.admit:
                w = next(w for w in waiting if w.key == key)
                waiting.remove(w)
                begin = t if current.ready else ready_at
                served.append((w.preset, w.since, begin))
                ends.append(begin + SERVE)
            continue
        if d.swap_to:
            swaps += current is not None
            assert d.cut or current is None or current.in_flight == 0
            current = Holder(d.swap_to, False, t, 0, drain)
            ready_at = t + START
            continue
        future = [x for x in [*ends, ready_at, d.again_at,
                              pending[0][1][0] if pending else None]
                  if x is not None and x > t]
        if not future:
            break
        t = min(future)
    return served, swaps


# --- the rule, case by case ---------------------------------------------------------------


@pytest.mark.parametrize("held, waiting, now, expected", [
    # nothing waits: nothing to do
    (holder(), [], 0.0, Decision()),
    (None, [], 0.0, Decision()),
    # no preset of the group ran yet: the oldest request's preset starts
    (None, [Waiting(1, "B", 2.0), Waiting(2, "C", 1.0)], 3.0, Decision(swap_to="C")),
    # the holder's own requests go to it at once while nobody else waits
    (holder(in_flight=3), [Waiting(1, "A", 0.0), Waiting(2, "A", 0.1)], 1.0,
     Decision(admit=(1, 2))),
    # another preset waits: the holder's requests in flight are not cut (drain)...
    (holder(in_flight=1), [Waiting(1, "B", 0.0)], 5.0, Decision(again_at=DRAIN)),
    # ...and it swaps the moment the last one ends
    (holder(in_flight=0), [Waiting(1, "B", 0.0)], 5.0, Decision(swap_to="B")),
    # the holder's own new requests still go first, within MAX_WAIT of the other's wait
    (holder(in_flight=1), [Waiting(1, "B", 0.0), Waiting(2, "A", 5.0)], 5.0,
     Decision(admit=(2,), again_at=MAX_WAIT)),
    # past MAX_WAIT they wait their turn: the holder drains
    (holder(in_flight=1), [Waiting(1, "B", 0.0), Waiting(2, "A", 31.0)], 31.0,
     Decision(again_at=DRAIN)),
    (holder(in_flight=0), [Waiting(1, "B", 0.0), Waiting(2, "A", 31.0)], 31.0,
     Decision(swap_to="B")),
    # its drain over, the swap happens with requests in flight (the bound of a wait)
    (holder(in_flight=2), [Waiting(1, "B", 0.0)], DRAIN, Decision(swap_to="B", cut=True)),
    # a short drain also shortens the holder's head start
    (holder(in_flight=1, drain=10.0), [Waiting(1, "B", 0.0), Waiting(2, "A", 10.0)], 10.0,
     Decision(swap_to="B", cut=True)),
    # the longest waiting preset goes next, whatever the order of presets
    (holder(), [Waiting(1, "C", 1.0), Waiting(2, "B", 2.0), Waiting(3, "B", 0.5)], 3.0,
     Decision(swap_to="B")),
    # a start under way serves its own requests, past MAX_WAIT, and is never cut
    (holder("B", ready=False, since=0.0), [Waiting(1, "C", 0.0), Waiting(2, "B", 50.0)],
     50.0, Decision(admit=(2,))),
    (holder("B", ready=False, since=0.0, in_flight=1), [Waiting(1, "C", 0.0)], 500.0,
     Decision()),
    # a start whose every request went away is given up for another preset's request...
    (holder("B", ready=False, since=0.0, in_flight=0), [Waiting(1, "C", 1.0)], 2.0,
     Decision(swap_to="C")),
    # ...and kept while nobody else waits (the next client will want it)
    (holder("B", ready=False, since=0.0, in_flight=0), [], 2.0, Decision()),
    # a holder stopped meanwhile (idle stop): its own request starts it again
    (holder("B", ready=False), [Waiting(1, "B", 1.0)], 2.0, Decision(admit=(1,))),
])
def test_the_rule(held: Holder | None, waiting: list[Waiting], now: float,
                  expected: Decision) -> None:
    assert decide(held, waiting, now) == expected


def test_the_head_start_counts_from_the_turn_not_from_the_others_arrival() -> None:
    # C has waited 100 s (for A, then for B's start); B's turn began at 90: B's own
    # request arriving at 95 still goes to it
    got = decide(holder("B", since=90.0, in_flight=1),
                 [Waiting(1, "C", 0.0), Waiting(2, "B", 95.0)], 95.0)
    assert got == Decision(admit=(2,), again_at=90.0 + MAX_WAIT)


# --- whole runs ----------------------------------------------------------------------------


def test_a_b_a_a_c_b_costs_two_swaps_where_fifo_costs_four() -> None:
    order = ["A", "B", "A", "A", "C", "B"]
    served, swaps = simulate([(i * 0.001, p) for i, p in enumerate(order)])
    assert [p for p, _, _ in served] == ["A", "A", "A", "B", "B", "C"]
    assert swaps == 2 == changes("A", [p for p, _, _ in served])
    assert changes("A", order) == 4
    # no request cut: each swap waited for the requests in flight (asserted in simulate)
    waits = {p: begin - at for p, at, begin in served}
    assert waits["A"] == 0 and waits["B"] == pytest.approx(SERVE + START, abs=0.01)
    assert waits["C"] == pytest.approx(2 * (SERVE + START), abs=0.01)


def test_a_flooded_preset_does_not_starve_another() -> None:
    # A's own requests every half second for ten minutes, one for B at t=1
    arrivals = [(i * 0.5, "A") for i in range(1200)] + [(1.0, "B")]
    served, swaps = simulate(arrivals, until=700.0)
    b = next(s for s in served if s[0] == "B")
    # A takes new requests for MAX_WAIT after B began waiting, then drains (1 s)
    assert b[2] - b[1] <= MAX_WAIT + SERVE + START + 0.01
    a_during_wait = [s for s in served if s[0] == "A" and b[1] < s[2] < b[2]]
    assert a_during_wait and max(s[2] for s in a_during_wait) <= b[1] + MAX_WAIT
    # and A gets the GPU back for the requests that waited behind B
    assert swaps >= 2 and served[-1][0] == "A"


def test_a_long_request_in_flight_holds_a_swap_at_most_its_drain() -> None:
    got = [decide(holder(in_flight=1, drain=30.0), [Waiting(1, "B", 10.0)], now)
           for now in (10.0, 39.9, 40.0)]
    assert got == [Decision(again_at=40.0), Decision(again_at=40.0),
                   Decision(swap_to="B", cut=True)]


def test_a_start_given_up_when_its_clients_left_and_another_waits() -> None:
    # B's start under way for one request; the client leaves (it is no longer waiting nor
    # in flight) while a request for C waits: C goes next at once, B's start is stopped
    starting = holder("B", ready=False, since=0.0, in_flight=1)
    assert decide(starting, [Waiting(2, "C", 0.2)], 0.3) == Decision()
    gone = replace(starting, in_flight=0)
    assert decide(gone, [Waiting(2, "C", 0.2)], 0.3) == Decision(swap_to="C")


@pytest.mark.parametrize("running, order, expected", [
    ("A", [], 0), ("A", ["A", "A"], 0), ("", ["A", "B"], 1), ("A", ["B", "A", "B"], 3),
])
def test_changes(running: str, order: list[str], expected: int) -> None:
    assert changes(running, order) == expected
