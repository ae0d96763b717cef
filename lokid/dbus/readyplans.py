"""Plans kept ready for the starts a request asks for (issue 22, item 8).

A start reuses the plan of the last start that became ready when nothing it was
made from changed (:mod:`lokid.store.plancache`); otherwise it plans, which costs
a new process its imports, the engine's probe and the model's header, on the path
of a request waiting for its first byte. For the presets that start for requests
(``[serve] on_demand``, or a ``group`` member started by a swap) the daemon,
which has just planned them all anyway, writes that record itself, a moment after
each load: the prestart step (or, under the local runner, ``lokid engine``) then
finds it and runs it, as after a ready start.

The record is the plan the unit's own start would make: gathered for the unit's
user, decided with the attempt verdict the state DB holds now (the start checks
that verdict again, and plans afresh when it moved), keyed on the files it came
from and on this process's environment (the unit's may differ, in ``PATH`` or a
``LLAMA_ARG_*`` drop-in: then the key differs and the start plans, as it would
without the record). It is written only when no reusable record is there, and
never for a preset that runs (its start's own record follows). The racy-file
rule of the cache holds: a file changed within a second of the planning leaves
no record, so the daemon tries again once, after :data:`SETTLE` seconds.

The file is owned by the runtime directory's owner (the engine unit's user, who
must read it); the daemon, root under systemd, writes it so.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable

from ..core.errors import LokiError, StateError
from ..core.launch.runtimeplan import RuntimePlan
from ..core.record import replace
from ..planning.gather import decide, gather
from ..store import plancache
from ..store.state import StateReader, read_cleared

log = logging.getLogger("lokid.daemon")

SETTLE = 1.5     # seconds after a load: past the cache's one-second racy window


def keep_ready(config_dir: str, state_dir: str, runtime_dir: str, name: str,
               for_unit: bool) -> bool:
    """Write the reuse record of ``name``'s next start; whether one was written (False:
    one is there already, or a file it came from changed too recently). Blocking."""
    environ = dict(os.environ)
    if not for_unit:   # the local runner's, this process's own (under systemd, tmpfiles.d's)
        os.makedirs(runtime_dir, exist_ok=True)
    if plancache.reusable(runtime_dir, name, environ) is not None:
        return False
    planned_at = time.time_ns()
    inputs = gather(config_dir, name, environ, for_unit=for_unit, state_dir=state_dir)
    with StateReader(state_dir) as db:
        plan, mark, found = decide(inputs, db, cleared=read_cleared(runtime_dir, name))
    rp = RuntimePlan.of(plan, mark)
    rp = replace(rp, notes=(*rp.notes, plancache.AHEAD))
    try:
        st = os.stat(runtime_dir)
        owner = (st.st_uid, st.st_gid) if os.geteuid() == 0 else None
    except OSError:
        return False
    return plancache.record(runtime_dir, name, plancache.inputs_paths(config_dir, inputs, environ),
                            environ, rp, found.why, planned_at, owner=owner)


class ReadyPlans:
    """Keeps the records of the presets that start for requests, after each load."""

    def __init__(self, config_dir: str, state_dir: str, runtime_dir: str, for_unit: bool,
                 spawn: Callable[..., object]):
        self.dirs = (config_dir, state_dir, runtime_dir)
        self.for_unit = for_unit
        self.spawn = spawn
        self.pending: asyncio.TimerHandle | None = None

    def after_load(self, names: list[str]) -> None:
        """``names``: the presets that start for requests and do not run now."""
        if not self.dirs[2] or not names:
            return
        if self.pending is not None:
            self.pending.cancel()
        loop = asyncio.get_running_loop()
        self.pending = loop.call_later(
            SETTLE, lambda: self.spawn(self._write(names), "keeping plans ready"))

    async def _write(self, names: list[str], again: bool = True) -> None:
        self.pending = None
        late = []
        for name in names:
            try:
                if not await asyncio.to_thread(keep_ready, *self.dirs, name, self.for_unit):
                    late.append(name)
            except (LokiError, StateError, OSError) as e:
                # the start plans, and says what is wrong then
                log.debug("preset %s: no plan kept ready: %s", name, e)
        if late and again:
            await asyncio.sleep(SETTLE)
            await self._write([n for n in late if not self._has(n)], again=False)

    def _has(self, name: str) -> bool:
        return plancache.reusable(self.dirs[2], name, os.environ) is not None
