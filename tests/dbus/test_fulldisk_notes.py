"""A full state directory is said only where it matters, and no longer once it is freed
(issue 45, item 11): the daemon on a private bus with the real engine, its state
directory a real tmpfs that fills.

Reproduced before: with the disk full every preset, spec off included, had
AutoSpecBlocked "the state database … cannot be written (No space left on device), and
automatic speculation needs its attempt token", and kept it after the space was freed;
``lokictl bench`` printed only the database's error. Now only a preset whose plan adds
automatic speculation (its attempt token needs the database) says so; the benchmark is
shown, with why it is not stored; and the first write that succeeds again (here the
benchmark's, stored once there is room) has every preset planned again, the note gone.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.daemonkit import Running
from support.enginekit import free_port, write_config, write_preset
from support.smallfs import fill, small_tmpfs

from lokid.core.names import MANAGER_INTERFACE, OBJECT_PATH, PRESET_INTERFACE, preset_object_path

pytestmark = [pytest.mark.engine, pytest.mark.slow]

FULL = "cannot be written (No space left on device)"


@pytest.fixture
def state_fs(tmp_path: Path) -> Iterator[Path]:
    """The daemon's state directory (``daemon_on``'s ``root/state``), a 1 MiB tmpfs."""
    with small_tmpfs(tmp_path / "state") as fs:
        yield fs


@pytest.fixture
def config(tmp_path: Path, engine: str, models: Any, state_fs: Path) -> Path:
    config = write_config(tmp_path, engine, [models.dir])
    assert Path(models.llama).name == "llama.gguf"  # written on first use
    write_preset(config, "plain", f'model = "llama.gguf"\nctx = 2048\nport = {free_port()}\n'
                 '[spec]\nmode = "off"\n')
    write_preset(config, "ngram", f'model = "llama.gguf"\nctx = 2048\nport = {free_port()}\n'
                 '[spec]\nmode = "ngram"\n')
    write_preset(config, "mtp", f'model = "{models.mtp_full}"\nctx = 2048\n'
                 f'port = {free_port()}\n[spec]\nmode = "auto"\n')
    return config


async def blocked(running: Running) -> dict[str, str]:
    out = {}
    for name in ("plain", "ngram", "mtp"):
        preset = await running.iface(preset_object_path(name), PRESET_INTERFACE)
        out[name] = await preset.get_auto_spec_blocked()
    return out


async def lokictl(address: str, *args: str) -> tuple[int, str, str]:
    """lokictl as its own process (the daemon runs in this event loop: never blocked)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "lokid.ctl", "--address", address, *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 300)
    return proc.returncode or 0, out.decode(), err.decode()


async def test_a_full_disk_is_said_only_where_it_cuts_and_not_after_it_is_freed(
        running: Running, state_fs: Path, bus_address: str) -> None:
    manager = await running.iface(OBJECT_PATH, MANAGER_INTERFACE)
    assert await blocked(running) == {"plain": "", "ngram": "", "mtp": ""}

    filler = fill(state_fs)
    await manager.call_reload()
    now = await blocked(running)
    assert now["plain"] == "" and now["ngram"] == "", now   # no automatic flags to cut
    assert FULL in now["mtp"] and "needs its attempt token" in now["mtp"], now

    # lokictl bench: the measurement shown, and that it could not be stored
    await manager.call_start_preset("plain")
    await running.wait_event("plain", "ready")
    bench = ("bench", "plain", "--prompt", "300", "--predict", "16")
    rc, out, err = await lokictl(bus_address, *bench)
    assert rc == 0 and "  Prefill " in out and "  Decode " in out, (out, err)
    assert "(not saved: it could not be stored: the state database" in out, out
    assert FULL in out, out

    filler.unlink()
    rc, out, err = await lokictl(bus_address, *bench, "--json")   # stored: a write again
    assert rc == 0 and json.loads(out)["saved"] is True, (out, err)
    deadline = time.monotonic() + 30
    while (now := await blocked(running))["mtp"] and time.monotonic() < deadline:
        await asyncio.sleep(0.2)   # every preset planned again after the bench's refresh
    assert now == {"plain": "", "ngram": "", "mtp": ""}, now
