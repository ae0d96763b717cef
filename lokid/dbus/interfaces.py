"""The D-Bus API, ``org.lokid.Lokid1``: thin interfaces over the daemon's registry.

The manager (``/org/lokid/Lokid1``, ``org.lokid.Lokid1.Manager``) and one
object per preset (``/org/lokid/Lokid1/preset/<escaped name>``,
``org.lokid.Lokid1.Preset``). Signatures are dbus-fast's string annotations,
which every version accepts (Debian 12 ships 1.84; ``dbus_fast.annotations``
exists only from 4.0) — and so this module does not use postponed
annotations.

The interfaces hold no state of their own: they read the daemon's
snapshot (:class:`Backend`: the registry and the runner's engine states) and
hand the verbs to it. A verb returns as soon as the job is under way; the
engine's progress comes as ``EngineStateChanged`` and ``PropertiesChanged``.

Deny by default: every exported method declares who may call it
(:func:`lokid.dbus.access.access`: anyone, or a polkit action checked before it runs); a
test walks the interfaces and fails on a method that does not declare one. Preset names
are checked at the boundary (the preset file name rule) before anything else sees them.

Secrets: a preset's command line and environment may hold them. ``Plan()``
shows env values and secret flag values only to a caller with the edit right
(:meth:`Backend.reveals`), ``Argv`` and ``RunningArgv`` likewise through
:mod:`lokid.dbus.reveal`, which answers their property reads with the caller's
rights; signals always carry them masked.

No traceback crosses the bus (:func:`lokid.dbus.access.guarded`).
"""

import logging
from typing import Any

from dbus_fast import PropertyAccess, Variant
from dbus_fast.service import ServiceInterface, dbus_property, method, signal

from .. import __version__
from ..core.config.presetname import valid_preset_name
from ..core.errors import (
    DoesNotFitError,
    InvalidArgsError,
    printable,
)
from ..core.names import (
    MANAGER_INTERFACE,
    PRESET_INTERFACE,
    preset_object_path,
)
from ..planning.sizing import REMEDY

# the team's interfaces register in lokid.dbus.team.FACTORIES as they are imported, here
# (the daemon imports this module, and its own module has no room left)
from . import keys as _keys  # noqa: F401  (org.lokid.Lokid1.Keys)
from . import pulls as _pulls  # noqa: F401  (org.lokid.Lokid1.Pulls)
from . import usage as _usage  # noqa: F401  (org.lokid.Lokid1.Usage)
from .access import (  # noqa: F401  (ACCESS_ATTR, READ_LOGS: read by the tests here)
    ACCESS_ATTR,
    BENCH,
    EDIT,
    MANAGE,
    READ,
    READ_LOGS,
    Backend,
    access,
    checked_name,
    guarded,
    to_dbus_error,
)
from .reach import Reachability
from .registry import PresetView
from .variants import json_variant, plan_variant, shown_argv

log = logging.getLogger("lokid.dbus")
EVICTION_REASONS = ("room", "cut")   # EvictPreset: idle and evicted, or cut after its drain
MAX_WHY = 2000                       # characters of an eviction's reason, at most
MAX_WAITS = 1024                     # presets in one ReportWaits, at most


