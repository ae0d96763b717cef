"""lokid.gateway.placer: the placement rule's edge, step by step.

What the placer reads of the daemon (Devices, each preset's Memory, states, Keep) is
given here by hand, in the shapes the daemon's properties have, and its StopPreset is a
stand-in that moves the preset's state as the daemon's signals would; the real daemon,
engines and gateway run the same placer in tests/gateway/test_placement.py. The clock is
the test's.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from lokid.core.place.settings import PlacementConfig
from lokid.gateway.placer import Placer, devices_of, need_of
from lokid.gateway.presets import Preset
from lokid.gateway.replies import GatewayError
from lokid.gateway.slots import SlotCache

MiB = 2**20


class FakePresets:
    """The parts of lokid.gateway.presets.Presets the placer uses."""

    def __init__(self, devices: list[dict[str, Any]], presets: list[Preset]):
        self.devices = devices
        self.presets = {p.name: p for p in presets}
        self.watchers: set[asyncio.Future[None]] = set()
        self.stopped: list[str] = []
        self.reports: list[dict[str, str]] = []   # ReportWaits, in order

    async def report_waits(self, waits: dict[str, str]) -> None:
        self.reports.append(dict(waits))

    async def evict(self, name: str, reason: str, why: str) -> str:
        assert reason in ("room", "cut") and why.startswith(("evicting ", name))
        self.stopped.append(name)
        self.presets[name].set_state("inactive")   # as EngineStateChanged would say
        self.wake()
        return "job"

    def wake(self) -> None:
        for w in self.watchers:
            if not w.done():
                w.set_result(None)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def preset(name: str, need: int, state: str = "inactive", **kw: Any) -> Preset:
    p = Preset(name, on_demand=True, memory={"needs": {"host": need},
                                             "sources": {"host": "estimate"}}, **kw)
    p.set_state(state)
    return p


HOST = [{"device": "host", "total": 100 * MiB, "free": 100 * MiB, "reserve": 0, "others": 0}]


def placer(presets: FakePresets, clock: Clock, **settings: Any) -> Placer:
    return Placer(presets, PlacementConfig(**settings), SlotCache(lambda: None),  # type: ignore[arg-type]
                  clock=clock)


def test_the_daemons_shapes_are_read_and_damage_left_out() -> None:
    assert devices_of([{"device": "GPU0", "total": 8, "reserve": 1, "others": "x"},
                       {"device": 3, "total": 8}, {"total": -1}]) == \
        devices_of([{"device": "GPU0", "total": 8, "reserve": 1, "others": 0}])
    p = preset("a", 5)
    p.memory = {"needs": {"GPU0": 7, "host": "junk"}, "gpu_count": 2, "per_gpu": 3}
    need = need_of(p)
    assert need is not None and need.fixed == {"GPU0": 7} and (need.count, need.per_gpu) == (2, 3)
    p.memory = {}
    assert need_of(p) is None


async def test_room_now_admits_at_once_and_the_start_holds_its_need() -> None:
    clock = Clock()
    ps = FakePresets(HOST, [preset("a", 60 * MiB), preset("b", 60 * MiB)])
    pl = placer(ps, clock)
    async with pl.admitted(ps.presets["a"]):
        assert pl.granted == {"a": clock.now}
        # b asks before a's engine was even seen loading: the granted start holds 60 MiB
        task = asyncio.create_task(enter(pl, ps.presets["b"]))
        await asyncio.sleep(0.05)
        assert not task.done() and "b" not in pl.granted
        assert "waits, because a is" in pl.why["b"] or "even evicting" in pl.why["b"]
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert not pl.waiting   # a client gone leaves the queue


async def test_a_need_on_a_gpu_whose_room_is_unknown_starts_at_once() -> None:
    """Issue 44, item 10: the daemon could not read the GPUs (room_unknown in Memory):
    the need on GPU1 is placed by nothing; a start waited, or was refused as needing a
    GPU "which this host does not have"."""
    clock = Clock()
    p = preset("pinned", 10 * MiB)
    p.memory = {"needs": {"GPU1": 4 * MiB, "host": 10 * MiB},
                "room_unknown": {"GPU1": "the NVIDIA driver did not answer"}}
    ps = FakePresets(HOST, [p])
    pl = placer(ps, clock)
    await asyncio.wait_for(enter(pl, p), 5)
    assert pl.granted == {"pinned": clock.now} and not pl.why
    need = need_of(p)
    assert need is not None and need.fixed == {"host": 10 * MiB}


async def enter(pl: Placer, p: Preset) -> None:
    async with pl.admitted(p):
        pass


async def test_an_idle_engine_is_evicted_once_the_wait_paid_for_it() -> None:
    clock = Clock()
    a = preset("a", 60 * MiB, "ready", load_seconds=0.5)
    ps = FakePresets(HOST, [a, preset("b", 60 * MiB)])
    pl = placer(ps, clock)
    a.ready_at = clock.now - 100
    # its last request ended a second ago: its clients may come back, and evicting it
    # costs a reload; an engine idle for long would cost nothing and go at once
    pl.idle_since["a"] = pl.last_used["a"] = clock.now - 1
    task = asyncio.create_task(enter(pl, ps.presets["b"]))
    await asyncio.sleep(0.05)
    assert ps.stopped == [] and not task.done()   # the rent is not paid yet
    assert "a is worth keeping" in pl.why["b"]
    clock.now += 60   # its requests waited long enough
    ps.wake()
    await asyncio.wait_for(task, 5)
    assert ps.stopped == ["a"] and pl.evictions == {("a", "room"): 1}
    assert "b" in pl.granted


async def test_a_kept_engine_is_never_evicted_and_the_wait_ends_with_the_figures() -> None:
    clock = Clock()
    a = preset("a", 60 * MiB, "ready", keep=True)
    ps = FakePresets(HOST, [a, preset("b", 60 * MiB)])
    pl = placer(ps, clock, max_wait=1.0)
    with pytest.raises(GatewayError) as e:
        await enter(pl, ps.presets["b"])
    assert e.value.status == 503 and e.value.code == "model_waits_for_memory"
    assert "needs 60 MiB on host" in e.value.message
    assert "a is kept (serve.keep, or not on demand" in e.value.message
    assert e.value.message.endswith("waited 1 s ([placement] max_wait)")
    assert ps.stopped == [] and not pl.waiting
    # the daemon was told why b waited (lokictl top), then that nothing waits
    await asyncio.sleep(0.05)
    assert ps.reports[0].keys() == {"b"}
    assert ps.reports[0]["b"].startswith("1 request waiting 0 s: preset 'b' needs 60 MiB")
    assert "a is kept" in ps.reports[0]["b"] and ps.reports[-1] == {}


async def test_a_busy_engine_is_closed_then_drained_never_cut_early() -> None:
    clock = Clock()
    a = preset("a", 60 * MiB, "ready", load_seconds=0.5, drain=120.0)
    ps = FakePresets(HOST, [a, preset("b", 60 * MiB)])
    pl = placer(ps, clock)
    a.ready_at = clock.now - 100
    busy = asyncio.Event()

    async def long_request() -> None:
        async with pl.admitted(a):
            await busy.wait()

    first = asyncio.create_task(long_request())
    await asyncio.sleep(0.01)
    waiter = asyncio.create_task(enter(pl, ps.presets["b"]))
    await asyncio.sleep(0.01)
    assert "b: waits, because a has 1 requests in flight" in pl.why["b"].replace(
        "preset 'b' needs 60 MiB on host", "b")
    clock.now += 35   # past the time after which the plan's engines are closed
    ps.wake()
    await asyncio.sleep(0.05)
    assert "a" in pl.closing and ps.stopped == []   # closed, not cut: it drains
    # a new request for the closed engine waits with the others, not sent to it
    again = asyncio.create_task(enter(pl, a))
    await asyncio.sleep(0.05)
    assert not again.done()
    busy.set()   # its request ends: it is idle, and evicted for b
    await asyncio.wait_for(first, 5)
    clock.now += 60
    ps.wake()
    await asyncio.wait_for(waiter, 5)
    assert ps.stopped == ["a"]
    again.cancel()


@pytest.mark.parametrize("processing", [False, True])
async def test_a_cut_by_the_daemons_count_alone_asks_the_engine_first(processing: bool) -> None:
    """The daemon's RequestsInFlight comes from the engine's log through the journal,
    late: the person's stream had ended whole, the gateway had nothing in flight, and the
    eviction after the drain was counted a cut "with 1 requests in flight" (CI, issue 46).
    The engine's /slots (a real HTTP server in its shape) is asked first: serving nothing,
    the eviction is for room; serving, it is the cut it was."""
    asked = []

    async def slots(_r: web.Request) -> web.Response:
        asked.append(1)
        return web.json_response([{"id": 0, "is_processing": processing}])

    app = web.Application()
    app.router.add_get("/slots", slots)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    clock = Clock()
    a = preset("a", 60 * MiB, "ready", load_seconds=0.5, drain=1.0)
    a.url, a.in_flight, a.in_flight_at = f"http://127.0.0.1:{port}", 1, 5.0
    a.ready_at = clock.now - 100
    ps = FakePresets(HOST, [a, preset("b", 60 * MiB)])
    async with aiohttp.ClientSession() as session:
        pl = Placer(ps, PlacementConfig(), SlotCache(lambda: session),  # type: ignore[arg-type]
                    clock=clock)
        try:
            waiter = asyncio.create_task(enter(pl, ps.presets["b"]))
            await asyncio.sleep(0.05)
            assert "a has 1 requests in flight" in pl.why["b"] and not asked
            clock.now += 35   # closed: it drains
            ps.wake()
            await asyncio.sleep(0.05)
            assert "a" in pl.closing and ps.stopped == [] and not asked
            clock.now += 2    # its drain is over
            ps.wake()
            await asyncio.wait_for(waiter, 5)
        finally:
            await runner.cleanup()
    assert ps.stopped == ["a"] and len(asked) == 1
    assert pl.evictions == {("a", "cut" if processing else "room"): 1}
    assert pl.figures.stale == ({} if processing else {"a": 5.0})


async def test_what_never_fits_is_refused_at_once() -> None:
    clock = Clock()
    ps = FakePresets(HOST, [preset("huge", 200 * MiB)])
    pl = placer(ps, clock)
    with pytest.raises(GatewayError) as e:
        await enter(pl, ps.presets["huge"])
    assert e.value.code == "model_does_not_fit"
    assert e.value.message == "preset 'huge' needs 200 MiB on host; it has 100 MiB"


async def test_without_room_or_need_known_nothing_waits() -> None:
    clock = Clock()
    ps = FakePresets([], [preset("a", 60 * MiB, "ready"), preset("b", 60 * MiB)])
    pl = placer(ps, clock)
    await asyncio.wait_for(enter(pl, ps.presets["b"]), 1)   # no Devices read yet
    ps.devices = HOST
    ps.presets["b"].memory = {}
    await asyncio.wait_for(enter(pl, ps.presets["b"]), 1)   # no need known
    off = placer(FakePresets(HOST, [preset("a", 60 * MiB, "ready"), preset("c", 60 * MiB)]),
                 clock, enabled=False)
    await asyncio.wait_for(enter(off, off.presets.presets["c"]), 1)  # type: ignore[attr-defined]
    assert not off.granted


async def test_an_engine_started_by_hand_is_never_evicted() -> None:
    """It is not on demand: stopped, it would not come back by itself."""
    clock = Clock()
    a = preset("a", 60 * MiB, "ready", load_seconds=0.5)
    a.on_demand = False
    a.ready_at = clock.now - 1000
    ps = FakePresets(HOST, [a, preset("b", 60 * MiB)])
    pl = placer(ps, clock, max_wait=1.0)
    with pytest.raises(GatewayError) as e:
        await enter(pl, ps.presets["b"])
    assert "a is kept (serve.keep, or not on demand" in e.value.message and ps.stopped == []


async def test_two_presets_that_each_need_the_device_arriving_together_do_not_thrash() -> None:
    """One starts, the other waits its turn; then each eviction is paid for by waiting,
    so a request arriving right after a swap does not swap back at once."""
    clock = Clock()
    a, b = preset("a", 80 * MiB, load_seconds=0.5), preset("b", 80 * MiB, load_seconds=0.5)
    ps = FakePresets(HOST, [a, b])
    pl = placer(ps, clock)
    first = asyncio.create_task(enter(pl, a))
    second = asyncio.create_task(enter(pl, b))
    await asyncio.wait_for(first, 1)
    await asyncio.sleep(0.05)
    assert "a" in pl.granted and not second.done() and "a is starting" in pl.why["b"]
    a.set_state("ready")          # its engine answers; its request was served
    a.ready_at = pl.idle_since["a"] = clock.now   # (set_state keeps the real clock's time)
    ps.wake()
    await asyncio.sleep(0.05)
    assert not second.done() and ps.stopped == []   # too young to evict, nothing paid yet
    clock.now += 30
    ps.wake()
    await asyncio.wait_for(second, 5)
    assert ps.stopped == ["a"] and "b" in pl.granted
    b.set_state("ready")
    b.ready_at = pl.idle_since["b"] = clock.now
    back = asyncio.create_task(enter(pl, a))   # a's client again, right after the swap
    await asyncio.sleep(0.05)
    assert not back.done() and ps.stopped == ["a"]
    assert "b is worth keeping" in pl.why["a"]
    back.cancel()
    with pytest.raises(asyncio.CancelledError):
        await back


async def test_a_request_for_an_engine_being_evicted_waits_and_never_restarts_it() -> None:
    """Seen under systemd: a request admitted to the evicted engine between the eviction
    and its stop reached its port, systemd's socket started it again at once, and the
    preset it was evicted for waited for a room that never came."""
    clock = Clock()
    a = preset("a", 60 * MiB, "ready", load_seconds=0.5)
    a.ready_at = clock.now - 1000
    ps = FakePresets(HOST, [a, preset("b", 60 * MiB)])
    stop = asyncio.Event()

    async def slow_evict(name: str, reason: str, why: str) -> str:
        ps.stopped.append(name)
        ps.presets[name].set_state("stopping")
        await stop.wait()
        ps.presets[name].set_state("inactive")
        ps.wake()
        return "job"

    ps.evict = slow_evict  # type: ignore[method-assign]
    pl = placer(ps, clock)
    b_task = asyncio.create_task(enter(pl, ps.presets["b"]))
    await asyncio.sleep(0.05)
    assert ps.stopped == ["a"] and not b_task.done()   # evicted; b waits for the stop
    a.set_state("ready")   # as if the stop had not reached it yet
    a.ready_at = clock.now - 1000
    clock.now += 1   # a's request comes after b's
    a_task = asyncio.create_task(enter(pl, a))
    await asyncio.sleep(0.05)
    assert not a_task.done()   # not sent to the engine being stopped
    stop.set()
    await asyncio.wait_for(b_task, 5)
    assert "b" in pl.granted and not a_task.done()   # a now waits for room like any start
    a_task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await a_task


GPUS = [{"device": f"GPU{i}", "total": 100 * MiB, "free": 100 * MiB, "reserve": 0,
         "others": 0} for i in range(2)] + HOST


def auto(name: str, per_gpu: int, state: str = "inactive", held: dict[str, int] | None = None
         ) -> Preset:
    """A gpus = "auto" preset as the daemon's Memory shows it: per_gpu on one GPU to be
    chosen; once its engine runs, ``held`` where its start put it."""
    memory: dict[str, Any] = {"needs": {"host": MiB}, "per_gpu": per_gpu, "gpu_count": 1,
                              "sources": {"host": "estimate"}}
    if held:
        memory["held"] = held
    p = Preset(name, on_demand=True, memory=memory)
    p.set_state(state)
    return p


async def test_gpus_chosen_at_start_are_held_where_the_start_put_them() -> None:
    """A running auto engine holds the GPU its start chose (the daemon's ``held``); a
    start granted and not yet seen holds the GPU the rule chose for it: a third preset
    of the same size then waits rather than start onto a full GPU."""
    clock = Clock()
    ps = FakePresets(GPUS, [auto("a", 70 * MiB, "ready", held={"GPU1": 70 * MiB,
                                                                 "host": MiB}),
                            auto("b", 70 * MiB), auto("c", 70 * MiB)])
    pl = placer(ps, clock)
    held = {r.preset: r.held for r in pl.residents(clock.now)}
    assert held == {"a": {"GPU1": 70 * MiB, "host": MiB}}
    async with pl.admitted(ps.presets["b"]):
        assert pl.granted_on == {"b": ("GPU0",)}   # GPU1 is a's
        assert {r.preset: r.held for r in pl.residents(clock.now)}["b"] == \
            {"host": MiB, "GPU0": 70 * MiB}
        task = asyncio.create_task(enter(pl, ps.presets["c"]))
        await asyncio.sleep(0.05)
        assert not task.done() and "c" not in pl.granted
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


def test_whether_a_start_fits_now_for_the_peers() -> None:
    """GET /v1/models says it (issue 30: a peer routes to the host that starts soonest)."""
    clock = Clock()
    a, b = preset("a", 60 * MiB, "ready"), preset("b", 60 * MiB)
    small = preset("small", 30 * MiB)
    ps = FakePresets(HOST, [a, b, small])
    pl = placer(ps, clock)
    assert pl.fits(a) is True                          # it runs
    assert pl.fits(b) is False and pl.fits(small) is True   # 40 MiB left beside a
    assert placer(ps, clock, enabled=False).fits(b) is None   # no placement: unknown
    b.memory = {}
    assert pl.fits(b) is None                          # its need unknown
