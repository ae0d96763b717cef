"""Collecting a plan's inputs from the host: config files, model headers, the engine, RAM.

This is the I/O half of ``lokid plan``: it turns a preset name into
:class:`lokid.core.plan.PlanInputs`, then :func:`lokid.core.plan.build_plan` decides.
:func:`decide` is the plan of the next start: the attempt verdict the state DB
holds for it applied, as ``lokid prestart``, the daemon's registry and the
benchmark all need it. Nothing here writes anything.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

from ..core import config as cfg
from ..core.attempt import Mark, Verdict
from ..core.errors import ConfigError, ModelError
from ..core.modelinfo import probe_model
from ..core.plan import Plan, PlanInputs, build_plan, config_fingerprint
from ..core.spec import DraftInput
from .probe import probe_engine

if TYPE_CHECKING:
    from .state import StateDB


def host_memory() -> int:
    """Total RAM in bytes from /proc/meminfo, 0 when unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _missing(preset: cfg.Preset, key: str, value: str, dirs: tuple[str, ...]) -> ConfigError:
    if os.path.isabs(value):
        why = f"{value} does not exist"
    elif dirs:
        why = f"{value!r} is in none of model_dirs ({', '.join(dirs)})"
    else:
        why = f"{value!r} is a bare name but lokid.toml sets no model_dirs"
    return ConfigError(why, preset.path, None, key)


def _draft(preset: cfg.Preset, model_path: str, dirs: tuple[str, ...]) -> DraftInput | None:
    raw = preset.spec.draft
    if raw is None:
        return None
    if not isinstance(raw, str) or not raw.strip():
        return DraftInput(setting=repr(raw), error="it must be a file name or an absolute path")
    path = cfg.resolve_file(raw, dirs)
    if path is None:
        where = "" if os.path.isabs(raw) else f"in model_dirs ({', '.join(dirs) or 'none set'})"
        return DraftInput(setting=raw, error=where)
    try:
        same = os.path.samefile(path, model_path)
    except OSError:
        same = False
    try:
        info = probe_model(path)
    except ModelError as e:
        return DraftInput(setting=raw, path=path, error=str(e), is_model=same)
    return DraftInput(setting=raw, path=path, info=info, is_model=same)


def gather(config_dir: str, name: str, environ: Mapping[str, str] | None = None,
           auto_blocked: str = "") -> PlanInputs:
    """Everything the plan of preset ``name`` depends on.

    Raises ConfigError (preset or lokid.toml invalid, model missing),
    NotFoundError (no such preset), ModelError (the model is not a readable
    GGUF) or EngineError (the engine is missing or not llama-server).
    """
    glob = cfg.load_global(config_dir)
    preset = cfg.load_preset(config_dir, name)
    dirs = glob.model_dirs

    model_path = cfg.resolve_file(preset.model, dirs)
    if model_path is None:
        raise _missing(preset, "model", preset.model, dirs)
    model = probe_model(model_path)

    mmproj_path = None
    if preset.mmproj is not None:
        mmproj_path = cfg.resolve_file(preset.mmproj, dirs)
        if mmproj_path is None:
            raise _missing(preset, "mmproj", preset.mmproj, dirs)

    return PlanInputs(
        preset=preset,
        config=glob,
        model_path=model_path,
        model=model,
        caps=probe_engine(glob.engine, glob.path),
        mmproj_path=mmproj_path,
        draft=_draft(preset, model_path, dirs),
        environ=dict(os.environ if environ is None else environ),
        host_memory=host_memory(),
        auto_blocked=auto_blocked,
    )


def make_plan(config_dir: str, name: str, environ: Mapping[str, str] | None = None) -> Plan:
    return build_plan(gather(config_dir, name, environ))


def decide(inputs: PlanInputs, db: StateDB) -> tuple[Plan, Mark, Verdict]:
    """The plan of a start, given the attempt verdict for its mark (read-only on ``db``).

    The mark is the plan's as it would be with automatic speculation allowed, so
    that a cut configuration keeps the same mark.
    """
    allowed = build_plan(inputs)
    mark = Mark(config_fingerprint(allowed, inputs.model), inputs.caps.path, inputs.caps.build)
    found = db.peek(inputs.preset.name, mark)
    plan = build_plan(replace(inputs, auto_blocked=found.why)) if found.why else allowed
    return plan, mark, found
