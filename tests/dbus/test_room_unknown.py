"""The daemon's sight of a host whose GPUs could not be read (issue 44, item 10).

The NVIDIA driver cannot be asked (its Python bindings absent: the import fails, as on a
host without python3-pynvml) and the engine's ``--list-devices`` fails (a CUDA build
that cannot start CUDA exits non-zero): the engine is stood in for at its own boundary
(tests/support/gpuplan.py). A preset pinned to GPU1 used to be "needs … on GPU1, which
this host does not have": refused by ``StartForRequest`` and by the gateway at once. Its
``Memory`` now names GPU1's room unknown, with why, and nothing refuses it. The real
daemon (local runner) on a private dbus-daemon; no engine is started.
"""

from __future__ import annotations

import asyncio
import time
import types
from pathlib import Path
from typing import Any

from support.daemonkit import daemon_on
from support.enginekit import free_port, write_config, write_preset
from support.gpuplan import cuda_engine

from lokid.core.names import MANAGER_INTERFACE, OBJECT_PATH, PRESET_INTERFACE
from lokid.core.names import preset_object_path as path_of
from lokid.dbus.daemon import Daemon
from lokid.host.buscall import plain
from lokid.host.nvml import GpuMemory


def no_bindings() -> types.ModuleType:
    raise ImportError("No module named 'pynvml'")


def without_nvml(daemon: Daemon) -> None:
    daemon.telemetry.gpu = GpuMemory(no_bindings)


async def test_a_gpu_whose_room_is_unknown_is_not_refused(
        tmp_path: Path, models: Any, bus_address: str) -> None:
    engine = cuda_engine(tmp_path / "engine", "Available devices:\n", list_status=1)
    config = write_config(tmp_path, engine, [models.dir])
    write_preset(config, "pinned", f'model = "{Path(models.llama).name}"\ngpus = "1"\n'
                 f'port = {free_port()}\n')
    async with daemon_on(config, tmp_path, bus_address, prepare=without_nvml) as running:
        preset = await running.iface(path_of("pinned"), PRESET_INTERFACE)
        manager = await running.iface(OBJECT_PATH, MANAGER_INTERFACE)
        deadline = time.monotonic() + 30
        while not (devices := plain(await manager.get_devices())) or \
                "room_unknown" not in (memory := plain(await preset.get_memory())):
            assert time.monotonic() < deadline, (devices, plain(await preset.get_memory()))
            await asyncio.sleep(0.1)   # the daemon's first reading, then Memory from it
        assert [d["device"] for d in devices] == ["host"], devices
        assert "does_not_fit" not in memory, memory
        assert "GPU1" in memory["needs"], memory
        assert memory["room_unknown"]["GPU1"].startswith("python3-pynvml is not installed")
        assert "--list-devices failed: exit status 1" in memory["room_unknown"]["GPU1"]
        assert "GPU1's room is unknown" in memory["text"]
        assert await running.daemon.telemetry.room.refusal("pinned") == ""
