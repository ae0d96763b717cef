"""Which stops a GPU group's start waits for (lokid.dbus.groupstops), on the daemon's own
state: a stop asked of a member that runs, or a member seen stopping; never a member
that only runs, one whose stop ended, one stopped while it did not run and started
again since, nor a preset of another group. The integration (the real daemon, engines
and the step's wait) is tests/dbus/test_group_stops.py."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

from lokid.dbus.groupstops import GroupStops
from lokid.runners.runner import EngineState
from lokid.store.holds import take_hold


class Host:
    """The part of the daemon GroupStops reads: presets with their group, engine states,
    the runner's processes of a preset."""

    def __init__(self, root: Path, groups: dict[str, str]) -> None:
        self.runtime_dir = str(root)
        self.registry = SimpleNamespace(presets={
            name: SimpleNamespace(serve=SimpleNamespace(group=group))
            for name, group in groups.items()})
        self.states: dict[str, str] = {}
        self.runner = self

    def engine_state(self, name: str) -> EngineState:
        return EngineState(self.states.get(name, "inactive"))

    async def engine_pids(self, name: str) -> list[int]:
        return {"a": [101, 102], "b": [201], "x": [301]}.get(name, [])


async def test_a_start_waits_for_its_groups_stops_only(tmp_path: Path) -> None:
    host = Host(tmp_path, {"a": "gpu0", "b": "gpu0", "c": "gpu0", "x": "gpu1", "n": ""})
    stops = GroupStops(host)
    host.states.update(a="ready", b="ready", x="ready")
    assert stops.stopping("c") == []   # running is not stopping
    stops.stop_asked("a")
    stops.stop_asked("x")   # another group's
    assert stops.stopping("c") == ["a"]
    host.states["b"] = "stopping"   # a stop seen (systemctl stop by hand)
    assert stops.stopping("c") == ["a", "b"]
    assert stops.stopping("n") == [] and stops.stopping("a") == ["b"]
    t0 = time.monotonic()
    await stops.before_start("c")
    hold = take_hold(str(tmp_path), "c")
    assert hold is not None and hold.names == ("a", "b") and hold.pids == (101, 102, 201)
    assert t0 + 60 < hold.until < time.monotonic() + 200
    stops.seen("a", "inactive")   # its stop ended
    host.states["a"] = "inactive"
    host.states["b"] = "inactive"
    await stops.before_start("c")
    assert take_hold(str(tmp_path), "c") is None


async def test_a_stop_of_a_member_that_did_not_run_is_never_waited_for(tmp_path: Path) -> None:
    host = Host(tmp_path, {"a": "gpu0", "c": "gpu0"})
    stops = GroupStops(host)
    stops.stop_asked("a")   # not running: nothing to wait for, no end will be seen
    host.states["a"] = "ready"   # started again later
    assert stops.stopping("c") == []


async def test_a_members_own_start_forgets_its_stop(tmp_path: Path) -> None:
    host = Host(tmp_path, {"a": "gpu0", "c": "gpu0"})
    stops = GroupStops(host)
    host.states["a"] = "ready"
    stops.stop_asked("a")
    await stops.before_start("a")   # started again (a restart, or a start replacing it)
    assert stops.stopping("c") == []


async def test_a_note_left_by_a_start_that_never_took_it_goes(tmp_path: Path) -> None:
    host = Host(tmp_path, {"a": "gpu0", "c": "gpu0"})
    stops = GroupStops(host)
    host.states["a"] = "stopping"
    await stops.before_start("c")
    assert (tmp_path / "c.after").exists()
    host.states["a"] = "inactive"
    await stops.before_start("c")   # the next start, nothing under way: no note left
    assert not (tmp_path / "c.after").exists()
