"""lokid.gateway.replicaroom: a preset's replicas as residents of the gateway's placement
(issue 47). The rows are the daemon's ``Memory`` and ``Replicas`` as the gateway holds
them; lokid.core.place.policy decides on them as it does for every engine."""

from __future__ import annotations

from lokid.core.place.policy import Device, Need, Resident, Waiting, decide, fits_now
from lokid.gateway.presets import Engine, Preset
from lokid.gateway.replicaroom import replica_residents

GIB = 1 << 30


def preset(states: dict[int, str]) -> Preset:
    p = Preset("r", state="ready", memory={
        "needs": {"host": GIB, "GPU0": 30 * GIB},
        "replicas_held": {"2": {"host": GIB, "GPU1": 30 * GIB},
                          "3": {"host": GIB, "GPU1": 30 * GIB}, "x": {"GPU0": 1}}})
    p.engines = tuple(Engine(k, s, f"http://127.0.0.1:{9000 + k}", in_flight=k)
                      for k, s in states.items())
    return p


def test_each_live_replica_holds_its_own_room_and_is_never_a_victim() -> None:
    found = replica_residents(preset({1: "ready", 2: "ready", 3: "loading"}))
    assert [(r.preset, dict(r.held), r.keep, r.starting, r.in_flight) for r in found] == [
        ("r:2", {"host": GIB, "GPU1": 30 * GIB}, True, False, 2),
        ("r:3", {"host": GIB, "GPU1": 30 * GIB}, True, True, 3)]
    # a replica gone holds nothing (its row may outlive its Memory by a reading)
    assert [r.preset for r in replica_residents(preset({1: "ready", 2: "inactive",
                                                        3: "failed"}))] == []
    assert replica_residents(Preset("q")) == []   # no replicas_held: nothing


def test_the_room_a_replica_took_is_not_granted_to_another_preset() -> None:
    gpus = [Device("host", 64 * GIB), Device("GPU0", 40 * GIB), Device("GPU1", 40 * GIB)]
    other = Need("other", {"GPU1": 20 * GIB})
    # the preset's own engine, on GPU0 (lokid.gateway.placer.held_of)
    own = [Resident("r", {"host": GIB, "GPU0": 30 * GIB}, keep=True)]
    # counted without its replica, GPU1 looked free
    assert fits_now(other, gpus, own)
    live = preset({1: "ready", 2: "ready"})
    residents = own + replica_residents(live)
    assert not fits_now(other, gpus, residents)
    # and the rule holds the start rather than evict the replica for it
    plan = decide(gpus, residents, [Waiting(other, 0.0, 1)], now=10.0)
    assert not plan.starts and not plan.evictions and plan.holds
    assert "r:2 is kept (a replica" in plan.holds[0].why, plan.holds[0].why
