"""lokid.core.serve.scaling: when one more replica starts, and which one stops (issue 47)."""

from __future__ import annotations

from lokid.core.serve.scaling import (
    HOLD_MIN,
    IDLE_AFTER,
    NEVER,
    Compute,
    Engine,
    Load,
    decide,
    hold,
    idle_after,
    shares,
)

ONE = (Engine(1, "ready", 1),)
TWO_IDLE = (Engine(1, "ready", 1), Engine(2, "ready", 0, idle_since=0.0, ours=True))


def test_a_wait_longer_than_a_load_starts_the_lowest_free_replica() -> None:
    s = decide(Load(ONE, 3, waiting=2, waited=5.0, load=4.0, now=100.0))
    assert (s.verb, s.index) == ("start", 2)
    assert "2 wait, the oldest 5.0 s, longer than a replica's load (4.0 s)" in s.why
    # replica 2 stopped by hand, 3 runs: 2 is the one started
    gap = (Engine(1, "ready", 1), Engine(2, "inactive"), Engine(3, "ready", 1))
    assert decide(Load(gap, 3, waiting=1, waited=9.0, load=1.0, now=100.0)).index == 2


def test_a_wait_shorter_than_a_load_starts_nothing_and_says_when_to_look_again() -> None:
    s = decide(Load(ONE, 3, waiting=4, waited=1.0, load=4.0, now=100.0))
    assert s.verb == "" and s.again == 103.0 and "less than a replica's load" in s.why


def test_no_start_past_max_replicas_into_no_room_or_while_one_loads() -> None:
    assert decide(Load(ONE, 1, waiting=1, waited=9.0, load=1.0, now=100.0)).verb == ""
    no_room = decide(Load(ONE, 2, waiting=1, waited=9.0, load=1.0, fits=False, now=100.0))
    assert no_room.verb == "" and "without evicting" in no_room.why
    # room unknown (no placement figures): the start goes on
    assert decide(Load(ONE, 2, waiting=1, waited=9.0, load=1.0, fits=None, now=100.0)).verb \
        == "start"
    loading = (Engine(1, "ready", 1), Engine(2, "loading", ours=True))
    assert decide(Load(loading, 3, waiting=5, waited=60.0, load=1.0, now=100.0)).verb == ""


def test_the_hold_down_after_a_change_is_the_longer_of_its_minimum_and_a_load() -> None:
    assert hold(0.5) == HOLD_MIN and hold(30.0) == 30.0
    held = decide(Load(ONE, 3, waiting=1, waited=9.0, load=3.0, changed_at=98.0, now=100.0))
    assert held.verb == "" and held.again == 101.0 and "held down" in held.why
    assert decide(Load(ONE, 3, waiting=1, waited=9.0, load=3.0, changed_at=97.0,
                       now=100.0)).verb == "start"
    # a stop just made: no stop either until the hold-down passed
    assert decide(Load(TWO_IDLE, 2, load=1.0, idle_stop=4.0, changed_at=99.0,
                       now=100.0)).verb == ""


def test_an_idle_replica_the_rule_started_stops_highest_index_first() -> None:
    assert idle_after(0.0) == IDLE_AFTER and idle_after(40.0) == 10.0
    three = (Engine(1, "ready", 0, idle_since=0.0), Engine(2, "ready", 0, 0.0, ours=True),
             Engine(3, "ready", 0, 0.0, ours=True))
    s = decide(Load(three, 3, load=1.0, idle_stop=40.0, now=10.5))
    assert (s.verb, s.index) == ("stop", 3) and "replica 3 idle 10.5 s" in s.why
    # not idle long enough yet: when to look again
    early = decide(Load(three, 3, load=1.0, idle_stop=40.0, now=5.0))
    assert early.verb == "" and early.again == 10.0
    # the highest busy: none stopped (the lower ones are the warm ones)
    busy = (three[0], three[1], Engine(3, "ready", 2, NEVER, ours=True))
    assert decide(Load(busy, 3, load=1.0, idle_stop=40.0, now=100.0)).verb == ""
    # anything waiting: no stop
    assert decide(Load(three, 3, waiting=1, waited=0.1, load=1.0, idle_stop=40.0,
                       now=100.0)).verb == ""


def test_never_below_what_was_asked_replicas_the_rule_did_not_start_stay() -> None:
    asked = (Engine(1, "ready", 0, idle_since=0.0), Engine(2, "ready", 0, 0.0, ours=False))
    s = decide(Load(asked, 3, load=1.0, idle_stop=4.0, now=1000.0))
    assert s.verb == "" and s.why == "nothing waits"
    # replica 1 (the preset's own) is never stopped here, even marked as started
    own = (Engine(1, "ready", 0, idle_since=0.0, ours=True),)
    assert decide(Load(own, 3, load=1.0, idle_stop=4.0, now=1000.0)).verb == ""


def test_a_replica_that_would_share_its_siblings_compute_is_not_started() -> None:
    # CPU: llama-server's default threads take every physical core, -t N takes N
    assert shares(Compute(threads=0, cores=16), 1).startswith(
        "the CPU with its 1 running engine of 16 threads each (the engine's default")
    assert shares(Compute(threads=8, cores=16), 1) == ""
    assert "2 running engines of 8 threads each (its -t): this host has 16 cores" in \
        shares(Compute(threads=8, cores=16), 2)
    assert shares(Compute(threads=4, cores=0), 5) == ""   # cores not known: it goes on
    assert "2 running engines of 1 thread each (its -t): this host has 2 cores" in \
        shares(Compute(threads=1, cores=2), 2)
    assert shares(Compute(threads=0, cores=1), 1).endswith("this host has 1 core")
    # GPUs chosen at start: one more fits where the host has GPUs its siblings do not take
    assert shares(Compute(gpus=1, host_gpus=2), 1) == ""
    assert shares(Compute(gpus=1, host_gpus=2), 2) == \
        "a GPU with its 2 running engines: this host has 2 GPUs"
    assert "of 2 GPUs each" in shares(Compute(gpus=2, host_gpus=3), 1)
    # a preset naming its GPUs puts every replica there
    assert shares(Compute(fixed=("GPU0",)), 1) == \
        "the GPUs its preset names (GPU0) with its 1 running engine"
    assert shares(Compute(), 3) == ""   # nothing known
    # the rule: no start, a refusal in a word for the log
    cpu = Compute(threads=0, cores=2)
    s = decide(Load(ONE, 3, waiting=2, waited=5.0, load=1.0, compute=cpu, now=100.0))
    assert (s.verb, s.refused) == ("", "compute") and "would share the CPU" in s.why
    two = Compute(threads=1, cores=2)
    assert decide(Load(ONE, 3, waiting=2, waited=5.0, load=1.0, compute=two,
                       now=100.0)).verb == "start"
    # replica 3 beside two of one thread each on two cores: refused
    both = (Engine(1, "ready", 1), Engine(2, "ready", 1, ours=True))
    assert decide(Load(both, 3, waiting=2, waited=5.0, load=1.0, compute=two,
                       now=100.0)).refused == "compute"
    # no room is said too, first (room is the harder fact)
    assert decide(Load(ONE, 3, waiting=1, waited=5.0, load=1.0, fits=False, compute=cpu,
                       now=100.0)).refused == "room"
