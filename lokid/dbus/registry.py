"""What the daemon knows about each preset: its settings, its plan, its recorded verdict.

:meth:`Registry.load` reads every preset and computes each plan as the next
start would (``unit.decide``: the attempt verdict applied), the way ``lokid
prestart`` will. It does I/O (config files, GGUF headers, the engine's
``--help``), so the daemon runs it in a worker thread; D-Bus property reads
are then served from the snapshot. A broken preset is kept with its error and
never hides the others; an external preset (``kind = "external"``) is served
without a plan, its error saying that nothing runs here (every start refuses it),
and is no broken preset; a preset that cannot be planned (missing model,
missing engine, a port its engine's user may not take, the port of another
preset that holds it) is served with the reason instead of a plan, and is
broken all the same for whoever asks which presets cannot start
(:meth:`Registry.unstartable`).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..core.bench.rules import bench_fingerprint
from ..core.config import aliases
from ..core.config import files as cfg
from ..core.config.external import ENGINE, EXTERNAL, External, external_notes, nothing_runs
from ..core.errors import (
    ConfigError,
    ExternalPresetError,
    LokiError,
    ModelNotPulledError,
    NotFoundError,
    ProbePending,
    StateError,
)
from ..core.launch.attempt import LOADING_NOW
from ..core.launch.plan import Plan
from ..core.model import modeltraits
from ..core.model.modelinfo import ModelInfo
from ..core.names import engine_unit
from ..core.place.footprint import Footprint
from ..core.place.settings import PlacementConfig
from ..core.record import replace
from ..core.serve.tables import Serve
from ..host.probe import Outcome
from ..planning.gather import decide, gather
from ..planning.sizing import extra_files, memory_key_of
from ..store.state import StateDB, StateReader, read_cleared

log = logging.getLogger("lokid.daemon")


@dataclass(frozen=True)
class PresetView:
    """One valid preset file, with its plan or the reason it has none."""

    name: str
    path: str
    model: str                      # the setting as written
    spec_mode: str                  # the setting as written ("off" when absent)
    plan: Plan | None               # as the next start would run it
    error: str = ""                 # why there is no plan
    error_type: type[LokiError] = LokiError
    auto_blocked: str = ""          # recorded reason automatic speculation is cut, or ""
    bench: dict[str, Any] | None = None   # the saved benchmark of this very configuration
    # Where it listens, for the port conflicts: its plan's host and port; without a plan,
    # where the unit's start counts it as listening (gather.listeners), or None
    listen: tuple[str, int] | None = None
    serve: Serve = field(default_factory=Serve)   # [serve]: on demand, idle stop, group
    # kind = "external": an API elsewhere, no engine (its error says so to every start)
    external: External | None = None
    # the file of its API key (an engine's api_key_file, or an external API's): the gateway
    # reads it (:mod:`lokid.core.config.external`); a path, never the key
    key_file: str = ""
    # what its engine's memory is measured for (lokid.core.place.footprint), "" without a
    # plan; and the footprint measured for it, if any
    memory_key: str = ""
    footprint: Footprint | None = None
    # its model's header and the files loaded beside it (bytes by name): what the memory
    # estimate reads (lokid.core.place.need), None without a plan
    info: ModelInfo | None = None
    extra: Mapping[str, int] = field(default_factory=dict)
    # the preset's cpu_fallback (lokid.dbus.oncpu): "fail" stops a start found on the CPU
    cpu_fallback: str = "run"
    # its aliases as written, those it is routed by (a clash costs the alias, not the
    # preset: lokid.core.config.aliases), and why one was dropped
    declared_aliases: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()
    alias_notes: tuple[str, ...] = ()
    # what it can do and its context, from its plan and GGUF (lokid.core.model.modeltraits),
    # computed with the plan: () and 0 without one
    capabilities: tuple[str, ...] = ()
    context_length: int = 0

    @property
    def unit(self) -> str:
        return engine_unit(self.name)

    @property
    def kind(self) -> str:
        return EXTERNAL if self.external is not None else ENGINE

    @property
    def notes(self) -> list[str]:
        if self.external is not None:
            return external_notes(self.name, self.external) + list(self.alias_notes)
        return (list(self.plan.notes) if self.plan else [self.error]) + list(self.alias_notes)

    @property
    def argv(self) -> list[str]:
        return list(self.plan.argv) if self.plan else []

    @property
    def pulls_first(self) -> bool:
        """Its model is a hub reference not pulled yet (issue 48): no fault, a start pulls
        it first (:mod:`lokid.unit.pullfirst`)."""
        return self.plan is None and issubclass(self.error_type, ModelNotPulledError)

    def failure(self) -> LokiError:
        """Why the preset cannot start, as the error its planning raised."""
        return self.error_type(self.error)


@dataclass
class Registry:
    config_dir: str
    state_dir: str
    runtime_dir: str = ""   # where a start notes a token it could not clear ("" = none)
    # Whether the engines run as loki-engine@.service (its user: files, port): planned as
    # the unit will run them, as `lokid plan` does; else as this process.
    for_units: bool = False
    presets: dict[str, PresetView] = field(default_factory=dict)
    broken: dict[str, str] = field(default_factory=dict)   # name → the error, one line
    # Whether a preset's engine is loading now: its attempt token is then its own, shown
    # as pending rather than as a launch that never answered (set by the daemon).
    loading: Callable[[str], bool] = lambda name: False
    # Whether a preset's engine has answered (ready): a token still on record is its own,
    # about to be cleared by the engine's step (it clears it just after READY=1): neither
    # a launch that never answered nor one loading now (set by the daemon).
    answered: Callable[[str], bool] = lambda name: False
    # How long one load may wait for the engine's probe, all presets together (None:
    # until it ends). The daemon waits briefly: an engine that hangs on --help must not
    # hold its readiness; the presets then say so, and are planned again at its end.
    probe_budget: float | None = None
    # The probe a load gave up waiting for (its future), until it ends.
    pending_probe: Outcome | None = None
    problem: str = ""   # why no preset could be read at all ("" when they could)
    # lokid.toml's [placement] as the last load read it (defaults where it did not parse)
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    # the presets marked example = true (the package's example): never started, and
    # left out of the lokid_preset_broken metric (issue 45, item 14)
    examples: frozenset[str] = frozenset()
    # why the state DB could not be written when the presets were last planned ("": it
    # could): a refresh that finds otherwise plans them all again (issue 45, item 11)
    db_fault: str = ""

    def load(self) -> None:
        """Read every preset again and replace the snapshot (blocking: run in a thread)."""
        try:
            good, bad = cfg.load_presets(self.config_dir)
            self.problem = ""
        except ConfigError as e:  # the directory itself: no preset, and the daemon says why
            log.warning("%s", e)
            good, bad, self.problem = {}, {}, str(e)
        try:
            self.placement = cfg.load_global(self.config_dir).placement
        except LokiError:   # the presets say what is wrong with lokid.toml
            self.placement = PlacementConfig()
        views = {}
        self.pending_probe = None
        deadline = None if self.probe_budget is None else time.monotonic() + self.probe_budget
        with self._state() as db:
            self.db_fault = db.unwritable
            for name, preset in good.items():
                views[name] = replace(self._view(preset, db, deadline), serve=preset.serve,
                                      external=preset.external, key_file=_key_file(preset),
                                      declared_aliases=preset.aliases)
        self.presets = self._with_conflicts(views)
        self.broken = {name: str(error) for name, error in bad.items()}
        self.examples = frozenset(name for name, preset in good.items() if preset.example)

    def refresh(self, name: str) -> PresetView:
        """Plan one preset again (after a verdict was recorded for it; for one of its
        replicas' engines, ``NAME:k``: the preset, whose view the replicas share)."""
        from ..core.serve.replicas import preset_of

        name = preset_of(name)
        preset = cfg.load_preset(self.config_dir, name)
        self.examples = self.examples - {name} | ({name} if preset.example else set())
        deadline = None if self.probe_budget is None else time.monotonic() + self.probe_budget
        with self._state() as db:
            if bool(db.unwritable) != bool(self.db_fault):
                # the state DB can be written again (a write of the start that made this
                # refresh succeeded), or no longer: every plan said otherwise (item 11)
                db.close()
                self.load()
                return self.presets[name]
            view = replace(self._view(preset, db, deadline), serve=preset.serve,
                           external=preset.external, key_file=_key_file(preset),
                           declared_aliases=preset.aliases)
        self.presets = self._with_conflicts({**self.presets, name: view})
        return self.presets[name]

    def unstartable(self) -> dict[str, str]:
        """Every preset that cannot start as it is, with why (the Manager's
        BrokenPresets): the files that do not parse, and the valid ones whose next start
        cannot be planned as the unit would plan it (model missing, a port its user may
        not take, the port another preset holds). A probe of the engine still running is
        no fault of a preset's: those wait for it, and are not listed; nor is a model named
        by a hub reference and not pulled yet, which a start pulls first."""
        out = {name: view.error for name, view in self.presets.items()
               if view.plan is None and view.external is None
               and not issubclass(view.error_type, ProbePending) and not view.pulls_first}
        out.update(self.broken)
        return dict(sorted(out.items()))

    def _with_conflicts(self, views: dict[str, PresetView]) -> dict[str, PresetView]:
        """Presets that would listen where another one that holds the address does (the
        one that started on it last, else the first by name): each gets the error, as
        ``lokid plan`` and its start report it; the holder keeps its plan."""
        from ..core.launch import conflicts
        from ..core.record import replace
        from ..core.serve.replicas import instance, replica_port
        from ..planning.gather import last_starts

        found = {name: conflicts.Endpoint(*v.listen, v.path)
                 for name, v in views.items() if v.listen is not None}
        # each replica's port is its preset's too (lokid.core.serve.replicas), as a start counts it
        found.update({instance(name, k): conflicts.Endpoint(
            v.listen[0], replica_port(v.listen[1], k), v.path)
            for name, v in views.items() if v.listen is not None
            for k in range(2, v.serve.max_replicas + 1)})
        clashes = conflicts.port_conflicts(found, last_starts(self.runtime_dir, found))
        # a preset that has no plan anyway keeps its own reason; the file first, as the
        # start's own refusal says it
        views = {name: replace(v, plan=None, error=str(ConfigError(clashes[name], v.path)),
                               error_type=ConfigError)
                 if name in clashes and v.plan is not None else v
                 for name, v in views.items()}
        # each name routes to one preset: a clash costs the alias (lokid.core.config.aliases)
        kept, lost = aliases.resolve({n: v.declared_aliases for n, v in views.items()})
        for name, why in sorted(lost.items()):
            log.warning("preset %s: %s", name, "; ".join(why))
        return {name: replace(v, aliases=kept[name], alias_notes=tuple(lost.get(name, ())))
                for name, v in views.items()}

    def _state(self) -> StateDB | StateReader:
        """The state DB to plan with: read-only when it cannot be opened to write (a
        newer schema, a state directory that cannot be created): the presets are still
        served, their verdicts read as the reader can (:class:`StateReader` never
        raises)."""
        try:
            return StateDB(self.state_dir)
        except StateError as e:
            log.warning("%s: planning the presets with the state DB read-only", e)
            return StateReader(self.state_dir)

    def _view(self, preset: cfg.Preset, db: StateDB | StateReader,
              deadline: float | None = None) -> PresetView:
        mode = preset.spec.mode if isinstance(preset.spec.mode, str) else "off"
        if preset.external is not None:   # nothing to plan: an API elsewhere
            return PresetView(preset.name, preset.path, "", "off", plan=None,
                              error=nothing_runs(preset.name, preset.external),
                              error_type=ExternalPresetError, external=preset.external)
        wait = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            inputs = gather(self.config_dir, preset.name, for_unit=self.for_units,
                            probe_wait=wait, state_dir=self.state_dir)
            cleared = read_cleared(self.runtime_dir, preset.name) if self.runtime_dir else None
            answered = self.answered(preset.name)
            plan, _, found = decide(inputs, db, loading=answered or self.loading(preset.name),
                                    cleared=cleared)
            if answered and found.pending == LOADING_NOW:
                plan = replace(plan, notes=tuple(n for n in plan.notes if n != LOADING_NOW))
        except ProbePending as e:
            self.pending_probe = e.future
            return PresetView(preset.name, preset.path, preset.model, mode or "off", plan=None,
                              error=str(e), error_type=type(e),
                              listen=_listen(self.config_dir, preset))
        except LokiError as e:
            return PresetView(preset.name, preset.path, preset.model, mode or "off", plan=None,
                              error=str(e), error_type=type(e),
                              listen=_listen(self.config_dir, preset))
        except Exception as e:  # a defect, or input no check foresaw: this preset only
            log.warning("preset %s: planning failed: %s: %s", preset.name, type(e).__name__, e)
            return PresetView(preset.name, preset.path, preset.model, mode or "off", plan=None,
                              error=f"{preset.path}: cannot be planned: internal error "
                              f"({type(e).__name__}: {e})")
        error = _address_error(plan, inputs, self.for_units)
        if error is not None:
            return PresetView(preset.name, preset.path, preset.model, mode or "off", plan=None,
                              error=str(error), error_type=type(error),
                              listen=(plan.host, plan.port))
        saved = db.bench(preset.name, bench_fingerprint(plan, inputs)) \
            if isinstance(db, StateDB) else None
        bench = None
        if saved is not None:
            bench = {"result": saved.result, "model": saved.model, "engine": saved.engine,
                     "at": saved.at}
        memory = memory_key_of(plan, inputs)
        footprint = db.footprint(preset.name, memory)
        traits = modeltraits.read_traits(inputs.model_path)   # once per plan, bounded
        return PresetView(preset.name, preset.path, preset.model, mode or "off",
                          plan=plan, auto_blocked=found.why, bench=bench,
                          listen=(plan.host, plan.port), memory_key=memory,
                          footprint=footprint, info=inputs.model, extra=extra_files(plan),
                          cpu_fallback=preset.cpu_fallback,
                          capabilities=tuple(modeltraits.capabilities(plan.argv, traits)),
                          context_length=modeltraits.context_length(plan.argv, traits))

    def get(self, name: str) -> PresetView:
        view = self.presets.get(name)
        if view is None:
            if name in self.broken:
                raise ConfigError(f"preset {name!r} is invalid: {self.broken[name]}")
            raise NotFoundError(f"no preset {name!r} (known: {', '.join(sorted(self.presets))})")
        return view


def _key_file(preset: cfg.Preset) -> str:
    if preset.external is not None:
        return preset.external.api_key_file or ""
    return preset.api_key_file or ""


def _listen(config_dir: str, preset: cfg.Preset) -> tuple[str, int] | None:
    """Where a preset without a plan listens as the port check of a start counts it
    (:func:`lokid.planning.gather.listeners`: its model file is found), or None; so that
    the daemon names the holder of a port as the unit's start will."""
    from ..planning.gather import listeners

    try:
        found = listeners(cfg.load_global(config_dir), {preset.name: preset})
    except LokiError:
        return None
    endpoint = found.get(preset.name)
    return None if endpoint is None else (endpoint.host, endpoint.port)


def _address_error(plan: Plan, inputs: Any, for_units: bool) -> ConfigError | None:
    """Why the engine could not listen where the plan says (an address that is not this
    host's, a port its user may not take), as ``lokid plan`` says it. Addresses only: a
    host *name* would make every load wait on DNS; its start says what is wrong with it."""
    import ipaddress

    from ..core.launch.conflicts import listen_source
    from ..planning.endpoint import check_address
    from ..planning.gather import unit_user

    try:
        ipaddress.ip_address(plan.host.strip("[]"))
    except ValueError:
        return None
    try:
        check_address(plan.host, plan.port, unit_user(os.environ) if for_units else None,
                      listen_source(inputs.preset, inputs.config))
    except ConfigError as e:
        return e
    return None
