"""The daemon's presets as the gateway sees them, kept current by the daemon's signals.

The gateway asks the daemon once (``Presets``, ``BrokenPresets``, each preset's
properties) and then follows ``EngineStateChanged``, ``JobFinished`` and
``PropertiesChanged``: a request never costs a bus round trip to learn where its
engine is. ``Presets`` changing (every reload emits it) reads them all again; the
daemon leaving or coming back on the bus (``NameOwnerChanged``) likewise.

Faults: the daemon absent or failing a read leaves :attr:`Presets.unreachable` set to
the reason, which the routes answer with (503); the last known presets stay, so
an engine that runs keeps being reached while ``lokid.service`` restarts. Each change
of the daemon's owner on the bus counts in :attr:`Presets.generation` and wakes every
waiter: a start asked of a daemon that went away is no start that failed
(:mod:`lokid.gateway.ondemand`).

What a GPU group's swap rule reads (:mod:`lokid.gateway.groups`) is kept here too: when
a preset became ready and when its ``RequestsInFlight`` last moved (the gateway's
monotonic clock), and its last cold start's wait and last load from its ``Stats``; and
the UNIX socket its engine listens on, where the gateway connects
(:mod:`lokid.gateway.sockets`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from typing import Any

from dbus_fast import DBusError, Message, MessageType
from dbus_fast.aio import MessageBus
from yarl import URL

from ..core.names import (
    BUS_NAME,
    MANAGER_INTERFACE,
    OBJECT_PATH,
    PRESET_INTERFACE,
    preset_of_object_path,
)
from ..host.buscall import call, plain

log = logging.getLogger("lokid.gateway")

PROPERTIES = "org.freedesktop.DBus.Properties"
DBUS = "org.freedesktop.DBus"
MATCHES = (
    f"type='signal',sender='{BUS_NAME}',interface='{MANAGER_INTERFACE}'",
    f"type='signal',sender='{BUS_NAME}',interface='{PROPERTIES}',"
    f"path_namespace='{OBJECT_PATH}'",
    f"type='signal',sender='{DBUS}',member='NameOwnerChanged',arg0='{BUS_NAME}'",
)
JOBS_KEPT = 256   # job results remembered for a waiting start (a bound: signals from outside)
NEVER = float("-inf")   # a time before the gateway knew


@dataclass(frozen=True)
class Engine:
    """One engine of a preset as its ``Replicas`` property lists it (issue 47): replica
    ``index`` (1: the preset's own), its state, URL, requests in flight (from its log),
    and since when it is ready (monotonic; a new start is a new time: its cache is new)."""

    index: int
    state: str
    url: str
    in_flight: int = 0
    ready_at: float = NEVER
    draining: bool = False   # a roll drains it before its restart: no new request
    for_load: bool = False   # started by a gateway's scaling rule (StartReplicaForLoad)


def engines_of(rows: list[Any], before: tuple[Engine, ...]) -> tuple[Engine, ...]:
    """The rows of a ``Replicas`` property, each ready one's ``ready_at`` kept from
    ``before`` while it stays ready (the daemon's rows are sent whole at each change)."""
    known = {e.index: e for e in before}
    out = []
    for row in rows:
        if not isinstance(row, dict) or not isinstance(row.get("index"), int):
            continue
        index, state = int(row["index"]), str(row.get("state", ""))
        old = known.get(index)
        ready_at = (old.ready_at if old is not None and old.state == "ready"
                    else time.monotonic()) if state == "ready" else NEVER
        in_flight = row.get("in_flight")
        out.append(Engine(index, state, str(row.get("url", "")),
                          in_flight if isinstance(in_flight, int) else 0, ready_at,
                          row.get("draining") is True, row.get("for_load") is True))
    return tuple(out)


@dataclass
class Preset:
    name: str
    state: str = "inactive"
    status: str = ""
    url: str = ""
    socket: str = ""           # Stats socket: the UNIX socket its engine listens on, or ""
    on_demand: bool = False
    group: str = ""            # serve.group ("" for none)
    drain: float = 120.0       # serve.drain, seconds
    in_flight: int = 0         # RequestsInFlight: the engine's requests, from its log
    kind: str = "engine"       # Kind: "external" for an API elsewhere (no engine here)
    upstream: str = ""         # Url: an external preset's base URL, /v1 included
    upstream_model: str = ""   # UpstreamModel: the model asked for there
    key_file: str = ""         # KeyFile: where its key is (a path; lokid.gateway.upstream)
    reachable: str = ""        # Reachable: whether the daemon saw its API answer
    ready_at: float = NEVER        # when its state became ready (monotonic)
    in_flight_at: float = NEVER    # when RequestsInFlight last moved (monotonic)
    cold_start_wait: float | None = None   # Stats cold_start_last_wait_seconds
    load_seconds: float | None = None      # Stats load_seconds (its engine's last load)
    keep: bool = False         # serve.keep: never evicted to make room (Keep)
    unloading: bool = False    # Unloading: an unload is under way (no new request to it)
    # Memory: what a start needs per device (needs, sources, per_gpu, gpu_count), {} unknown
    memory: dict[str, Any] = field(default_factory=dict)
    # Argv and RunningArgv: the next start's command line and the running engine's (its
    # context bounds a request's body, lokid.gateway.prompts)
    argv: tuple[str, ...] = ()
    running_argv: tuple[str, ...] = ()
    # futures of requests waiting for this preset's next change
    waiters: set[asyncio.Future[None]] = field(default_factory=set)
    moves: int = 0             # its state changes seen (a grant of the placement ends at one)
    # Aliases, Capabilities, ContextLength: the other names it is routed by, what it can do
    # and its context, as /v1/models shows them (issue 46, item 5)
    aliases: tuple[str, ...] = ()
    capabilities: tuple[str, ...] = ()
    context_length: int = 0
    # Replicas and MaxReplicas: each engine of the preset, replica 1 its own (issue 47,
    # lokid.gateway.replicas routes among the ready ones); IdleStop (0: none)
    engines: tuple[Engine, ...] = ()
    max_replicas: int = 1
    idle_stop: float = 0.0

    def set_state(self, state: str) -> None:
        if state == "ready" and self.state != "ready":
            self.ready_at = time.monotonic()
        if state != self.state:
            self.moves += 1
        self.state = state
        if self.engines and self.engines[0].index == 1 and self.engines[0].state != state:
            # replica 1 is its own engine: the daemon announces Replicas again for a
            # replica's change only, and row 1 stayed as it was then
            self.engines = (replace(self.engines[0], state=state, ready_at=self.ready_at
                                    if state == "ready" else NEVER), *self.engines[1:])

    def need(self) -> tuple[dict[str, int], int, int] | None:
        """Its need as the daemon announces it in ``Memory``: bytes on each device, and
        bytes per GPU and how many GPUs when they are chosen at start (0, 0 otherwise);
        None when unknown."""
        needs = self.memory.get("needs")
        if not isinstance(needs, dict) or not needs:
            return None
        fixed = {str(d): int(n) for d, n in needs.items() if isinstance(n, int) and n >= 0}
        per_gpu, count = self.memory.get("per_gpu", 0), self.memory.get("gpu_count", 0)
        return (fixed, per_gpu if isinstance(per_gpu, int) else 0,
                count if isinstance(count, int) else 0)

    @property
    def engine_argv(self) -> tuple[str, ...]:
        """The command line of the engine a request would reach: the running one's, else
        the next start's."""
        return self.running_argv or self.argv

    @property
    def shown_state(self) -> str:
        """Its state for routing and listings: a ready engine being unloaded takes no new
        request, so it shows as stopping."""
        return "stopping" if self.unloading and self.state == "ready" else self.state

    def update(self, props: dict[str, Any]) -> None:
        if "State" in props:
            self.set_state(str(props["State"]))
        if "Status" in props:
            self.status = str(props["Status"])
        if "OnDemand" in props:
            self.on_demand = bool(props["OnDemand"])
        if "Group" in props:
            self.group = str(props["Group"])
        if "Drain" in props:
            self.drain = float(props["Drain"])
        if "Keep" in props:
            self.keep = bool(props["Keep"])
        if "Unloading" in props:
            self.unloading = bool(props["Unloading"])
        for prop, attr in (("Argv", "argv"), ("RunningArgv", "running_argv"),
                           ("Aliases", "aliases"), ("Capabilities", "capabilities")):
            if isinstance(props.get(prop), list):
                setattr(self, attr, tuple(str(a) for a in props[prop]))
        if isinstance(props.get("Replicas"), list):
            self.engines = engines_of(props["Replicas"], self.engines)
        if isinstance(props.get("MaxReplicas"), int):
            self.max_replicas = int(props["MaxReplicas"])
        if isinstance(props.get("IdleStop"), (int, float)):
            self.idle_stop = float(props["IdleStop"])
        if isinstance(props.get("ContextLength"), int):
            self.context_length = int(props["ContextLength"])
        if isinstance(props.get("Memory"), dict):
            self.memory = dict(props["Memory"])
        if "RequestsInFlight" in props:
            if int(props["RequestsInFlight"]) != self.in_flight:
                self.in_flight_at = time.monotonic()
            self.in_flight = int(props["RequestsInFlight"])
        for prop, attr in (("Kind", "kind"), ("Url", "upstream"),
                           ("UpstreamModel", "upstream_model"), ("KeyFile", "key_file"),
                           ("Reachable", "reachable")):
            if prop in props:
                setattr(self, attr, str(props[prop]))
        stats = props.get("Stats")
        if isinstance(stats, dict) and stats.get("url"):
            self.url = str(stats["url"])
        if isinstance(stats, dict):
            self.socket = str(stats.get("socket") or "")
            for key, attr in (("cold_start_last_wait_seconds", "cold_start_wait"),
                              ("load_seconds", "load_seconds")):
                value = stats.get(key)
                if isinstance(value, (int, float)) and not isinstance(value, bool) \
                        and value >= 0:
                    setattr(self, attr, float(value))


class Presets:
    """The daemon's presets, by name, and the results of the start jobs seen."""

    def __init__(self, bus: MessageBus):
        self.bus = bus
        self.presets: dict[str, Preset] = {}
        self.broken: dict[str, str] = {}
        self.by_alias: dict[str, str] = {}   # alias → its preset (the daemon's Aliases)
        self.unreachable = "the gateway has not read lokid's presets yet"
        self.jobs: OrderedDict[str, str] = OrderedDict()   # job id → result
        self.job_details: OrderedDict[str, str] = OrderedDict()   # job id → its detail
        self.generation = 0   # the daemon's changes of owner on the bus (it left, it came)
        # the manager's Devices (each device's room, lokid.dbus.room), [] before a reading
        self.devices: list[dict[str, Any]] = []
        self.devices_seen = 0   # Devices signals received (a reading older than one is stale)
        # futures woken by any change (a preset's, the devices'): the placer's wait
        self.watchers: set[asyncio.Future[None]] = set()
        self._reading: asyncio.Task[None] | None = None
        self._again = False

    def socket_at(self, host: str, port: int) -> str:
        """The UNIX socket of the engine whose URL is ``host``:``port``, "" for none
        (:mod:`lokid.gateway.sockets`)."""
        for p in self.presets.values():
            if p.socket and p.url and _address(p.url) == (host, port):
                return p.socket
        return ""

    async def attach(self) -> None:
        self.bus.add_message_handler(self._on_message)
        for rule in MATCHES:
            await call(self.bus, DBUS, "/org/freedesktop/DBus", DBUS, "AddMatch", "s", [rule])
        await self.read()

    async def read(self) -> None:
        """Every preset's properties, asked again (a reload, the daemon back)."""
        devices_seen = self.devices_seen
        try:
            (props,) = await call(self.bus, BUS_NAME, OBJECT_PATH, PROPERTIES, "GetAll", "s",
                                  [MANAGER_INTERFACE])
            manager = plain(props)
            found: dict[str, Preset] = {}
            for path in manager.get("Presets", []):
                name = preset_of_object_path(str(path))
                if name is None:
                    continue
                (one,) = await call(self.bus, BUS_NAME, str(path), PROPERTIES, "GetAll", "s",
                                    [PRESET_INTERFACE])
                preset = self.presets.get(name)
                fresh = preset is None
                preset = preset or Preset(name)
                preset.update(plain(one))
                if fresh:
                    preset.ready_at = NEVER   # ready, if it is, since before the gateway
                found[name] = preset
        except DBusError as e:
            self.unreachable = f"lokid is not reachable on the bus: {e.text}"
            log.warning("%s", self.unreachable)
            return
        for name in set(self.presets) - set(found):
            self._wake(self.presets[name])
        self.presets = found
        self._index()
        self.broken = {str(k): str(v) for k, v in manager.get("BrokenPresets", {}).items()}
        if self.devices_seen == devices_seen:   # else a signal newer than this reading came
            self._devices(manager.get("Devices"))
        self.unreachable = ""
        for preset in found.values():
            self._wake(preset)
        log.info("presets known: %s", ", ".join(sorted(found)) or "none")

    def _read_soon(self) -> None:
        """One reading at a time; a change meanwhile makes one more."""
        if self._reading is not None and not self._reading.done():
            self._again = True
            return

        async def again() -> None:
            while True:
                self._again = False
                await self.read()
                if not self._again:
                    return

        self._reading = asyncio.get_running_loop().create_task(again())

    def _on_message(self, msg: Message) -> None:
        if msg.message_type != MessageType.SIGNAL:
            return
        body = msg.body
        if msg.member == "NameOwnerChanged" and msg.interface == DBUS:
            if body and body[0] == BUS_NAME:
                self.generation += 1
                if body[2]:
                    self._read_soon()
                else:
                    self.unreachable = "lokid left the bus (lokid.service is not running)"
                    for known in self.presets.values():
                        self._wake(known)
            return
        if msg.interface == MANAGER_INTERFACE and msg.member == "EngineStateChanged":
            preset = self.presets.get(str(body[0]))
            if preset is not None:
                preset.set_state(str(body[1]))
                self._wake(preset)
        elif msg.interface == MANAGER_INTERFACE and msg.member == "JobFinished":
            self.jobs[str(body[1])] = str(body[3])
            self.job_details[str(body[1])] = str(body[5])[:2000]
            while len(self.jobs) > JOBS_KEPT:
                self.jobs.popitem(last=False)
            while len(self.job_details) > JOBS_KEPT:
                self.job_details.popitem(last=False)
            preset = self.presets.get(str(body[0]))
            if preset is not None:
                self._wake(preset)
        elif msg.interface == PROPERTIES and msg.member == "PropertiesChanged":
            changed = plain(body[1])
            if msg.path == OBJECT_PATH:
                if "Presets" in changed or "BrokenPresets" in changed:
                    self._read_soon()
                if "Devices" in changed:
                    self.devices_seen += 1
                    self._devices(changed["Devices"])
                    self._wake_watchers()
                return
            name = preset_of_object_path(msg.path or "")
            preset = self.presets.get(name) if name is not None else None
            if preset is not None:
                preset.update(changed)
                if "Aliases" in changed:
                    self._index()
                self._wake(preset)

    def _index(self) -> None:
        """Which preset each alias routes to. The daemon gives each alias to one preset
        (lokid.core.config.aliases); should two say so between two of its signals, the first by
        name keeps it, as the daemon decides, and a preset's name is never an alias."""
        index: dict[str, str] = {}
        for name in sorted(self.presets):
            for alias in self.presets[name].aliases:
                if alias not in self.presets:
                    index.setdefault(alias, name)
        self.by_alias = index

    def resolve(self, model: str) -> str:
        """The preset a client's ``model`` names: a preset's name as is, an alias as its
        preset's name; anything else as is (the refusal names it)."""
        if model in self.presets:
            return model
        return self.by_alias.get(model, model)

    def _devices(self, rows: Any) -> None:
        if isinstance(rows, list):
            self.devices = [dict(r) for r in rows if isinstance(r, dict)]

    def _wake(self, preset: Preset) -> None:
        for waiter in preset.waiters:
            if not waiter.done():
                waiter.set_result(None)
        preset.waiters.clear()
        self._wake_watchers()

    def _wake_watchers(self) -> None:
        for waiter in self.watchers:
            if not waiter.done():
                waiter.set_result(None)
        self.watchers.clear()

    async def changed(self, preset: Preset, timeout: float) -> None:
        """Until the preset's state, status or jobs change, or ``timeout`` passes."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        preset.waiters.add(waiter)
        try:
            await asyncio.wait_for(waiter, timeout)
        except TimeoutError:
            pass
        finally:
            preset.waiters.discard(waiter)

    async def start(self, name: str) -> str:
        """StartPreset, as ``lokictl start``: the job's id (DBusError on a refusal)."""
        (job,) = await call(self.bus, BUS_NAME, OBJECT_PATH, MANAGER_INTERFACE, "StartPreset",
                            "s", [name])
        return str(job)

    async def evict(self, name: str, reason: str, why: str) -> str:
        """EvictPreset: the stop of an engine the placement makes room with (the daemon
        logs why and counts it): the job's id."""
        (job,) = await call(self.bus, BUS_NAME, OBJECT_PATH, MANAGER_INTERFACE, "EvictPreset",
                            "sss", [name, reason, why[:2000]])
        return str(job)

    async def report_waits(self, waits: dict[str, str]) -> None:
        """ReportWaits: why requests wait for memory, per preset ({}: none waits)."""
        await call(self.bus, BUS_NAME, OBJECT_PATH, MANAGER_INTERFACE, "ReportWaits",
                   "a{ss}", [{k: v[:2000] for k, v in waits.items()}])

    async def report_peers(self, peers: dict[str, str]) -> None:
        """ReportPeers: each peer gateway, "" when up, else why it is down."""
        await call(self.bus, BUS_NAME, OBJECT_PATH, MANAGER_INTERFACE, "ReportPeers",
                   "a{ss}", [{k: v[:2000] for k, v in peers.items()}])

    async def stop(self, name: str) -> str:
        """StopPreset, as ``lokictl stop`` (a swap in a GPU group): the job's id."""
        (job,) = await call(self.bus, BUS_NAME, OBJECT_PATH, MANAGER_INTERFACE, "StopPreset",
                            "s", [name])
        return str(job)


@functools.lru_cache(maxsize=256)   # a preset's URL, read at each new connection
def _address(url: str) -> tuple[str, int | None]:
    """An engine URL's host (brackets off, as aiohttp's request gives it) and port."""
    u = URL(url)
    return (u.host or "", u.port)
