"""Editing presets through the daemon: what the Manager's editing methods do, and the rules
that keep an edit from breaking what runs.

- Nothing is written that a start could not plan: the new text is parsed and planned
  as the preset's next start would plan it (as the unit's user under systemd: the
  files it reads, the address and port it may listen on; the port of another preset
  that holds it counts), and a refusal is the planner's own one-line error
  (``InvalidPreset``: file, line, key, valid values). The file then stays byte for
  byte as it was.
- An edit never gives a preset a name another one is routed by (its aliases, or its
  name as another's alias): ``InvalidPreset`` naming both (:mod:`lokid.core.config.aliases`).
- The files are written by :class:`lokid.store.presetstore.PresetStore`: atomic,
  one writer per preset at a time, over the version the caller read, and never over
  a hand edit saved meanwhile (``Busy`` otherwise). Comments and layout survive a
  key-level change (:mod:`lokid.core.config.presetedit`).
- An edit is bounded before any work (:func:`lokid.core.config.presetedit.check_edit`: 256
  keys, 64 KiB: ``InvalidArgs``), and a stopping daemon cancels one still running.
- After a write the daemon reads the presets again (and under systemd reruns the
  generator) before answering: the object the caller gets back exists and shows
  the new plan.
- An edit of a running preset applies at its next start: its object shows
  ``PendingRestart`` until then.
- Removing or renaming a preset whose engine runs is ``Busy`` unless forced (then its
  engine is stopped first); so is removing or renaming a preset whose model file is
  another preset's draft (:func:`lokid.core.launch.drafts.users_of`), which the error names.
  A removed preset's bench result, attempt token and recorded failures go with it; a
  renamed one keeps them under its new name.
- Draft candidates (:func:`lokid.core.launch.drafts.candidates`) are every GGUF in
  ``model_dirs`` and in the model's own directory, headers read, the model itself
  never among them.

Everything that touches files runs in a worker thread.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from ..core import access
from ..core.config import aliases, presetedit
from ..core.config import files as cfg
from ..core.errors import BusyError, ConfigError, InvalidArgsError, LokiError, ModelError
from ..core.launch import drafts
from ..core.launch.plan import build_plan
from ..planning.gather import check_start, gather, listable_by
from ..runners.runner import LIVE, EngineState
from ..store.presetstore import PresetStore, Source
from ..store.runtimefiles import remove_preset_files
from ..store.state import StateDB
from .registry import Registry


class EditHost(Protocol):
    """What the editor needs of the daemon (the daemon is one; tests may give another):
    where the files are, the presets as read, the engines' states, and the two verbs an
    edit calls: stop a preset, read the files again."""

    config_dir: str
    runtime_dir: str
    registry: Registry

    def engine_state(self, name: str) -> EngineState: ...

    async def stop(self, name: str) -> str: ...

    async def reload(self) -> None: ...

log = logging.getLogger("lokid.daemon")

FORCED_STOP_WAIT = 120.0   # seconds a forced removal waits for the engine to stop


def plain(value: Any) -> Any:
    """A D-Bus value (dbus-fast Variants unwrapped) as what a TOML value may be."""
    value = getattr(value, "value", value)
    if isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list) and all(isinstance(getattr(v, "value", v), str | int)
                                       and not isinstance(getattr(v, "value", v), bool)
                                       for v in value):
        return [getattr(v, "value", v) for v in value]
    raise InvalidArgsError(f"a value of type {type(value).__name__} cannot be a preset "
                           "setting: use a string, a number, a boolean, or a list of "
                           "strings or integers")


class Editor:
    def __init__(self, daemon: EditHost):
        self.daemon = daemon
        self.store = PresetStore(daemon.config_dir)

    # -- reading -----------------------------------------------------------------------

    async def source(self, name: str) -> Source:
        return await asyncio.to_thread(self.store.read, name)

    async def draft_candidates(self, name: str,
                               caller: access.User | None = None) -> list[dict[str, Any]]:
        """The draft candidates of preset ``name``, from the directories ``caller`` may
        list itself (None: every directory, for root and the daemon's own user): the
        method is open to anyone, and must not tell names, sizes and headers of models
        in a directory its caller cannot look into."""
        return await asyncio.to_thread(self._candidates, name, caller)

    def _candidates(self, name: str, caller: access.User | None) -> list[dict[str, Any]]:
        from ..core.model.modelinfo import probe_model

        config_dir = self.daemon.config_dir
        glob = cfg.load_global(config_dir)
        preset = cfg.load_preset(config_dir, name)
        model_path = cfg.resolve_file(preset.model, glob.model_dirs)
        if model_path is None:
            raise ModelError(f"{preset.path}: model {preset.model!r} not found: no draft can "
                             "be chosen for it")
        model = probe_model(model_path)
        model_dir = os.path.dirname(os.path.realpath(model_path))
        found: list[drafts.ModelFile] = []
        seen: set[str] = set()
        for directory in (*glob.model_dirs, model_dir):
            if caller is not None and not listable_by(caller, directory):
                continue
            try:
                entries = sorted(os.listdir(directory))
            except OSError:
                continue
            for entry in entries:
                path = os.path.join(directory, entry)
                real = os.path.realpath(path)
                if not entry.endswith(".gguf") or real in seen or not os.path.isfile(real):
                    continue
                if caller is not None and real != path and \
                        not listable_by(caller, os.path.dirname(real)):
                    continue  # a link into a directory the caller cannot list
                seen.add(real)
                try:
                    info = probe_model(path)
                except LokiError:
                    continue  # not a model lokid can read: not offered
                in_dirs = cfg.resolve_file(entry, glob.model_dirs)
                setting = entry if in_dirs is not None and os.path.realpath(in_dirs) == real \
                    else real
                found.append(drafts.ModelFile(setting, real, os.path.dirname(real), info,
                                              _same(real, model_path)))
        return drafts.candidates(model, model_dir, found)

    # -- writing -----------------------------------------------------------------------

    async def create(self, name: str, text: str) -> str:
        return await self._write(name, lambda _: text, "", f"preset {name} created", True)

    async def update(self, name: str, text: str, version: str) -> str:
        return await self._write(name, lambda _: text, version, f"preset {name} changed")

    async def set_keys(self, name: str, values: Mapping[str, Any], version: str) -> str:
        if not values:
            raise InvalidArgsError("no key to set")
        presetedit.check_edit(values)   # the bounds, before any other work
        changes = {key: plain(value) for key, value in values.items()}
        presetedit.check_edit(changes, changes.values())
        cancelled = self.store.cancelled
        return await self._write(
            name, lambda text: presetedit.set_keys(text or "", changes, cancelled), version,
            f"preset {name}: set {', '.join(sorted(changes))}")

    async def unset_keys(self, name: str, keys: list[str], version: str) -> str:
        if not keys:
            raise InvalidArgsError("no key to unset")
        presetedit.check_edit(keys)
        cancelled = self.store.cancelled
        return await self._write(
            name, lambda text: presetedit.unset_keys(text or "", keys, cancelled), version,
            f"preset {name}: unset {', '.join(sorted(keys))}")

    def close(self) -> None:
        """The daemon stops: an edit still running ends Busy before it writes."""
        self.store.close()

    async def _write(self, name: str, change: Callable[[str | None], str], version: str,
                     what: str, create: bool = False) -> str:
        """``change`` applied by the store (validated, versioned, atomic), then the
        presets read again; the new version."""
        new = await asyncio.to_thread(self.store.write, name, change, version,
                                      self._check(name), create)
        await self._reread(what)
        return new

    async def delete(self, name: str, force: bool) -> None:
        await self._guard(name, force, "remove")
        await asyncio.to_thread(self.store.delete, name)
        await asyncio.to_thread(self._forget_runtime, name)
        forgotten = await asyncio.to_thread(self._state, lambda db: db.forget_preset(name))
        await self._reread(f"preset {name} removed" + (
            f" (its {forgotten} records in the state database with it)" if forgotten else ""))

    async def rename(self, name: str, new_name: str, force: bool) -> None:
        if new_name == name:
            raise InvalidArgsError(f"preset {name!r} is already called so")
        await self._guard(name, force, "rename")
        await asyncio.to_thread(self.store.rename, name, new_name)
        await asyncio.to_thread(self._forget_runtime, name)
        await asyncio.to_thread(self._state, lambda db: db.move_preset(name, new_name))
        await self._reread(f"preset {name} renamed {new_name}")

    # -- the rules -----------------------------------------------------------------------

    def _check(self, name: str) -> Any:
        """The validation of a new text: planned as the preset's next start would be."""
        registry = self.daemon.registry
        config_dir, for_unit = self.daemon.config_dir, registry.for_units

        def check(path: str, text: str) -> None:
            preset = cfg.parse_preset_text(name, path, text)
            # each name routes to one preset: an edit never makes a clash
            # (lokid.core.config.aliases)
            aliases.check_unique(name, preset.aliases, {n: v.aliases for n, v in
                                                         registry.presets.items()}, path)
            if preset.external is not None:   # nothing runs here: parsed is all there is
                return
            inputs = gather(config_dir, name, for_unit=for_unit, preset=preset)
            # the address as the engine's user will bind it, and the port of a preset
            # that holds it: what the start would refuse before its engine runs
            check_start(config_dir, inputs, build_plan(inputs), for_unit,
                        registry.runtime_dir)
        return check

    async def _guard(self, name: str, force: bool, verb: str) -> None:
        """Busy unless ``force`` when the preset's engine runs or its model is another
        preset's draft; with ``force``, its engine is stopped first."""
        await asyncio.to_thread(self.store.read, name)  # NotFound before anything else
        users = await asyncio.to_thread(self._users, name)
        running = self.daemon.engine_state(name).state in LIVE
        if not force:
            if running:
                raise BusyError(f"preset {name!r} is running: stop it first, or {verb} it "
                                "with force (which stops it)")
            if users:
                raise BusyError(f"the model of preset {name!r} is the draft of "
                                f"{', '.join(users)}: {verb} it with force to do it anyway")
            return
        if users:
            log.warning("preset %s: %s with force; its model is the draft of %s", name, verb,
                        ", ".join(users))
        if running:
            log.info("preset %s: stopping its engine to %s it", name, verb)
            await self.daemon.stop(name)
            deadline = time.monotonic() + FORCED_STOP_WAIT
            while self.daemon.engine_state(name).state in LIVE:
                if time.monotonic() > deadline:
                    raise BusyError(f"preset {name!r}: its engine did not stop within "
                                    f"{FORCED_STOP_WAIT:.0f} s; nothing was changed")
                await asyncio.sleep(0.1)

    def _users(self, name: str) -> list[str]:
        """The presets whose draft is this preset's model file."""
        config_dir = self.daemon.config_dir
        try:
            glob = cfg.load_global(config_dir)
            presets, _ = cfg.load_presets(config_dir)
        except ConfigError:
            return []
        own = presets.get(name)
        model = cfg.resolve_file(own.model, glob.model_dirs) if own is not None else None
        if model is None:
            return []
        found: dict[str, str | None] = {}
        for other, preset in presets.items():
            draft = preset.spec.draft
            path = cfg.resolve_file(draft, glob.model_dirs) if draft else None
            found[other] = os.path.realpath(path) if path is not None else None
        return drafts.users_of(os.path.realpath(model), found, name)

    def _forget_runtime(self, name: str) -> None:
        """The runtime files of a preset that no longer runs under its name (its plan, its
        reusable plan, its failures…): a preset of that name made later starts afresh."""
        try:
            removed = remove_preset_files(self.daemon.runtime_dir, name)
        except OSError as e:
            log.warning("preset %s: its runtime files were not all removed: %s", name, e)
            return
        if removed:
            log.info("preset %s: removed %s", name, ", ".join(removed))

    def _state(self, fn: Any) -> int:
        """``fn`` on the state DB; a DB that cannot be written is one log line (the preset
        file has changed already: what the DB held is the lesser loss)."""
        try:
            with StateDB(self.daemon.registry.state_dir) as db:
                return int(fn(db))
        except LokiError as e:
            log.warning("the state database was not updated: %s", e)
            return 0

    async def _reread(self, what: str) -> None:
        log.info("%s", what)
        await self.daemon.reload()


def _same(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False
