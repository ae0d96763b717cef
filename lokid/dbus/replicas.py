"""The daemon's side of a preset's replicas (issue 47, :mod:`lokid.core.serve.replicas`):
starting a preset starts its ``replicas``, stopping it stops every one, and one more (or
one fewer) is started or stopped on request: the gateway's scaling rule and the
operator (``StartReplica``, ``StopReplica``).

Rules, each for the failure it prevents:

- A replica is started and stopped by the runner as any engine is, by its instance name
  (``NAME:k``): under systemd its own unit restarts it after a crash, and its plan, token
  and journal are its own. The daemon keeps no process of its own for it.
- Replicas are not presets on the bus: no object, no ``EngineStateChanged``, not in
  ``ActivePresets``. A client that knows presets only (an older gateway, lokictl, the
  Cockpit page) would take ``NAME:2`` for a preset it cannot find. Their changes are the
  preset object's ``Replicas`` property (``PropertiesChanged``), one row per replica.
- A stop of the preset stops every replica it has started, whatever ``max_replicas`` now
  says (an edit that lowered it must not leave engines running that no one can stop by
  name), and those a daemon before this one started (the runner is told to follow every
  index up to :data:`~lokid.core.config.presetname.MAX_REPLICAS` the preset allows).
- A restart (``RestartPreset``, after an edit) of a preset whose engine and replicas
  run is rolled: its own engine first, then each replica once the engine before it
  answers again; an engine that does not come back stops the roll. Restarted all at
  once, every engine of the preset reloaded its model together and every request in
  that time failed. Each engine **drains** before its restart (its row's ``draining``:
  the gateway sends it nothing new, and its requests in flight end, within
  ``serve.drain``; :data:`DRAIN_IN_CALL` for the preset's own): restarted at once, the
  streams it was serving were cut mid-answer (the gateway's test of a roll under a
  streaming client saw it on both engines). The requests in flight are its log's count,
  late and stale until its next line (the operator walk: a drain of 20 s waited whole
  for "1 requests in flight" after its request ended): while the count says some, the
  engine's ``/slots`` is asked (:mod:`lokid.dbus.enginebusy`); serving none, twice, it
  has drained; serving, or silent, the drain goes on as the count says.
- ``StartReplica`` starts the lowest index not running, only while the preset's own
  engine runs (replica 1 is what a request is routed to first, and what on-demand wakes)
  and below ``max_replicas``; ``StopReplica`` never stops replica 1 (that is the preset's
  stop, with its drain and idle rules): a scaling rule that asks for the wrong one gets
  an error, not an outage.
- ``StartReplicaForLoad`` is the gateway's scaling rule's start: its row says
  ``for_load`` until the replica stops. A gateway started again (an upgrade, a crash)
  reads it and takes those replicas back as its own to stop once idle; it had forgotten
  them, and they ran until the preset stopped. One started by hand (``StartReplica``,
  ``lokictl replica start``) is never the rule's to stop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from ..core.address import engine_url
from ..core.errors import InvalidArgsError, ReplicasBusyError, StalePlanError
from ..core.names import engine_unit
from ..core.serve.replicas import (
    SEPARATOR,
    instance,
    is_replica,
    preset_of,
    replica_port,
    split_instance,
)
from ..runners.runner import FAILED, INACTIVE, LIVE, READY, EngineState
from ..store.runtimedir import read_runtime_plan
from .enginebusy import serving

if TYPE_CHECKING:
    from ..runners.runner import Runner
    from .registry import Registry

log = logging.getLogger("lokid.daemon")
ROLL_WAIT = 3600.0   # s: the longest start lokid's units allow (MAX_START_TIMEOUT)
ROLL_POLL = 0.1      # s between two looks at a restarted engine's state
# A rolled engine drains first: the gateway, told it drains (its Replicas row), sends it
# nothing new within ROLL_SETTLE; its requests in flight (its log's) then end, ROLL_QUIET
# checking that none came meanwhile. Its own engine's drain runs inside RestartPreset's
# call: bounded below D-Bus's default reply timeout (25 s), the replicas' by serve.drain.
ROLL_SETTLE = 0.5
ROLL_QUIET = 0.3
ROLL_ASK = 1.0   # s between two questions to a draining engine whose log counts requests
DRAIN_IN_CALL = 20.0


class ReplicaHost(Protocol):
    """What the replicas need of the daemon."""

    runner: Runner | None
    registry: Registry
    runtime_dir: str           # each start's runtime plan: which start runs now
    exported: dict[str, Any]   # the preset objects (lokid.dbus.interfaces.PresetInterface)
    telemetry: Any             # its meters: each instance's requests in flight
    background: Any            # lokid.runners.background.Background: the rolling restart

    def engine_state(self, name: str) -> EngineState: ...


class Replicas:
    """Replicas 2 and up of every preset, by the runner's instance names."""

    def __init__(self, host: ReplicaHost):
        self.host = host
        # replicas asked to start whose runner has not reported them yet (systemd's
        # PropertiesChanged comes later): two StartReplica at once must not pick one index
        self.asked: set[str] = set()
        self.draining: set[str] = set()   # instances a roll drains before their restart
        self.for_load: set[str] = set()   # started by the gateway's scaling rule
        self.said: dict[str, tuple[str, str]] = {}   # the state and detail last logged

    def runner(self) -> Runner:
        assert self.host.runner is not None
        return self.host.runner

    def _in_flight(self, name: str) -> int:
        """Requests in flight on an instance's engine, from its log lines (0 before any)."""
        start = self.host.telemetry.meters.starts.get(name)
        return len(start.log.in_flight) if start is not None else 0

    def _announce(self, name: str) -> None:
        iface = self.host.exported.get(name)
        if iface is not None and name in self.host.registry.presets:
            iface.emit_properties_changed({"Replicas": iface.Replicas})

    # -- what the runner reports ----------------------------------------------------

    def apart(self, listener: Callable[[str, EngineState], None]
              ) -> Callable[[str, EngineState], None]:
        """The runner's listener: a replica's change to :meth:`on_state`, a preset's to
        ``listener`` (the daemon's)."""
        def heard(name: str, state: EngineState) -> None:
            if not self.on_state(name, state):
                listener(name, state)
        return heard

    def on_state(self, name: str, state: EngineState) -> bool:
        """Whether ``name`` is a replica's (its change is then announced as the preset's
        Replicas, and goes no further); False for a preset's own engine."""
        if not is_replica(name):
            return False
        self.asked.discard(name)
        if state.state in (INACTIVE, FAILED):
            self.for_load.discard(name)   # its next start says again who asked
        # once per state and detail: the runner reports a change of its status alone
        # too (under systemd, a unit's ActiveState and its StatusText come in two
        # signals; STATUS= every 2 s while it loads), and "replica m:2: ready" was
        # logged twice for each start
        said = (state.state, state.detail)
        if self.said.get(name) != said:
            self.said[name] = said
            log.info("replica %s: %s%s", name, state.state,
                     f" ({state.detail})" if state.detail else "")
        self._announce(preset_of(name))
        return True

    def tracked(self, presets: list[str]) -> list[str]:
        """``presets`` and every replica instance they allow, for the runner to follow (a
        daemon started again learns the replicas the last one started)."""
        out = list(presets)
        for name in presets:
            view = self.host.registry.presets.get(name)
            if view is None:   # gone since the list was made: nothing of it to follow
                continue
            bound = view.serve.max_replicas
            out += [instance(name, k) for k in range(2, bound + 1)]
        return out

    # -- verbs ----------------------------------------------------------------------

    def live(self, name: str) -> list[int]:
        """The indices 2 and up of the preset's replicas whose engines exist now."""
        runner = self.host.runner
        if runner is None:
            return []
        return sorted(k for k in self._known(name)
                      if runner.state(instance(name, k)).state in LIVE)

    def _known(self, name: str) -> set[int]:
        """Every replica index of the preset that the runner has a state for."""
        runner = self.host.runner
        return {int(key.rpartition(SEPARATOR)[2])
                for key in (runner.states if runner is not None else {})
                if is_replica(key) and preset_of(key) == name}

    async def begin(self, name: str, verb: str) -> str:
        """Start (``verb``: start or restart) the preset's engine, then its replicas 2 to
        ``replicas``; on a restart, those running beyond them are restarted as well, one at
        a time while the preset's engine is ready (:meth:`_roll`). The job of the preset's
        own engine (what a caller waits for: replica 1)."""
        runner = self.runner()
        rolling = verb == "restart" and bool(self.live(name)) \
            and runner.state(name).state == READY
        before = self._invocation(name)
        if rolling:
            await self._drained(name, min(self.host.registry.get(name).serve.drain,
                                          DRAIN_IN_CALL))
        try:
            job = await (runner.start if verb == "start" else runner.restart)(name)
        finally:
            self._undrained(name)
        if rolling:
            self.host.background.spawn(self._roll(name, before),
                                       f"restarting the replicas of preset {name}")
        else:
            await self.start_with(name, verb)
        return job

    def _invocation(self, name: str) -> str:
        """The invocation of the instance's last start, from its runtime plan ("": none)."""
        try:
            return read_runtime_plan(self.host.runtime_dir, name).invocation
        except StalePlanError:
            return ""

    async def _ready_again(self, name: str, before: str) -> bool:
        """Wait until the instance runs a start other than ``before`` and is ready (True);
        False when it failed or stopped instead, or after :data:`ROLL_WAIT`."""
        runner = self.runner()
        deadline = time.monotonic() + ROLL_WAIT
        while time.monotonic() < deadline:
            state = runner.state(name).state
            if state in (FAILED, INACTIVE) and self._invocation(name) != before:
                return False
            if state == READY and self._invocation(name) not in ("", before):
                return True
            await asyncio.sleep(ROLL_POLL)
        return False

    async def _roll(self, name: str, before: str) -> None:
        """The rest of a restart, one engine at a time (issue 47: an edit never takes every
        engine of a preset down at once): once the preset's own engine is ready again, each
        replica is restarted and waited for in turn; those that did not run are started.
        An engine that does not come back ends the roll, said in the journal: the engines
        not restarted yet keep serving the old configuration."""
        runner = self.runner()
        view = self.host.registry.get(name)
        wanted = sorted(set(range(2, view.serve.replicas + 1)) | set(self.live(name)))
        if not await self._ready_again(name, before):
            log.warning("preset %s: not ready again after its restart: its replicas are "
                        "left as they run", name)
            return
        for k in wanted:
            inst = instance(name, k)
            if runner.state(inst).state not in LIVE:
                await runner.start(inst)
                continue
            was = self._invocation(inst)
            await self._drained(inst, view.serve.drain)
            log.info("restarting replica %d of preset %s", k, name)
            try:
                await runner.restart(inst)
            finally:
                self._undrained(inst)
            if not await self._ready_again(inst, was):
                log.warning("replica %s: not ready again after its restart: the replicas "
                            "after it are left as they run", inst)
                return

    async def _drained(self, inst: str, drain: float) -> None:
        """Until the ready engine ``inst`` has no request in flight, the gateway told that
        it drains (its row), for ``drain`` seconds at most. The count is its log's, late
        and stale until the engine's next line (the operator walk: a whole drain waited
        for "1 requests in flight" after the request ended): while it counts some, the
        engine is asked (:func:`lokid.dbus.enginebusy.serving`, at most every
        :data:`ROLL_ASK`), and two answers :data:`ROLL_QUIET` apart that it serves nothing
        end the drain; one that it serves, or no answer, waits on as before."""
        self.draining.add(inst)
        self._announce(preset_of(inst) if is_replica(inst) else inst)
        runner = self.runner()
        began = time.monotonic()
        asked_at, said = float("-inf"), None   # the engine's last answer: None, no word
        await asyncio.sleep(ROLL_SETTLE)
        while runner.state(inst).state == READY and time.monotonic() - began < drain:
            if self._in_flight(inst) == 0:
                await asyncio.sleep(ROLL_QUIET)
                if self._in_flight(inst) == 0:
                    return
                continue
            url = self._url(inst)
            if url and time.monotonic() - asked_at >= ROLL_ASK:
                asked_at, said = time.monotonic(), await serving(url)
                if said is False:   # asked again: a request may have come meanwhile
                    await asyncio.sleep(ROLL_QUIET)
                    counted = self._in_flight(inst)
                    if counted and (said := await serving(url)) is False:
                        log.info("%s: drained: its log still counts %d requests in flight, "
                                 "its engine's /slots serves none (the count is stale)",
                                 inst, counted)
                        return
                    continue
            await asyncio.sleep(ROLL_POLL)
        if runner.state(inst).state == READY:
            word = "not asked (no port)" if asked_at < 0 else {
                None: "did not say (no answer, no /slots, or a key)", True: "serves"}.get(
                said, "serves none")
            log.warning("%s: its drain (%.0f s) passed with %d requests in flight (its "
                        "engine's /slots, last asked: %s): restarted", inst, drain,
                        self._in_flight(inst), word)

    def _url(self, inst: str) -> str:
        """The address of the instance's engine ("" when it listens on no port)."""
        split = split_instance(inst)
        view = self.host.registry.presets.get(preset_of(inst))
        if split is None or view is None or view.listen is None or not view.listen[1]:
            return ""
        host, port = view.listen
        return engine_url(host, replica_port(port, split[1]))

    def _undrained(self, inst: str) -> None:
        if inst in self.draining:
            self.draining.discard(inst)
            self._announce(preset_of(inst) if is_replica(inst) else inst)

    async def stop(self, name: str) -> str:
        """Stop the preset's engine and every replica of it; the job of its own."""
        job = await self.runner().stop(name)
        await self.stop_all(name)
        return job

    async def start_with(self, name: str, verb: str) -> None:
        """The preset was started (``verb``: start or restart): its replicas 2 to
        ``replicas`` too; on a restart, those running beyond them are restarted as well."""
        view = self.host.registry.get(name)
        runner = self.runner()
        wanted = set(range(2, view.serve.replicas + 1))
        if verb == "restart":
            wanted |= set(self.live(name))
        for k in sorted(wanted):
            if verb == "restart":
                await runner.restart(instance(name, k))
            else:
                await runner.start(instance(name, k))

    async def stop_all(self, name: str) -> list[str]:
        """Stop every replica of the preset that runs or failed; the jobs' ids."""
        runner = self.runner()
        jobs = []
        for k in sorted(self._known(name)):
            if runner.state(instance(name, k)).state != INACTIVE:
                jobs.append(await runner.stop(instance(name, k)))
        return jobs

    async def start_one(self, name: str, for_load: bool = False) -> int:
        """Start one more replica: the lowest index not running; the index.
        ReplicasBusyError while the preset's own engine does not run, or when
        ``max_replicas`` run already. ``for_load``: the gateway's scaling rule asks."""
        view = self.host.registry.get(name)
        own_state = self.host.engine_state(name).state
        if view.external is not None:
            raise view.failure()
        if own_state not in LIVE:
            raise ReplicasBusyError(f"preset {name} is {own_state}: start it first (its "
                                    "replica 1), then more replicas")
        live = set(self.live(name)) | {k for k in range(2, view.serve.max_replicas + 1)
                                        if instance(name, k) in self.asked}
        free = [k for k in range(2, view.serve.max_replicas + 1) if k not in live]
        if not free:
            raise ReplicasBusyError(
                f"preset {name} runs {1 + len(live)} replicas, its [serve] max_replicas is "
                f"{view.serve.max_replicas}: raise max_replicas to run more")
        k = free[0]
        log.info("starting replica %d of preset %s%s", k, name,
                 " for its load (the gateway's scaling)" if for_load else "")
        self.asked.add(instance(name, k))
        if for_load:
            self.for_load.add(instance(name, k))
        else:
            self.for_load.discard(instance(name, k))
        try:
            await self.runner().start(instance(name, k))
        except BaseException:
            self.asked.discard(instance(name, k))
            self.for_load.discard(instance(name, k))
            raise
        return k

    async def stop_one(self, name: str, index: int) -> str:
        """Stop replica ``index`` (2 and up) of the preset; the job's id."""
        self.host.registry.get(name)
        if index < 2:
            raise InvalidArgsError(f"replica {index}: replicas 2 and up are stopped this "
                                   f"way; replica 1 is the preset itself (StopPreset)")
        if index not in self._known(name) or \
                self.runner().state(instance(name, index)).state == INACTIVE:
            raise ReplicasBusyError(f"replica {index} of preset {name} does not run")
        log.info("stopping replica %d of preset %s", index, name)
        return await self.runner().stop(instance(name, index))

    # -- what the bus shows ---------------------------------------------------------

    def rows(self, name: str) -> list[dict[str, Any]]:
        """The preset's ``Replicas``: replica 1 (the preset's own engine) and every other
        one the runner knows, by index: its instance, unit, state, status, port, URL and
        requests in flight (from its log lines), and whether the gateway's scaling rule
        started it (``for_load``)."""
        view = self.host.registry.get(name)
        host, port = view.listen if view.listen is not None else ("", 0)
        runner = self.host.runner
        out = []
        for k in [1, *sorted(self._known(name))]:
            inst = instance(name, k)
            state = runner.state(inst) if runner is not None else EngineState()
            at = replica_port(port, k) if port else 0
            out.append({"index": k, "instance": inst, "unit": engine_unit(inst),
                        "state": state.state, "status": state.status, "port": at,
                        "url": engine_url(host, at) if at else "",
                        "in_flight": self._in_flight(inst),
                        "draining": inst in self.draining,
                        "for_load": inst in self.for_load})
        return out
