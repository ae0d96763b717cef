"""One GPU numbering where NVML cannot answer (issue 44, item 4): the engine's
``--list-devices``, which lokid reads for the room then, is read in the order lokid gives
its engines (``CUDA_DEVICE_ORDER=PCI_BUS_ID``), so ``GPU0`` in Devices and Memory is the
card an engine with ``CUDA_VISIBLE_DEVICES=0`` gets.

No CUDA build runs here, so the engine is stood in for at its own boundary: an
executable at the engine's path that answers ``--version`` and ``--help`` with the real
b11434 texts (tests/data/engine) and ``--list-devices`` as CUDA does on a host of an A10
(PCI bus 01) and an H200 (bus 41): fastest first (the H200 as CUDA0) unless
``CUDA_DEVICE_ORDER=PCI_BUS_ID`` (the A10 as CUDA0), in llama.cpp's own line format.
A ``libggml-cuda.so`` beside it says "a CUDA build" the way lokid reads it (the names of
the libraries).
"""

from __future__ import annotations

import os
import stat
import types
from pathlib import Path
from typing import Any

from support.engine_data import DATA
from support.enginekit import write_config, write_preset

from lokid.host.nvml import GpuMemory
from lokid.planning.sizing import memory_now
from lokid.unit import planview

A10 = "NVIDIA A10 (23028 MiB, 22700 MiB free)"
H200 = "NVIDIA H200 (143155 MiB, 142629 MiB free)"
STANDIN = f"""#!/bin/sh
case "$1" in
--version) exec cat "{DATA / 'b11434-version.txt'}" ;;
--help) exec cat "{DATA / 'b11434-help.txt'}" ;;
--list-devices)
    echo "Available devices:"
    if [ "$CUDA_DEVICE_ORDER" = PCI_BUS_ID ]; then
        echo "  CUDA0: {A10}"; echo "  CUDA1: {H200}"
    else
        echo "  CUDA0: {H200}"; echo "  CUDA1: {A10}"
    fi ;;
*) exit 1 ;;
esac
"""


def no_driver() -> GpuMemory:
    def missing() -> types.ModuleType:
        raise ImportError("No module named 'pynvml'")

    return GpuMemory(missing)


def test_the_engines_device_list_is_read_in_nvmls_order(tmp_path: Path, models: Any) -> None:
    bin_dir = tmp_path / "engine"
    bin_dir.mkdir()
    engine = bin_dir / "llama-server"
    engine.write_text(STANDIN)
    engine.chmod(engine.stat().st_mode | stat.S_IXUSR)
    for lib in ("libggml-base.so", "libggml-cpu.so", "libggml-cuda.so"):
        (bin_dir / lib).write_bytes(b"")
    config = write_config(tmp_path, str(engine), [Path(models.llama).parent])
    write_preset(config, "first", f'model = "{Path(models.llama).name}"\ngpus = [0]\n')
    state, run = tmp_path / "state", tmp_path / "run"
    os.makedirs(run)
    plan, inputs = planview.plan_inputs_now(str(config), str(state), str(run), "first", {})
    assert inputs.caps.gpu_backends == ("cuda",)
    # the engine gets GPU0 in PCI bus order ...
    assert plan.env == {"CUDA_VISIBLE_DEVICES": "0", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    # ... and lokid's room names that card GPU0 too
    memory, room = memory_now(plan, inputs, str(state), no_driver(), gpu_engine=True)
    assert room.names == {"GPU0": "NVIDIA A10", "GPU1": "NVIDIA H200"}, room.sources
    assert "GPU0" in memory.sizing.need.fixed and "GPU1" not in memory.sizing.need.fixed
