"""The daemon's ``Bench()``: one benchmark at a time per preset, on its ready engine.

The measurement itself is :mod:`lokid.bench.measure` (shared with ``lokid bench``);
this part checks the call, keeps a second call for the same preset out while one runs,
reports progress (``BenchProgress``) and has the preset read again once a result is
saved. It is given what it needs from the daemon as callables, not the daemon itself.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from ..core.bench import rules as benchrules
from ..core.bench.iosample import IOSampler
from ..core.config.external import BENCH_REFUSAL
from ..core.errors import BusyError, EngineError, ExternalPresetError, InvalidArgsError

log = logging.getLogger("lokid.daemon")


class Benches:
    """``state_of(name)``: the engine's state ("ready", …); ``known(name)`` raises
    NotFound for a preset the daemon does not serve; ``sampler(name)``: the thrash
    hint's reader for the depth phase; ``progress(name, phase, step, steps)`` emits
    BenchProgress; ``saved(name)`` runs after a result is kept."""

    def __init__(self, config_dir: str, state_dir: str, runtime_dir: str, *,
                 state_of: Callable[[str], str], known: Callable[[str], object],
                 sampler: Callable[[str], Awaitable[IOSampler | None]],
                 progress: Callable[[str, str, int, int], None],
                 saved: Callable[[str], Awaitable[None]]):
        self.config_dir, self.state_dir, self.runtime_dir = config_dir, state_dir, runtime_dir
        self._state_of, self._known, self._sampler = state_of, known, sampler
        self._progress, self._saved = progress, saved
        self.running: set[str] = set()

    async def run(self, name: str, mode: str, predict: int, prompt: int,
                  repeat: int = 1) -> dict[str, Any]:
        """Benchmark the preset's ready engine, ``repeat`` runs after one warm-up; the
        reply of :class:`measure.Outcome`."""
        from ..bench import measure
        from ..bench.protocol import Options
        from ..core.bench.repeat import repeat_error

        if mode not in (benchrules.QUICK, benchrules.FULL):
            raise InvalidArgsError(f"mode {mode!r}: quick or full")
        if not 0 <= predict <= benchrules.MAX_TOKENS or not 0 <= prompt <= benchrules.MAX_TOKENS:
            raise InvalidArgsError("predict and prompt: 0 (the default) to "
                                   f"{benchrules.MAX_TOKENS}")
        if repeat_error(repeat):
            raise InvalidArgsError(repeat_error(repeat))
        view = self._known(name)
        if getattr(view, "external", None) is not None:
            raise ExternalPresetError(BENCH_REFUSAL)   # its figures would be a network's
        state = self._state_of(name)
        if state != "ready":
            raise EngineError(f"preset {name!r} is {state}, not ready: start it first "
                              f"(lokictl start {name} --wait)")
        if name in self.running:
            raise BusyError(f"a benchmark of {name!r} is already running")
        self.running.add(name)
        try:
            planned = await asyncio.to_thread(measure.planned, self.config_dir, self.state_dir,
                                              name)
            # The runner says the engine is ready: the runtime plan is its start's.
            running = await asyncio.to_thread(measure.started, self.runtime_dir, name)
            # The thrash hint, read where the runner can: the unit's cgroup under systemd
            # (lokid.service may not look into the loki user's processes), the child's
            # /proc files for the local runner. Only the depth phase uses it.
            sampler = await self._sampler(name) if mode == benchrules.FULL else None

            def progress(phase: str, step: int, steps: int) -> None:
                self._progress(name, phase, step, steps)

            opts = Options(mode, prompt=prompt or benchrules.DEFAULT_PROMPT,
                           predict=predict or benchrules.DEFAULT_PREDICT, repeat=repeat)
            log.info("preset %s: %s benchmark, %d run(s)", name, mode, repeat)
            out = await measure.measure(self.config_dir, self.state_dir, name, opts, progress,
                                        io_sampler=sampler, plan_and_inputs=planned,
                                        running=running)
        finally:
            self.running.discard(name)
        if out.saved:
            await self._saved(name)
        else:
            log.info("preset %s: benchmark not saved: %s", name, out.not_saved)
        return out.reply()
