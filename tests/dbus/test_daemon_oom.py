"""Issue 29, item 5: a start that fails out of memory anyway is reported with the
figures, its footprint record is raised, and it is not started again into the same room.

The real engine fails for real: its wrapper limits its address space (``ulimit -v``),
so the KV cache of ``ctx = 1000000`` (488 MiB for the tiny model) cannot be allocated,
and llama-server b11434 prints, as it does on a host out of RAM::

    E ggml_backend_cpu_buffer_type_alloc_buffer: failed to allocate buffer of size 512098304
    E ggml_backend_buft_alloc_buffer_n_default: failed to allocate CPU buffer of size 512098304

The daemon reads those lines (its local runner's pipe), raises the record to what the
host had free at the start (bounded, the first time, by ``[placement] host_memory``),
cancels the local runner's restart, and at the second failure at that bound the preset
never fits: ``StartForRequest`` refuses it with the figures.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

import pytest
from dbus_fast import DBusError
from support.daemonkit import Running
from support.enginekit import free_port, write_config, write_preset

from lokid.core.names import MANAGER_INTERFACE, OBJECT_PATH, PRESET_INTERFACE, preset_object_path
from lokid.core.place.footprint import OOM
from lokid.core.place.policy import size_text
from lokid.host.buscall import plain
from lokid.store.state import StateDB

pytestmark = [pytest.mark.engine, pytest.mark.slow]

GiB, MiB = 2**30, 2**20
LIMIT_KIB = 600_000   # the engine and its model fit; a 488 MiB KV cache does not


@pytest.fixture
def config(tmp_path: Path, engine: str, models: Any) -> Path:
    wrapper = tmp_path / "bin" / "llama-server"
    wrapper.parent.mkdir()
    wrapper.write_text(f"#!/bin/sh\nulimit -v {LIMIT_KIB}\nexec {engine} \"$@\"\n")
    wrapper.chmod(0o755)
    assert Path(models.llama).name == "llama.gguf"   # written on first use
    config = write_config(tmp_path, str(wrapper), [models.dir])
    toml = config / "lokid.toml"
    toml.write_text(toml.read_text() + '[placement]\nhost_memory = "2G"\n')
    write_preset(config, "big", f'model = "llama.gguf"\nctx = 1000000\nport = {free_port()}\n'
                 'extra_args = ["-np", "1"]\n')
    return config


async def until(check: Any, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.1)
    return found


async def test_an_out_of_memory_start_raises_the_record_and_is_not_retried(
        running: Running, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="lokid.daemon")
    manager = await running.iface(OBJECT_PATH, MANAGER_INTERFACE)
    preset = await running.iface(preset_object_path("big"), PRESET_INTERFACE)
    view = running.daemon.registry.presets["big"]
    assert view.plan is not None, view.error
    await until(lambda: running.daemon.telemetry.room.room is not None, 20)
    before = plain(await preset.get_memory())
    assert before["sources"] == {"host": "estimate"}
    estimated = before["needs"]["host"]
    assert 488 * MiB < estimated < 2 * GiB and "does_not_fit" not in before
    registry = running.daemon.registry

    def raised() -> Any:
        f = registry.presets["big"].footprint
        return f if f is not None and f.sources.get("host") == OOM else None

    await manager.call_start_preset("big")
    first = await until(raised)
    # the lower bound is what the host had free at the start (2 GiB, host_memory's
    # bound) and more, bounded by what it can hold: the whole 2 GiB
    assert first.held["host"] == 2 * GiB
    with StateDB(str(tmp_path / "state")) as db:
        assert db.footprint("big", registry.presets["big"].memory_key) == first
    warning = next(r.getMessage() for r in caplog.records
                   if "failed out of memory" in r.getMessage())
    assert "host: an allocation of 488 MiB failed, 2.0 GiB was free when it began; its " \
        f"need there is raised from {size_text(estimated)} to 2.0 GiB (all the device " \
        "can hold)" in warning
    # the local runner's restart is cancelled: it stops instead of failing five times
    await running.wait_event("big", "inactive")
    assert any("its automatic restart is cancelled" in r.getMessage() for r in caplog.records)
    memory = plain(await preset.get_memory())
    assert memory["needs"]["host"] == 2 * GiB and memory["sources"]["host"] == OOM
    assert "raised after a start that failed out of memory" in memory["text"]
    assert "does_not_fit" not in memory   # all the host: placement evicts the rest first
    # the operator tries again with all the room: the same failure makes it never fit
    seen = len(running.events)
    await manager.call_start_preset("big")
    await until(lambda: (f := registry.presets["big"].footprint) is not None
                and f.held["host"] > 2 * GiB)
    await running.wait_event("big", "inactive", after=seen)
    memory = plain(await preset.get_memory())
    deadline = time.monotonic() + 20
    while "does_not_fit" not in memory:
        assert time.monotonic() < deadline, memory
        await asyncio.sleep(0.2)
        memory = plain(await preset.get_memory())
    assert memory["does_not_fit"] == "needs 2.2 GiB on host; it has 2.0 GiB"
    with pytest.raises(DBusError) as e:
        await manager.call_start_for_request("big")
    assert e.value.type == "org.lokid.Lokid1.Error.InvalidPreset"
    assert any("it can never fit on this host as it is" in r.getMessage()
               for r in caplog.records)
    assert "needs 2.2 GiB on host; it has 2.0 GiB: it is not started" in e.value.text


async def test_a_unit_the_kernel_killed_for_memory_raises_the_host_figure(
        running: Running, caplog: pytest.LogCaptureFixture) -> None:
    """systemd's Result=oom-kill (the engine's cgroup hit MemoryMax=): the engine printed
    nothing, the kernel killed it. Here the states come as the systemd runner reports
    them (lokid.runners.runner.unit_state for failed/oom-kill, then the restart's pause):
    this machine's containers have no memory controller to make the kernel do it."""
    from lokid.runners.runner import EngineState, unit_state

    caplog.set_level(logging.INFO, logger="lokid.daemon")
    telemetry = running.daemon.telemetry
    await until(lambda: telemetry.room.room is not None, 20)
    footprints = telemetry.footprints
    footprints.on_state("big", EngineState(*_state(unit_state("activating", "start"))))
    footprints.on_state("big", EngineState(*_state(unit_state("failed", "failed",
                                                                "oom-kill"))))
    registry = running.daemon.registry
    found = await until(lambda: (f := registry.presets["big"].footprint) is not None
                        and f.sources.get("host") == OOM and f)
    assert found.held["host"] == 2 * GiB   # what was free at its start, bounded
    assert any("host: the kernel killed it for memory (oom-kill)" in r.getMessage()
               for r in caplog.records)


def _state(pair: tuple[str, str]) -> tuple[str, str, str]:
    state, detail = pair
    return state, "", detail