class PresetInterface(ServiceInterface):
    """One preset: its settings, its plan as the next start would run it, its engine's state."""

    def __init__(self, backend: Backend, name: str):
        super().__init__(PRESET_INTERFACE)
        self.backend = backend
        self.preset = name  # not .name: ServiceInterface keeps the interface's name there
        self.last: PresetView | None = None
        self.reach = Reachability(lambda text: self.emit_properties_changed({"Reachable": text}))

    @property
    def view(self) -> PresetView:
        """The preset as the registry has it; while a reload has just dropped it (broken
        or deleted: this object is unexported right after), as it was until then, so
        that a client reading it in that moment gets its properties, not an error."""
        view = self.backend.registry.presets.get(self.preset)
        if view is None:
            if self.last is not None:
                return self.last
            view = self.backend.registry.get(self.preset)  # raises: why there is none
        self.last = view
        return view

    @dbus_property(access=PropertyAccess.READ)
    def Name(self) -> "s":
        return self.preset

    @dbus_property(access=PropertyAccess.READ)
    def Model(self) -> "s":
        return self.view.model

    @dbus_property(access=PropertyAccess.READ)
    def State(self) -> "s":
        return self.backend.engine_state(self.preset).state

    @dbus_property(access=PropertyAccess.READ)
    def Status(self) -> "s":
        return self.backend.engine_state(self.preset).status

    @dbus_property(access=PropertyAccess.READ)
    def Unit(self) -> "s":
        return self.view.unit

    @dbus_property(access=PropertyAccess.READ)
    def SpecMode(self) -> "s":
        return self.view.spec_mode

    @dbus_property(access=PropertyAccess.READ)
    def SpecActive(self) -> "as":
        return self.backend.spec_active(self.preset)

    @dbus_property(access=PropertyAccess.READ)
    def Notes(self) -> "as":
        return self.view.notes

    @dbus_property(access=PropertyAccess.READ)
    def Argv(self) -> "as":
        return shown_argv(self.view.argv)

    @dbus_property(access=PropertyAccess.READ)
    def RunningArgv(self) -> "as":
        return shown_argv(self.backend.running_argv(self.preset))

    @dbus_property(access=PropertyAccess.READ)
    def AutoSpecBlocked(self) -> "s":
        return self.view.auto_blocked

    @method()
    @access(READ)
    @guarded
    async def Plan(self) -> "a{sv}":
        view = self.view
        if view.plan is None:
            raise view.failure()
        memory = self.backend.telemetry.room.memory(self.preset)
        return {**plan_variant(view.plan, await self.backend.reveals()),
                **({"memory": Variant("a{sv}", json_variant(memory))} if memory else {})}

    def serve_properties(self) -> dict[str, Any]:
        """The [serve] settings' properties, for PropertiesChanged after a reload."""
        serve = self.view.serve
        return {"OnDemand": serve.on_demand, "IdleStop": serve.idle_stop or 0.0,
                "Group": serve.group, "Drain": serve.drain, "Keep": serve.keep,
                "Kind": self.view.kind,
                "Url": self.Url, "UpstreamModel": self.UpstreamModel,
                "KeyFile": self.KeyFile, "Reachable": self.Reachable,
                "Memory": self.Memory, "Aliases": self.Aliases,
                "Capabilities": self.Capabilities, "ContextLength": self.ContextLength,
                "MaxReplicas": serve.max_replicas, "Replicas": self.Replicas}

    # its engines (issue 47, lokid.dbus.replicas): replica 1 is this preset's own, each
    # other one its own unit on its own port; StartReplica adds one up to MaxReplicas
    @dbus_property(access=PropertyAccess.READ)
    def Replicas(self) -> "aa{sv}":
        return [json_variant(row) for row in self.backend.replicas.rows(self.preset)]

    @dbus_property(access=PropertyAccess.READ)
    def MaxReplicas(self) -> "u":
        return self.view.serve.max_replicas

    # kind = "external" (lokid.core.config.external): where its API is, and whether it answers;
    # its key's file by path only (the gateway reads it; nothing of the key is here)
    @dbus_property(access=PropertyAccess.READ)
    def Kind(self) -> "s":
        return self.view.kind

    @dbus_property(access=PropertyAccess.READ)
    def Url(self) -> "s":
        ext = self.view.external
        return ext.url if ext else ""

    @dbus_property(access=PropertyAccess.READ)
    def UpstreamModel(self) -> "s":
        ext = self.view.external
        return ext.upstream_model if ext else ""

    @dbus_property(access=PropertyAccess.READ)
    def KeyFile(self) -> "s":
        return self.view.key_file

    @dbus_property(access=PropertyAccess.READ)
    def Reachable(self) -> "s":
        ext = self.view.external
        return self.reach.look(ext.url) if ext else ""

    # what clients ask for it by and what it can do (issue 46, item 5): aliases as routed
    # (lokid.core.config.aliases), capabilities and context from its plan
    # (lokid.core.model.modeltraits)
    @dbus_property(access=PropertyAccess.READ)
    def Aliases(self) -> "as":
        return list(self.view.aliases)

    @dbus_property(access=PropertyAccess.READ)
    def Capabilities(self) -> "as":
        return list(self.view.capabilities)

    @dbus_property(access=PropertyAccess.READ)
    def ContextLength(self) -> "u":
        return min(self.view.context_length, 2**32 - 1)

    @dbus_property(access=PropertyAccess.READ)
    def OnDemand(self) -> "b":
        return self.view.serve.on_demand

    @dbus_property(access=PropertyAccess.READ)
    def IdleStop(self) -> "d":
        return self.view.serve.idle_stop or 0.0

    @dbus_property(access=PropertyAccess.READ)
    def Group(self) -> "s":
        return self.view.serve.group

    @dbus_property(access=PropertyAccess.READ)
    def Drain(self) -> "d":
        return self.view.serve.drain

    @dbus_property(access=PropertyAccess.READ)
    def Keep(self) -> "b":
        """serve.keep: never stopped to make room for another preset."""
        return self.view.serve.keep

    @dbus_property(access=PropertyAccess.READ)
    def IdleStopAt(self) -> "d":
        return float(self.backend.telemetry.idle.stop_at(self.preset))

    @dbus_property(access=PropertyAccess.READ)
    def RequestsInFlight(self) -> "u":
        return int(self.backend.telemetry.idle.in_flight(self.preset))

    @dbus_property(access=PropertyAccess.READ)
    def Unloading(self) -> "b":
        return bool(self.backend.unloads.unloading(self.preset))

    @dbus_property(access=PropertyAccess.READ)
    def OnDemandState(self) -> "s":
        return str(self.backend.telemetry.sight.state(self.preset))

    @dbus_property(access=PropertyAccess.READ)
    def LastRequestAt(self) -> "d":
        return float(self.backend.telemetry.sight.last_request_at(self.preset))

    @dbus_property(access=PropertyAccess.READ)
    def GroupHolder(self) -> "s":
        return str(self.backend.telemetry.sight.holder(self.preset))

    @dbus_property(access=PropertyAccess.READ)
    def PendingRestart(self) -> "b":
        return self.backend.pending_restart(self.preset)

    @dbus_property(access=PropertyAccess.READ)
    def Memory(self) -> "a{sv}":
        return json_variant(self.backend.telemetry.room.memory(self.preset))

    @dbus_property(access=PropertyAccess.READ)
    def Stats(self) -> "a{sv}":
        return json_variant(self.backend.stats(self.preset))

    @dbus_property(access=PropertyAccess.READ)
    def LastBench(self) -> "a{sv}":
        return json_variant(self.view.bench or {})

    @method()
    @access(READ)
    @guarded
    def GetBench(self) -> "a{sv}":
        """Deprecated (the XML says so): LastBench as a call, kept for the first release's
        callers until the next API version."""
        return json_variant(self.view.bench or {})

    @method()
    @access(MANAGE)
    @guarded
    async def ClearFailures(self) -> "u":
        return await self.backend.clear_failures(self.preset)


