"""A GPU group's swap without a wait between the stop and the start (issue 31, item 2).

One engine of a group at a time: the gateway stops the holder, then starts the member it
swaps in. It used to wait for the holder's unit to be inactive before asking the start,
so the new member's whole start came after the old engine's teardown: under systemd its
planning step, two sandboxed interpreters and the old unit's ``ExecStopPost``; under the
local runner the signal to the gateway, its call back and the step's own work.

Now a start of a group's member while other members of its group are being stopped (a
stop asked through the daemon, or a unit seen stopping) goes on at once, and leaves
the note :mod:`lokid.store.holds`: the processes of those members (their engine step and
everything under it, as the runner lists them) and until when to wait for them. Its
engine step waits for them just before it spawns its engine (:mod:`lokid.unit.held`):
memory is never asked while an engine of the group still holds it, and everything
before that overlaps the teardown. A start with nothing to wait for removes any note
left (a start that failed before its engine step never took its own).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Any

from ..runners.runner import LIVE, STOPPING
from ..store.holds import Hold, drop_hold, write_hold

log = logging.getLogger("lokid.daemon")

# Seconds a held start waits at most: the stop's own bound (the unit's TimeoutStopSec=,
# the local runner's STOP_TIMEOUT, 90 s), then its SIGKILL, then a margin.
HOLD_FOR = 100.0
WAIT_POLL = 0.01   # seconds between two looks, where no note could be written


class GroupStops:
    """The stops under way that a group's start waits for. ``host``: the daemon (its
    ``registry``, ``runner`` and ``runtime_dir``)."""

    def __init__(self, host: Any) -> None:
        self.host = host
        self.asked: set[str] = set()   # stops asked through the daemon, not seen ended

    def stop_asked(self, name: str) -> None:
        """A stop asked through the daemon: waited for until its end is seen (a preset that
        does not run has nothing to wait for)."""
        if self.host.engine_state(name).state in LIVE:
            self.asked.add(name)

    def seen(self, name: str, state: str) -> None:
        """The runner saw ``name`` change state: a stop that ended is no longer waited for."""
        if state not in LIVE:
            self.asked.discard(name)

    def stopping(self, name: str) -> list[str]:
        """The other members of ``name``'s group whose stop is under way."""
        presets = self.host.registry.presets
        view = presets.get(name)
        group = view.serve.group if view is not None else ""
        if not group:
            return []
        out = []
        for other, v in presets.items():
            if other == name or v.serve.group != group:
                continue
            state = self.host.engine_state(other).state
            if state == STOPPING or (other in self.asked and state in LIVE):
                out.append(other)
        return sorted(out)

    async def before_start(self, name: str) -> None:
        """A start (or restart) of ``name`` is asked: leave the note for it, the processes
        of the members of its group being stopped; else remove any note left. Where the
        note cannot be written (logged), the start waits here for those stops to end."""
        self.asked.discard(name)   # its own stop asked before is over, or replaced
        runtime_dir = self.host.runtime_dir
        others = self.stopping(name)
        pids: list[int] = []
        for other in others:
            pids += await self.host.runner.engine_pids(other)
        if not pids:
            drop_hold(runtime_dir, name)
            return
        hold = Hold(tuple(others), tuple(sorted(set(pids))), time.monotonic() + HOLD_FOR)
        try:
            st = os.stat(runtime_dir)
            write_hold(runtime_dir, name, hold, (st.st_uid, st.st_gid)
                       if os.geteuid() == 0 else None)
        except OSError as e:
            log.warning("preset %s: the note of the stops it waits for was not written "
                        "(%s): it starts once %s stopped", name, e, ", ".join(others))
            while time.monotonic() < hold.until and \
                    any(self.host.engine_state(o).state in LIVE for o in others):
                await asyncio.sleep(WAIT_POLL)
            return
        log.info("preset %s starts while %s %s stopping (its GPU group): its engine "
                 "waits for them, the rest of its start does not", name, ", ".join(others),
                 "is" if len(others) == 1 else "are")
