"""What the daemon knows about each preset: its settings, its plan, its recorded verdict.

:meth:`Registry.load` reads every preset and computes each plan as the next
start would (``unit.decide``: the attempt verdict applied), the way ``lokid
prestart`` will. It does I/O (config files, GGUF headers, the engine's
``--help``), so the daemon runs it in a worker thread; D-Bus property reads
are then served from the snapshot. A broken preset is kept with its error and
never hides the others; a preset that cannot be planned (missing model,
missing engine) is served with the reason instead of a plan.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..core import config as cfg
from ..core.benchrules import bench_fingerprint
from ..core.errors import ConfigError, LokiError, NotFoundError
from ..core.names import engine_unit
from ..core.plan import Plan
from ..engine.gather import decide, gather
from ..engine.state import StateDB


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
    listen: tuple[str, int] | None = None  # host and port of its plan (kept when in conflict)

    @property
    def unit(self) -> str:
        return engine_unit(self.name)

    @property
    def notes(self) -> list[str]:
        return list(self.plan.notes) if self.plan else [self.error]

    @property
    def argv(self) -> list[str]:
        return list(self.plan.argv) if self.plan else []

    def failure(self) -> LokiError:
        """Why the preset cannot start, as the error its planning raised."""
        return self.error_type(self.error)


@dataclass
class Registry:
    config_dir: str
    state_dir: str
    presets: dict[str, PresetView] = field(default_factory=dict)
    broken: dict[str, str] = field(default_factory=dict)   # name → the error, one line
    # Whether a preset's engine is loading now: its attempt token is then its own, shown
    # as pending rather than as a launch that never answered (set by the daemon).
    loading: Callable[[str], bool] = lambda name: False

    def load(self) -> None:
        """Read every preset again and replace the snapshot (blocking: run in a thread)."""
        good, bad = cfg.load_presets(self.config_dir)
        views = {}
        with StateDB(self.state_dir) as db:
            for name, preset in good.items():
                views[name] = self._view(preset, db)
        self.presets = self._with_conflicts(views)
        self.broken = {name: str(error) for name, error in bad.items()}

    def refresh(self, name: str) -> PresetView:
        """Plan one preset again (after a verdict was recorded for it)."""
        preset = cfg.load_preset(self.config_dir, name)
        with StateDB(self.state_dir) as db:
            view = self._view(preset, db)
        self.presets = self._with_conflicts({**self.presets, name: view})
        return self.presets[name]

    def _with_conflicts(self, views: dict[str, PresetView]) -> dict[str, PresetView]:
        """Presets that would listen on one address and port: each gets the error (none
        of them can start while the other may), as ``lokid plan`` reports it."""
        from dataclasses import replace

        from ..core import conflicts

        found = {name: conflicts.Endpoint(*v.listen, v.path)
                 for name, v in views.items() if v.listen is not None}
        clashes = conflicts.port_conflicts(found)
        return {name: replace(v, plan=None, error=clashes[name], error_type=ConfigError)
                if name in clashes else v for name, v in views.items()}

    def _view(self, preset: cfg.Preset, db: StateDB) -> PresetView:
        mode = preset.spec.mode if isinstance(preset.spec.mode, str) else "off"
        try:
            inputs = gather(self.config_dir, preset.name)
            plan, _, found = decide(inputs, db, loading=self.loading(preset.name))
        except LokiError as e:
            return PresetView(preset.name, preset.path, preset.model, mode or "off", plan=None,
                              error=str(e), error_type=type(e))
        saved = db.bench(preset.name, bench_fingerprint(plan, inputs))
        bench = None
        if saved is not None:
            bench = {"result": saved.result, "model": saved.model, "engine": saved.engine,
                     "at": saved.at}
        return PresetView(preset.name, preset.path, preset.model, mode or "off",
                          plan=plan, auto_blocked=found.why, bench=bench,
                          listen=(plan.host, plan.port))

    def get(self, name: str) -> PresetView:
        view = self.presets.get(name)
        if view is None:
            if name in self.broken:
                raise ConfigError(f"preset {name!r} is invalid: {self.broken[name]}")
            raise NotFoundError(f"no preset {name!r} (known: {', '.join(sorted(self.presets))})")
        return view