class ManagerInterface(ServiceInterface):
    """The daemon: which presets exist and run, and the verbs on them."""

    def __init__(self, backend: Backend):
        super().__init__(MANAGER_INTERFACE)
        self.backend = backend

    @dbus_property(access=PropertyAccess.READ)
    def Version(self) -> "s":
        return __version__

    @dbus_property(access=PropertyAccess.READ)
    def Presets(self) -> "ao":
        return [preset_object_path(name) for name in sorted(self.backend.registry.presets)]

    @dbus_property(access=PropertyAccess.READ)
    def BrokenPresets(self) -> "a{ss}":
        return self.backend.registry.unstartable()

    @dbus_property(access=PropertyAccess.READ)
    def ActivePresets(self) -> "as":
        return self.backend.active_presets()

    @dbus_property(access=PropertyAccess.READ)
    def Runner(self) -> "s":
        return self.backend.runner_in_use()

    @dbus_property(access=PropertyAccess.READ)
    def Devices(self) -> "aa{sv}":
        return [json_variant(row) for row in self.backend.telemetry.room.devices()]

    @dbus_property(access=PropertyAccess.READ)
    def Waits(self) -> "a{ss}":
        return self.backend.telemetry.room.waits()

    @dbus_property(access=PropertyAccess.READ)
    def Peers(self) -> "a{ss}":
        return self.backend.telemetry.sight.peers()

    @method()
    @access(READ)
    @guarded
    def GetPreset(self, name: "s") -> "o":
        self.backend.registry.get(checked_name(name))
        return preset_object_path(name)

    @method()
    @access(MANAGE)
    @guarded
    async def StartPreset(self, name: "s") -> "s":
        return await self.backend.start(checked_name(name))

    @method()
    @access(MANAGE)
    @guarded
    async def StopPreset(self, name: "s") -> "s":
        return await self.backend.stop(checked_name(name))

    @method()
    @access(MANAGE)
    @guarded
    async def EvictPreset(self, name: "s", reason: "s", why: "s") -> "s":
        name = checked_name(name)
        if reason not in EVICTION_REASONS:
            raise InvalidArgsError(f"EvictPreset: reason {printable(reason[:40])!r} is not "
                                   f"one of {', '.join(EVICTION_REASONS)}")
        if len(why) > MAX_WHY:
            raise InvalidArgsError(f"EvictPreset: why is {len(why)} characters, at most "
                                   f"{MAX_WHY}")
        self.backend.registry.get(name)   # NotFound before anything is counted
        log.log(logging.WARNING if reason == "cut" else logging.INFO,
                "preset %s: evicted by the gateway's placement: %s", name, printable(why))
        self.backend.telemetry.sight.evicted(name, reason)
        return await self.backend.stop(name)

    @method()
    @access(MANAGE)
    @guarded
    async def ReportWaits(self, waits: "a{ss}") -> None:
        self.backend.telemetry.sight.check_reporter(await self.backend.caller(), "ReportWaits")
        if len(waits) > MAX_WAITS or any(len(w) > MAX_WHY for w in waits.values()):
            raise InvalidArgsError(f"ReportWaits: at most {MAX_WAITS} presets, each why at "
                                   f"most {MAX_WHY} characters")
        if self.backend.telemetry.room.report_waits(waits):
            self.emit_properties_changed({"Waits": self.backend.telemetry.room.waits()})

    @method()
    @access(MANAGE)
    @guarded
    async def ReportPeers(self, peers: "a{ss}") -> None:
        sight = self.backend.telemetry.sight
        sight.check_reporter(await self.backend.caller(), "ReportPeers")
        if sight.report_peers(peers):
            self.emit_properties_changed({"Peers": sight.peers()})

    @method()
    @access(MANAGE)
    @guarded
    async def StartForRequest(self, name: "s") -> "s":
        name = checked_name(name)
        # a start that could only fail out of memory is refused at once, with the figures
        why = await self.backend.telemetry.room.refusal(name)
        if why:
            raise DoesNotFitError(f"{why}: it is not started ({REMEDY})")
        return await self.backend.telemetry.sight.start_for_request(name, self.backend.start)

    @method()
    @access(MANAGE)
    @guarded
    async def UnloadPreset(self, name: "s") -> "s":
        return await self.backend.unloads.unload(checked_name(name))

    @method()
    @access(MANAGE)
    @guarded
    async def GatewayReport(self, requests: "a(squ)", swaps: "a(su)") -> None:
        self.backend.telemetry.sight.check_reporter(await self.backend.caller())
        self.backend.telemetry.sight.report(requests, swaps)

    @method()
    @access(MANAGE)
    @guarded
    async def RestartPreset(self, name: "s") -> "s":
        return await self.backend.restart(checked_name(name))

    @method()
    @access(MANAGE)
    @guarded
    async def StartReplica(self, name: "s") -> "u":
        return await self.backend.replicas.start_one(checked_name(name))

    @method()
    @access(MANAGE)
    @guarded
    async def StartReplicaForLoad(self, name: "s") -> "u":
        return await self.backend.replicas.start_one(checked_name(name), for_load=True)

    @method()
    @access(MANAGE)
    @guarded
    async def StopReplica(self, name: "s", index: "u") -> "s":
        return await self.backend.replicas.stop_one(checked_name(name), index)

    @method()
    @access(MANAGE)
    @guarded
    async def Reload(self) -> None:
        await self.backend.reload()

    @method()
    @access(BENCH)
    @guarded
    async def Bench(self, name: "s", mode: "s", predict: "u", prompt: "u") -> "a{sv}":
        return json_variant(await self.backend.bench(checked_name(name), mode, predict,
                                                     prompt))

    @method()
    @access(BENCH)
    @guarded
    async def BenchRepeat(self, name: "s", mode: "s", predict: "u", prompt: "u",
                          repeat: "u") -> "a{sv}":
        return json_variant(await self.backend.bench(checked_name(name), mode, predict,
                                                     prompt, repeat))

    @method()
    @access(EDIT)
    @guarded
    async def GetPresetSource(self, name: "s") -> "ss":
        source = await self.backend.editor.source(checked_name(name))
        return [source.text, source.etag]

    @method()
    @access(EDIT)
    @guarded
    async def CreatePreset(self, name: "s", text: "s") -> "os":
        version = await self.backend.editor.create(checked_name(name), text)
        return [preset_object_path(name), version]

    @method()
    @access(EDIT)
    @guarded
    async def UpdatePreset(self, name: "s", text: "s", etag: "s") -> "s":
        return await self.backend.editor.update(checked_name(name), text, etag)

    @method()
    @access(EDIT)
    @guarded
    async def SetPresetKeys(self, name: "s", values: "a{sv}", etag: "s") -> "s":
        return await self.backend.editor.set_keys(checked_name(name), values, etag)

    @method()
    @access(EDIT)
    @guarded
    async def UnsetPresetKeys(self, name: "s", keys: "as", etag: "s") -> "s":
        return await self.backend.editor.unset_keys(checked_name(name), list(keys), etag)

    @method()
    @access(EDIT)
    @guarded
    async def DeletePreset(self, name: "s", force: "b") -> None:
        await self.backend.editor.delete(checked_name(name), bool(force))

    @method()
    @access(EDIT)
    @guarded
    async def RenamePreset(self, name: "s", new_name: "s", force: "b") -> "o":
        if not valid_preset_name(new_name):
            raise InvalidArgsError(f"invalid preset name {new_name[:64]!r}: use 1 to 64 "
                                   "characters from A-Z a-z 0-9 _ . -, starting with a "
                                   "letter or a digit")
        await self.backend.editor.rename(checked_name(name), new_name, bool(force))
        return preset_object_path(new_name)

    @method()
    @access(READ)
    @guarded
    async def DraftCandidates(self, name: "s") -> "aa{sv}":
        found = await self.backend.editor.draft_candidates(checked_name(name),
                                                           await self.backend.caller())
        return [json_variant(c) for c in found]

    @method()
    @access(READ_LOGS)
    @guarded
    async def ReadLogs(self, name: "s", cursor: "s", lines: "u") -> "a(tss)s":
        # a broken or removed preset's unit keeps its journal: the name is enough
        found, last = await self.backend.logs.read(checked_name(name), cursor, lines)
        return [[list(line) for line in found], last]

    @method()
    @access(READ_LOGS)
    @guarded
    async def StatsSince(self, name: "s", since: "d") -> "a{sv}":
        kind = str((self.backend.stats(checked_name(name)).get("draft") or {}).get("kind")
                   or "")
        return json_variant(await self.backend.logs.window(name, since, kind))

    @signal()
    def BenchProgress(self, preset: "s", phase: "s", step: "u", steps: "u") -> "ssuu":
        return [preset, phase, step, steps]

    @signal()
    def EngineStateChanged(self, preset: "s", state: "s", detail: "s") -> "sss":
        return [preset, state, detail]

    @signal()
    def JobFinished(self, preset: "s", job: "s", verb: "s", result: "s", state: "s",
                    detail: "s") -> "ssssss":
        return [preset, job, verb, result, state, detail]

    @signal()
    def VerdictRecorded(self, preset: "s", reason: "s") -> "ss":
        return [preset, reason]
