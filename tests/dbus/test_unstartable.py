"""Presets that parse but cannot start, on the real daemon (local runner) over a private
real dbus-daemon with the real engine: BrokenPresets lists them with the planner's reason,
an edit that would make one is refused with that reason, and of two presets on one port
the newcomer is the broken one while the one that holds the port runs on (issue 20,
items 5 and 6).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dbus_fast import DBusError
from support.daemonkit import daemon_on
from support.enginekit import free_port, readable_config, write_config, write_preset

from lokid.core.names import ERROR_PREFIX, MANAGER_INTERFACE, OBJECT_PATH, PRESET_INTERFACE
from lokid.core.names import preset_object_path as path_of

pytestmark = [pytest.mark.engine, pytest.mark.slow]

UNPRIVILEGED_PORT_START = Path("/proc/sys/net/ipv4/ip_unprivileged_port_start")


def holds(holder: str, port: int, last: bool) -> str:
    return (f"port {port} on 127.0.0.1 belongs to preset {holder} "
            f"({{config}}/presets/{holder}.toml), "
            + ("the last to start on it" if last else
               "first by name (no preset has started on it since boot)")
            + ": set another port in this preset")


async def test_the_newcomer_on_a_port_is_broken_and_the_holder_runs_on(
        tmp_path: Path, engine: str, models: Any, bus_address: str) -> None:
    config = write_config(tmp_path, engine, [models.dir])
    Path(models.llama)  # written on first use
    port = free_port()
    write_preset(config, "glm", f'model = "llama.gguf"\nctx = 2048\nport = {port}\n')
    async with daemon_on(config, tmp_path, bus_address) as running:
        m = await running.iface(OBJECT_PATH, MANAGER_INTERFACE)
        await m.call_start_preset("glm")
        await running.wait_event("glm", "ready")
        # dup.toml dropped beside the running glm, on its port: dup comes first by name,
        # but glm holds the port (its start is the last one on it)
        write_preset(config, "dup", f'model = "llama.gguf"\nctx = 2048\nport = {port}\n')
        await m.call_reload()
        broken = await m.get_broken_presets()
        assert broken == {"dup": f"{config}/presets/dup.toml: "
                          + holds("glm", port, True).format(config=config)}
        glm = await running.iface(path_of("glm"), PRESET_INTERFACE)
        assert (await glm.call_plan())["argv"].value == await glm.get_argv() != []
        # glm restarts (the restart that exited 78 before), dup may not start
        seen = len(running.events)
        await m.call_restart_preset("glm")
        await running.wait_event("glm", "ready", after=seen)
        with pytest.raises(DBusError) as e:
            await m.call_start_preset("dup")
        assert e.value.type == ERROR_PREFIX + "InvalidPreset"
        assert holds("glm", port, True).format(config=config) in e.value.text
        # an edit that moves another preset (first by name) onto the port is refused the same
        aaa = write_preset(config, "aaa", f'model = "llama.gguf"\nport = {free_port()}\n')
        before = aaa.read_bytes()
        await m.call_reload()
        _, version = await m.call_get_preset_source("aaa")
        with pytest.raises(DBusError) as e:
            await m.call_set_preset_keys("aaa", {"port": _int(port)}, version)
        assert e.value.type == ERROR_PREFIX + "InvalidPreset"
        assert e.value.text == f"{aaa}: " + holds("glm", port, True).format(config=config)
        assert aaa.read_bytes() == before
        # glm stopped: it still holds the port (it ran on it last), the listing stays
        seen = len(running.events)
        await m.call_stop_preset("glm")
        await running.wait_event("glm", "inactive", after=seen)
        await m.call_reload()
        assert list(await m.get_broken_presets()) == ["dup"]


async def test_of_two_presets_none_started_the_first_by_name_holds(
        tmp_path: Path, engine: str, models: Any, bus_address: str) -> None:
    config = write_config(tmp_path, engine, [models.dir])
    Path(models.llama)  # written on first use
    for name in ("a", "b"):
        write_preset(config, name, 'model = "llama.gguf"\nport = 8181\n')
    async with daemon_on(config, tmp_path, bus_address) as running:
        a = await running.iface(path_of("a"), PRESET_INTERFACE)
        assert await a.get_argv() != []
        b = await running.iface(path_of("b"), PRESET_INTERFACE)
        assert await b.get_argv() == []
        reason = f"{config}/presets/b.toml: " + holds("a", 8181, False).format(config=config)
        assert await b.get_notes() == [reason]
        m = await running.iface(OBJECT_PATH, MANAGER_INTERFACE)
        assert await m.get_broken_presets() == {"b": reason}
        with pytest.raises(DBusError) as exc:
            await m.call_start_preset("b")
        assert exc.value.type == ERROR_PREFIX + "InvalidPreset"


@pytest.fixture
def as_unit(engine: str, models: Any, engine_user: Any,
            monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A config, model and engine another user can read and run, planned as the unit
    plans for its user (``LOKI_ENGINE_USER``: a throwaway user standing in for loki)."""
    if int(UNPRIVILEGED_PORT_START.read_text()) <= 80:
        pytest.skip("net.ipv4.ip_unprivileged_port_start lowered here: anyone may take 80")
    root = Path(tempfile.mkdtemp(prefix="lokid-unstartable-"))
    try:
        config = readable_config(root, engine, models.llama)
        monkeypatch.setenv("LOKI_ENGINE_USER", engine_user.pw_name)
        yield config
    finally:
        shutil.rmtree(root)


