"""A preset's local replicas as the gateway uses them (issue 47, items 1 and 2): which
ready engine of the preset takes a request, and when one more is started or one stopped.

The engines come from the preset's ``Replicas`` property (:class:`.presets.Engine`,
followed by ``PropertiesChanged`` as every preset property is: no bus call per request).
Rules, each for the failure it prevents:

- **cache-affine among the ready engines**: a request goes where
  :meth:`lokid.core.serve.affinity.Affinity.choose` says (the engine known to hold the longest
  prefix of its prompt, within a bound on load), with the one table the peers' routing
  uses (:attr:`lokid.gateway.peers.Peers.affinity`): replica 1 is named as this host
  (``LOCAL``) there, replica k as ``":k"``, a name no peer can have (a peer's name is a
  section of the configuration, ``:`` never in it). Sent to the engine that served a
  conversation's last turn, its engine re-reads only the new message; round-robin made
  it re-read the whole history on another engine each turn;
- **the gateway's own count of its requests in flight per engine**, not the rows'
  ``in_flight``: the bound on load reads the requests sent a moment ago (the engine's
  log lags by a line: a burst went to one engine), and a row's count is what it was at
  the row's last change (the daemon announces ``Replicas`` when a state changes): read
  after a roll's drain, an engine looked busy for good, passed over and never stopped;
- **an engine started again holds nothing**: its ``ready_at`` changed since the gateway
  last routed to it, what the table said it holds is forgotten first (a conversation
  sent back there would find an empty cache, and the bound would count prefixes it no
  longer has). An engine that is not ready (stopping, restarting in a roll, failed, a
  replica killed), or drained before its restart in a roll (its row's ``draining``,
  :mod:`lokid.dbus.replicas`), takes no request: its requests go to the others;
- **an engine that did not take a request is passed over** (:meth:`LocalReplicas
  .unreached`): for :data:`DOWN_FOR` seconds or until the daemon says it is ready again,
  and the request goes to another ready engine. That is a connect refused (nothing of
  it reached the first), or a connection reset before any byte of an answer from an
  engine then found gone (:mod:`lokid.gateway.enginegone`; sent on once at most). A
  replica killed stays ready in the rows until the daemon has read its unit's end from
  systemd: the requests in that gap were answered 502;
- **the gate counts every ready engine's slots** (:meth:`lokid.gateway.admission
  .Admission.slots`): requests wait at the
  preset's gate only when all of them are busy, and the scaling rule reads that wait;
- **scaling** (:class:`Scaler`): :mod:`lokid.core.serve.scaling` once every :data:`LOOK`
  seconds for each preset that may run more than one engine, its step done through the
  daemon (``StartReplicaForLoad``, ``StopReplica``), one at a time; the daemon's refusal
  is logged and the hold-down applies as for a step done. A start the wait asks for and
  the rule refuses (no room, or no compute of its own: :func:`compute_of`) is logged
  once per reason and :data:`SAY_AGAIN`: the operator who set ``max_replicas`` and sees
  one engine learns why. The replicas it stops are those it
  started, known from their rows' ``for_load`` too: a gateway started again had
  forgotten its own, and they ran until the preset stopped; one started by hand is
  never its to stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

from dbus_fast import DBusError
from dbus_fast.aio import MessageBus

from ..core.fleet.route import LOCAL
from ..core.launch.flags import flag_value
from ..core.names import BUS_NAME, MANAGER_INTERFACE, OBJECT_PATH
from ..core.place.policy import HOST, fits_now
from ..core.serve.affinity import Affinity, Replica
from ..core.serve.fairshare import FairShare
from ..core.serve.prefixes import Chain
from ..core.serve.scaling import NEVER, Compute, Engine, Load, decide, hold
from ..host.buscall import call
from ..host.cores import host_cores
from .groups import swap_cost
from .placer import devices_of, need_of
from .presets import Preset, Presets

log = logging.getLogger("lokid.gateway")

READY = "ready"
LOOK = 0.5   # s between two looks of the scaling rule
DOWN_FOR = 5.0   # s an engine whose connect failed takes no request (unless ready again)
SAY_AGAIN = 600.0   # s: a start refused for the same reason is logged again after this


def replica_name(index: int) -> str:
    """Replica ``index``'s name in the affinity table (1: this host's own preset)."""
    return LOCAL if index == 1 else f"{LOCAL}:{index}"


class LocalReplicas:
    """The gateway's view of every preset's engines: its requests in flight on each, since
    when each is idle, and which replicas its scaling rule started."""

    def __init__(self, affinity: Callable[[], Affinity]):
        self.affinity = affinity
        self.own: Counter[tuple[str, int]] = Counter()     # (preset, index) → in flight
        self.idle_since: dict[tuple[str, int], float] = {}
        self.routed_at: dict[tuple[str, int], float] = {}  # ready_at last routed to
        # engines whose connect failed: (preset, index) → (their ready_at then, until)
        self.down: dict[tuple[str, int], tuple[float, float]] = {}

    def several(self, preset: Preset | None) -> bool:
        """Whether ``preset`` has a ready engine besides its own."""
        return preset is not None and any(e.index > 1 and e.state == READY and e.url
                                          for e in preset.engines)

    def ready(self, preset: Preset) -> list[Any]:
        """Its engines that take a request: ready, not drained for a restart, and not
        found unreachable since they were last ready."""
        now = time.monotonic()
        return [e for e in preset.engines if e.state == READY and not e.draining
                and (e.url or e.index == 1) and not self._down(preset.name, e, now)]

    def _down(self, name: str, e: Any, now: float) -> bool:
        down = self.down.get((name, e.index))
        if down is None:
            return False
        if down[0] != e.ready_at or now >= down[1]:
            del self.down[(name, e.index)]   # ready again since, or its time is over
            return False
        return True

    def unreached(self, preset: Preset, index: int) -> bool:
        """Engine ``index`` of ``preset`` refused a connection: passed over for
        :data:`DOWN_FOR` seconds or until it is ready again. Whether another engine of
        the preset takes requests now."""
        e = next((e for e in preset.engines if e.index == index), None)
        if e is None or len(preset.engines) < 2:
            return False
        self.down[(preset.name, index)] = (e.ready_at, time.monotonic() + DOWN_FOR)
        log.warning("preset %s: engine %d did not take a connection: passed over for "
                    "%.0f s, its requests go to its other replicas", preset.name, index,
                    DOWN_FOR)
        return bool(self.ready(preset))

    @contextlib.contextmanager
    def pick(self, preset: Preset, url: str, chain: Chain | None, slots: int
             ) -> Iterator[tuple[int, str]]:
        """The index and URL of the engine that takes a request of ``chain`` (``url``:
        the preset's own), its prefixes recorded there and the request counted on it
        while the block runs."""
        name = preset.name
        ready = self.ready(preset) if len(preset.engines) > 1 else []
        affinity = self.affinity()
        index, to = 1, url
        if len(ready) > 1 or (ready and ready[0].index != 1):
            for e in ready:
                if self.routed_at.get((name, e.index), e.ready_at) != e.ready_at:
                    affinity.forget(replica_name(e.index), name)   # started again
                self.routed_at[(name, e.index)] = e.ready_at
            choice = affinity.choose(chain or Chain(name), [
                Replica(replica_name(e.index), self.own[(name, e.index)], slots)
                for e in ready])
            chosen = next((e for e in ready if replica_name(e.index) == choice.name), None)
            if chosen is not None:
                index, to = chosen.index, (url if chosen.index == 1 else chosen.url)
            if chain:
                affinity.record(chain, replica_name(index))
        key = (name, index)
        self.own[key] += 1
        try:
            yield index, to
        finally:
            self.own[key] -= 1
            if self.own[key] <= 0:
                del self.own[key]
                self.idle_since[key] = time.monotonic()

    def engines(self, preset: Preset, started: set[int]) -> list[Engine]:
        """The preset's engines as the scaling rule reads them."""
        out = []
        for e in preset.engines:
            busy = self.own[(preset.name, e.index)]
            idle = max(self.idle_since.get((preset.name, e.index), NEVER), e.ready_at)
            out.append(Engine(e.index, e.state, busy, NEVER if busy else idle,
                              e.index in started))
        return out


def told_too(entries: dict[str, dict[str, Any]], presets: Presets, affinity: Affinity,
             bound: int) -> None:
    """What a peer is told a preset holds (:func:`lokid.gateway.peers.told`: its own
    engine's prefixes, under this host's name) with those of its other ready engines:
    the peer routes a conversation held by replica 2 here, and :meth:`LocalReplicas.pick`
    sends it on to replica 2. ``bound``: the fingerprints told in all, at most."""
    left = bound - sum(len(e.get("lokid", {}).get("prefixes") or ()) for e in entries.values())
    for name, p in presets.presets.items():
        facts = entries.get(name, {}).get("lokid")
        if facts is None or "prefixes" not in facts or left <= 0:
            continue
        more = [f"{x:016x}" for e in p.engines if e.index > 1 and e.state == READY
                for x in affinity.held(name, replica_name(e.index), affinity.listed)]
        more = more[:max(0, min(left, affinity.listed - len(facts["prefixes"])))]
        facts["prefixes"] = [*facts["prefixes"], *more]
        left -= len(more)


def compute_of(p: Preset, rows: list[dict[str, Any]], cores: int) -> Compute:
    """Where an engine of ``p`` computes (:class:`lokid.core.serve.scaling.Compute`): on the
    GPUs its need names or the ``gpu_count`` chosen at its start (the daemon's
    ``Memory``); else, where the host has no GPU or the need is on the host alone, on
    its ``-t`` threads of the host's ``cores``. A GPU host's preset whose need is not
    known: not known."""
    gpus = [d.name for d in devices_of(rows) if d.name != HOST]
    need = p.need()
    if need is not None:
        fixed, _, count = need
        if count > 0:
            return Compute(gpus=count, host_gpus=len(gpus))
        named = tuple(sorted(d for d, n in fixed.items() if d != HOST and n > 0))
        if named:
            return Compute(fixed=named)
    elif gpus:
        return Compute()
    value = flag_value(list(p.engine_argv[1:]), "-t", "--threads")
    threads = int(value) if value is not None and value.isdigit() else 0
    return Compute(threads=threads, cores=cores)


class Scaler:
    """:mod:`lokid.core.serve.scaling` for every preset with ``max_replicas`` above 1."""

    def __init__(self, bus: MessageBus, presets: Presets, share: FairShare, placer: Any,
                 replicas: LocalReplicas, resize: Callable[[Preset], None]):
        self.bus, self.presets, self.share, self.resize = bus, presets, share, resize
        self.placer = placer
        self.replicas = replicas
        self.started: dict[str, set[int]] = {}       # preset → replicas this rule started
        self.changed_at: dict[str, float] = {}
        self.said: dict[str, tuple[str, float]] = {}   # preset → a refusal logged, when
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(LOOK)
            for p in list(self.presets.presets.values()):
                if p.max_replicas > 1 and p.engines:
                    self.resize(p)   # a replica ready or gone: the gate's slots follow
                if p.max_replicas > 1 and p.state == READY and p.engines:
                    try:
                        await self.step(p, time.monotonic())
                    except Exception as e:   # a defect of ours: requests go on
                        log.warning("replicas of %s: %s: %s", p.name, type(e).__name__, e)

    def load(self, p: Preset, now: float) -> Load:
        """What the rule reads of preset ``p`` now."""
        q = self.share.presets.get(p.name)
        since = [line[0].since for batch in (False, True)
                 for line in (q.waiting[batch].values() if q is not None else ()) if line]
        started = self.started.setdefault(p.name, set())
        # those a gateway's rule started, this one's or one before it (a restart forgot)
        started |= {e.index for e in p.engines if e.for_load and e.state == READY}
        if now - self.changed_at.get(p.name, NEVER) > hold(swap_cost(p)[0]):
            # one stopped by another hand (or failed) is no longer the rule's to stop; not
            # within the hold-down, when the daemon may not have reported its start yet
            started -= {e.index for e in p.engines if e.state in ("inactive", "failed")}
        return Load(self.replicas.engines(p, started), p.max_replicas,
                    waiting=len(since), waited=now - min(since) if since else 0.0,
                    load=swap_cost(p)[0], fits=self.fits(p),
                    compute=compute_of(p, self.presets.devices, host_cores()),
                    idle_stop=p.idle_stop,
                    changed_at=self.changed_at.get(p.name, NEVER), now=now)

    def fits(self, p: Preset) -> bool | None:
        """Whether one more engine of ``p`` fits without evicting (None: not known)."""
        devices = devices_of(self.presets.devices)
        need = need_of(p)
        if not getattr(self.placer.settings, "enabled", False) or not devices or need is None:
            return None
        return fits_now(need, devices, self.placer.residents(self.placer.clock()))

    async def step(self, p: Preset, now: float) -> None:
        """The rule once for ``p``, its step done."""
        s = decide(self.load(p, now))
        if not s.verb:
            said = self.said.get(p.name)
            if s.refused and (said is None or said[0] != s.refused or now - said[1] > SAY_AGAIN):
                log.info("preset %s: %s", p.name, s.why)
                self.said[p.name] = (s.refused, now)
            return
        self.changed_at[p.name] = now
        try:
            if s.verb == "start":
                (k,) = await call(self.bus, BUS_NAME, OBJECT_PATH, MANAGER_INTERFACE,
                                  "StartReplicaForLoad", "s", [p.name])
                self.started[p.name].add(int(k))
            else:
                await call(self.bus, BUS_NAME, OBJECT_PATH, MANAGER_INTERFACE,
                           "StopReplica", "su", [p.name, s.index])
                self.started[p.name].discard(s.index)
        except DBusError as e:
            log.info("preset %s: %s; lokid refused: %s", p.name, s.why, e.text)
            return
        log.info("preset %s: %s", p.name, s.why)
