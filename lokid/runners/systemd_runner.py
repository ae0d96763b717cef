"""The systemd runner: engines as ``loki-engine@<preset>.service``, through systemd's D-Bus API.

Verbs are ``org.freedesktop.systemd1.Manager`` calls (StartUnit, StopUnit,
RestartUnit with mode "replace"), never ``systemctl``. State comes from the
signals systemd sends once subscribed: ``PropertiesChanged`` of each unit
object (``ActiveState``/``SubState`` of ``…systemd1.Unit``, ``StatusText``
and ``Result`` of ``…systemd1.Service``), ``JobRemoved`` for the result of
the jobs we queued, and ``Reloading`` (after a ``daemon-reload``, the
daemon reads the presets again, as the generator just did). Nothing polls:
after the one ``GetAll`` that learns a unit's state when it is first tracked,
the signals keep it current.

Signals are accepted only from the current owner of ``org.freedesktop.systemd1``;
when that changes (``systemctl daemon-reexec``, a systemd upgrade), the runner
subscribes again and reads every tracked unit afresh.

The benchmark's thrash hint reads the unit's cgroup counters, ``IOReadBytes``
(the unit has ``IOAccounting=yes``) and ``MemoryCurrent``: the engine runs as
loki, and its ``/proc/<pid>/io`` would need CAP_SYS_PTRACE, which the daemon
does not have. A footprint's host figure is what the engine holds, from the cgroup's
``memory.stat`` (:meth:`SystemdRunner.held_memory`): ``MemoryCurrent`` counts the page
cache of the model file a GPU engine read once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from dbus_fast import DBusError, Message, MessageType
from dbus_fast.aio import MessageBus

from ..core.bench.iosample import IOSample, IOSampler
from ..core.errors import EngineError, PermissionDeniedError
from ..core.names import engine_unit, preset_of_unit
from ..host.buscall import call
from .background import Background
from .runner import EngineState, JobListener, Listener, Runner, unit_state

log = logging.getLogger("lokid.systemd")

SYSTEMD = "org.freedesktop.systemd1"
SYSTEMD_PATH = "/org/freedesktop/systemd1"
SYSTEMD_MANAGER = SYSTEMD + ".Manager"
UNIT_INTERFACE = SYSTEMD + ".Unit"
SERVICE_INTERFACE = SYSTEMD + ".Service"
PROPERTIES = "org.freedesktop.DBus.Properties"
DBUS = "org.freedesktop.DBus"

MATCHES = (
    f"type='signal',sender='{SYSTEMD}',interface='{PROPERTIES}',member='PropertiesChanged',"
    f"path_namespace='{SYSTEMD_PATH}/unit'",
    f"type='signal',sender='{SYSTEMD}',interface='{SYSTEMD_MANAGER}',member='JobRemoved'",
    f"type='signal',sender='{SYSTEMD}',interface='{SYSTEMD_MANAGER}',member='Reloading'",
    f"type='signal',sender='{DBUS}',interface='{DBUS}',member='NameOwnerChanged',"
    f"arg0='{SYSTEMD}'",
)
# What systemd reports for a cgroup counter it does not know: no controller for it (the io
# controller on a cgroup-v1 or hybrid host), or accounting off.
UNKNOWN = 2**64 - 1
DENIED = ("org.freedesktop.DBus.Error.AccessDenied",
          "org.freedesktop.DBus.Error.InteractiveAuthorizationRequired")


def systemd_reachable(bus_is_system: bool) -> bool:
    """Whether systemd is the system manager here (what sd_booted() checks)."""
    import os

    return bus_is_system and os.path.isdir("/run/systemd/system")


# The unit properties followed: the state, and NRestarts (systemd's automatic restarts
# since the last start by hand).
WANTED = ("ActiveState", "SubState", "Result", "StatusText", "NRestarts")


class SystemdRunner(Runner):
    kind = "systemd"

    def restarts(self, preset: str) -> int | None:
        value = self.props.get(preset, {}).get("NRestarts")
        return int(value) if isinstance(value, int) else None

    def __init__(self, bus: MessageBus, listener: Listener, on_job: JobListener | None = None,
                 on_reloaded: Callable[[], None] | None = None):
        super().__init__(listener, on_job)
        self.on_reloaded = on_reloaded   # after each daemon-reload (its Reloading(false))
        self.bus = bus
        self.owner = ""
        self.by_path: dict[str, str] = {}               # unit object path → preset
        self.props: dict[str, dict[str, Any]] = {}      # preset → the unit's properties
        self.jobs: dict[str, tuple[str, str]] = {}      # job path → (preset, verb)
        self.job_detail: dict[str, str] = {}            # preset → the last failed job's result
        # Jobs of engine units that ended before their StartUnit/StopUnit reply was
        # handled (the signal and the reply can be read in one go): job path → result.
        self.ended: dict[str, str] = {}
        # the units whose missing disk-read counter was said: a fact of the host, said
        # once per unit (it was at every READY, by the footprint's reading, and again
        # at every benchmark)
        self.no_thrash_said: set[str] = set()
        self.background = Background(log)

    async def _call(self, path: str, interface: str, member: str, signature: str = "",
                    body: list[Any] | None = None, destination: str = SYSTEMD) -> list[Any]:
        return await call(self.bus, destination, path, interface, member, signature, body or [])

    async def attach(self) -> None:
        for rule in MATCHES:
            await self._call("/org/freedesktop/DBus", DBUS, "AddMatch", "s", [rule], DBUS)
        self.bus.add_message_handler(self._on_message)
        (self.owner,) = await self._call("/org/freedesktop/DBus", DBUS, "GetNameOwner", "s",
                                         [SYSTEMD], DBUS)
        # Without Subscribe, systemd sends unit signals only while some client asks.
        await self._call(SYSTEMD_PATH, SYSTEMD_MANAGER, "Subscribe")

    async def _resubscribe(self) -> None:
        try:
            await self._call(SYSTEMD_PATH, SYSTEMD_MANAGER, "Subscribe")
            await self.track(sorted(set(self.by_path.values())))
        except DBusError as e:
            log.warning("systemd came back but cannot be followed: %s", e.text)

    async def close(self) -> None:
        self.bus.remove_message_handler(self._on_message)
        await self.background.close()
        try:
            await self._call(SYSTEMD_PATH, SYSTEMD_MANAGER, "Unsubscribe")
        except (DBusError, EOFError, OSError):
            pass

    async def track(self, presets: list[str]) -> None:
        wanted = set(presets)
        for path, preset in list(self.by_path.items()):
            if preset not in wanted:
                del self.by_path[path]
                self.props.pop(preset, None)
        for preset in presets:
            try:
                (path,) = await self._call(SYSTEMD_PATH, SYSTEMD_MANAGER, "LoadUnit", "s",
                                           [engine_unit(preset)])
            except DBusError as e:
                log.warning("cannot follow %s: %s", engine_unit(preset), e.text)
                continue
            self.by_path[str(path)] = preset
            await self._fetch(str(path), preset)

    async def _fetch(self, path: str, preset: str) -> None:
        props: dict[str, Any] = {}
        for interface in (UNIT_INTERFACE, SERVICE_INTERFACE):
            try:
                (values,) = await self._call(path, PROPERTIES, "GetAll", "s", [interface])
            except DBusError as e:
                log.warning("cannot read %s of %s: %s", interface, engine_unit(preset), e.text)
                continue
            props.update({k: v.value for k, v in values.items()
                          if k in WANTED})
        self.props[preset] = props
        self._publish(preset)

    def _publish(self, preset: str) -> None:
        p = self.props.get(preset, {})
        state, detail = unit_state(str(p.get("ActiveState", "inactive")),
                                   str(p.get("SubState", "")), str(p.get("Result", "")))
        if state in ("failed", "inactive") and self.job_detail.get(preset):
            detail = "; ".join(filter(None, (detail, self.job_detail[preset])))
        # systemd keeps a unit's StatusText until its next start: an inactive engine's is
        # the last thing its ended run said ("stopping"), no status of it now. A failed
        # one's stays: it is why it failed (a config error's message).
        status = "" if state == "inactive" else str(p.get("StatusText", ""))
        self._set(preset, EngineState(state, status, detail))

    def _on_message(self, msg: Message) -> bool:
        if msg.message_type != MessageType.SIGNAL:
            return False
        if msg.member == "NameOwnerChanged" and msg.sender == DBUS and msg.body[0] == SYSTEMD:
            self.owner = str(msg.body[2])
            if self.owner:
                self.background.spawn(self._resubscribe(), "following systemd again")
            return False
        if msg.sender != self.owner:
            return False
        if msg.member == "PropertiesChanged" and msg.path in self.by_path:
            preset = self.by_path[msg.path]
            _interface, changed, invalidated = msg.body
            values = {k: v.value for k, v in changed.items() if k in WANTED}
            if values:
                self.props.setdefault(preset, {}).update(values)
                self._publish(preset)
            if any(k in WANTED for k in invalidated):
                self.background.spawn(self._fetch(msg.path, preset),
                                      f"reading the state of {engine_unit(preset)}")
        elif msg.member == "Reloading" and msg.body == [False]:
            if self.on_reloaded is not None:
                self.on_reloaded()
        elif msg.member == "JobRemoved":
            _id, job, unit, result = msg.body
            found = self.jobs.pop(str(job), None)
            if found is not None:
                self._ended(found[0], str(job), found[1], str(result))
            elif preset_of_unit(str(unit)) is not None:
                self.ended[str(job)] = str(result)
                while len(self.ended) > 64:
                    del self.ended[next(iter(self.ended))]
        return False  # others may want the same signal

    def _ended(self, preset: str, job: str, verb: str, result: str) -> None:
        self.job_detail[preset] = "" if result == "done" else f"the {verb} job ended: {result}"
        self._publish(preset)
        self._job_done(preset, job, verb, result)

    async def _job(self, member: str, verb: str, preset: str) -> str:
        unit = engine_unit(preset)
        try:
            (job,) = await self._call(SYSTEMD_PATH, SYSTEMD_MANAGER, member, "ss",
                                      [unit, "replace"])
        except DBusError as e:
            if e.type in DENIED:
                raise PermissionDeniedError(
                    f"systemd refused to {verb} {unit}: {e.text} (lokid.service must run "
                    "as root, or polkit must allow it to manage loki-engine@ units)") from None
            raise EngineError(f"systemd could not {verb} {unit}: {e.text}") from None
        job = str(job)
        self.job_detail[preset] = ""
        result = self.ended.pop(job, None)
        if result is None:
            self.jobs[job] = (preset, verb)
        else:  # already over: told once the caller has its id
            import asyncio

            asyncio.get_running_loop().call_soon(self._ended, preset, job, verb, result)
        return job

    async def start(self, preset: str) -> str:
        return await self._job("StartUnit", "start", preset)

    async def stop(self, preset: str) -> str:
        return await self._job("StopUnit", "stop", preset)

    async def restart(self, preset: str) -> str:
        return await self._job("RestartUnit", "restart", preset)

    async def engine_pids(self, preset: str) -> list[int]:
        """The unit's processes, as systemd lists them (GetUnitProcesses: its cgroup)."""
        try:
            (procs,) = await self._call(SYSTEMD_PATH, SYSTEMD_MANAGER, "GetUnitProcesses", "s",
                                        [engine_unit(preset)])
        except DBusError:  # not loaded, or not running
            return []
        return [int(pid) for _, pid, _ in procs]

    async def io_sampler(self, preset: str) -> IOSampler | None:
        """The unit's cgroup counters: bytes read from block devices by its processes, and
        its memory (page cache included). None when systemd does not know the reads."""
        unit = engine_unit(preset)
        try:
            (path,) = await self._call(SYSTEMD_PATH, SYSTEMD_MANAGER, "GetUnit", "s", [unit])
        except DBusError as e:
            log.info("no thrash hint for %s: %s", unit, e.text)
            return None
        label = f"memory of {unit} (its cgroup, page cache included)"

        async def sample() -> IOSample | None:
            try:
                values = [(await self._call(str(path), PROPERTIES, "Get", "ss",
                                            [SERVICE_INTERFACE, name]))[0].value
                          for name in ("IOReadBytes", "MemoryCurrent")]
            except DBusError:
                return None
            read, memory = (int(v) for v in values)
            if read == UNKNOWN:
                return None
            return IOSample(read, None if memory == UNKNOWN else memory, label)

        if await sample() is None:
            if unit not in self.no_thrash_said:
                self.no_thrash_said.add(unit)
                log.info("no thrash hint for %s: systemd does not count its disk reads "
                         "(IOReadBytes unknown: no io controller, or IOAccounting off)", unit)
            return None
        return sample

    async def held_memory(self, preset: str) -> int | None:
        """What the unit's processes hold, from its cgroup's ``memory.stat``
        (:mod:`lokid.core.place.held`: ``MemoryCurrent`` without the page cache of files
        they read and do not map); None when the file or the unit cannot be read."""
        try:
            (path,) = await self._call(SYSTEMD_PATH, SYSTEMD_MANAGER, "GetUnit", "s",
                                       [engine_unit(preset)])
            (group,) = await self._call(str(path), PROPERTIES, "Get", "ss",
                                        [SERVICE_INTERFACE, "ControlGroup"])
        except DBusError:
            return None
        from ..core.place.held import held_bytes
        from ..host.cgroupmem import read_memory_stat

        text = await asyncio.to_thread(read_memory_stat, str(group.value))
        return held_bytes(text) if text is not None else None

    async def reload(self) -> None:
        """``daemon-reload``: systemd reruns lokid's generator, the drop-ins follow the presets."""
        try:
            await self._call(SYSTEMD_PATH, SYSTEMD_MANAGER, "Reload")
        except DBusError as e:
            raise EngineError(f"systemd could not reload its units: {e.text}") from None