def for_units(daemon: Any) -> None:
    daemon.registry.for_units = True   # as under systemd: planned for the unit's user


async def test_an_edit_the_units_user_could_not_start_is_refused(
        as_unit: Path, bus_address: str, engine_user: Any) -> None:
    config = as_unit
    file = write_preset(config, "qwen", f'model = "llama.gguf"\nctx = 2048\nport = {free_port()}\n')
    before = file.read_bytes()
    start = int(UNPRIVILEGED_PORT_START.read_text())
    async with daemon_on(config, config.parent, bus_address, prepare=for_units) as running:
        m = await running.iface(OBJECT_PATH, MANAGER_INTERFACE)
        assert await m.get_broken_presets() == {}
        _, version = await m.call_get_preset_source("qwen")
        with pytest.raises(DBusError) as e:
            await m.call_set_preset_keys("qwen", {"port": _int(80)}, version)
        assert e.value.type == ERROR_PREFIX + "InvalidPreset"
        # the planner's own message, as `lokid plan` and the unit's start say it
        assert e.value.text == (
            f"{file}: port: 80 is below {start}: user {engine_user.pw_name}, which runs the "
            f"engine, may not listen on it: use a port of {start} or above, or set the "
            "sysctl net.ipv4.ip_unprivileged_port_start to 80")
        assert file.read_bytes() == before


async def test_a_preset_written_by_hand_that_cannot_start_is_listed_broken(
        as_unit: Path, bus_address: str, engine_user: Any) -> None:
    config = as_unit
    low = write_preset(config, "low", 'model = "llama.gguf"\nport = 80\n')
    write_preset(config, "nomodel", 'model = "absent.gguf"\n')
    write_preset(config, "fine", f'model = "llama.gguf"\nport = {free_port()}\n')
    write_preset(config, "unparsed", 'model = "llama.gguf"\nctx = "big"\n')
    async with daemon_on(config, config.parent, bus_address, prepare=for_units) as running:
        m = await running.iface(OBJECT_PATH, MANAGER_INTERFACE)
        broken = await m.get_broken_presets()
        assert sorted(broken) == ["low", "nomodel", "unparsed"]
        assert broken["low"].startswith(f"{low}: port: 80 is below ")
        assert f"user {engine_user.pw_name}, which runs the engine" in broken["low"]
        assert "'absent.gguf' is in none of model_dirs" in broken["nomodel"]
        assert "ctx: must be an integer" in broken["unparsed"]
        # the ones that parse keep their object, whose plan fails with the same reason
        preset = await running.iface(path_of("low"), PRESET_INTERFACE)
        with pytest.raises(DBusError) as e:
            await preset.call_plan()
        assert e.value.text == broken["low"]
        # lokictl presets: broken, not "inactive", with the reason
        rows = {r["Name"]: r for r in json.loads(await lokictl(bus_address, "presets",
                                                               "--json"))}
        assert {n: r["State"] for n, r in rows.items()} == {
            "fine": "inactive", "low": "broken", "nomodel": "broken", "unparsed": "broken"}
        assert rows["low"]["Error"] == broken["low"] and "Error" not in rows["fine"]
        text = await lokictl(bus_address, "presets")
        assert [line.split()[:2] for line in text.splitlines()[1:]] == [
            ["fine", "inactive"], ["low", "broken"], ["nomodel", "broken"],
            ["unparsed", "broken"]], text


async def lokictl(address: str, *args: str) -> str:
    """lokictl's output (it exits 0), run beside the daemon in this event loop."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "lokid.ctl", "--address", address, *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    return out.decode()


def _int(value: int) -> Any:
    from dbus_fast import Variant

    return Variant("x", value)
