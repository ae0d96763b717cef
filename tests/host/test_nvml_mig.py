"""GPUs named by UUID and MIG instances (issue 44, item 8), through the real pynvml and
the compiled stand-in driver.

A host of two H100s: GPU0 in MIG mode with two instances (slots 0 and 2 of its seven;
slot 1 empty, as after an instance was destroyed), GPU1 whole. NVML's memory of GPU0 is
the whole card's, of which a process pinned to one instance can use none beyond its
instance: the room is each instance's own, and the whole GPU0 is no room at all. A preset
pinned by ``MIG-…`` or ``GPU-…`` UUID is sized on the device with that UUID, not as "one
GPU to choose" (which placed it on whichever GPU had room).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import REPO
from support.driverstandin import Gpu, Mig, build, compiler, devices_text, make_nodes
from support.enginekit import free_port, write_config, write_preset
from support.gpuplan import cuda_engine, lokid_plan

pytestmark = pytest.mark.skipif(compiler() is None or os.geteuid() != 0,
                                reason="needs a C compiler and root (mknod)")

MIB = 1 << 20
SMALL = "MIG-0b5f0a9e-1f3c-5a77-9d1e-2c4b6a8d0e11"    # 8 MiB: too small for the model
LARGE = "MIG-7c1d2e3f-4a5b-5c6d-8e9f-0a1b2c3d4e5f"    # 19968 MiB
WHOLE = "GPU-5f0c0001-1111-2222-3333-444400000001"     # GPU1, no MIG
HOST = [
    Gpu(0, total=81559, reserved=512, used=600, uuid="GPU-5f0c0000-1111-2222-3333-444400000000",
        mig=True, migs=(
            Mig(0, SMALL, total=8, used=1, name="NVIDIA H100 80GB HBM3 MIG 1g.10gb"),
            Mig(2, LARGE, total=19968, used=500, name="NVIDIA H100 80GB HBM3 MIG 2g.20gb",
                processes=((4242, 500),)))),
    Gpu(1, total=81559, reserved=512, uuid=WHOLE),
]

CHILD = """
import json, sys
from lokid.core.place.settings import PlacementConfig
from lokid.host.devices import read_room
from lokid.host.nvml import GpuMemory
gpu = GpuMemory()
room = read_room(PlacementConfig(), engine=None, gpu_engine=True, gpu=gpu)
print(json.dumps({"why": gpu.why_unknown(), "used": gpu.used([4242]),
                  "devices": [[d.name, d.total, d.others] for d in room.devices],
                  "free": dict(room.free), "names": dict(room.names),
                  "uuids": dict(getattr(room, "uuids", {})),
                  "unknown": dict(getattr(room, "unknown", {})),
                  "notes": list(room.notes)}))
"""


@pytest.fixture
def top() -> Iterator[Path]:
    top = Path(tempfile.mkdtemp(prefix="lokid-mig-"))
    try:
        build(top / "lib", devices_file=str(top / "devices"), dev_dir=str(top / "dev"))
        (top / "devices").write_text(devices_text(HOST))
        make_nodes(top / "dev", [0, 1])
        os.makedirs(top / "run")
        yield top
    finally:
        shutil.rmtree(top, ignore_errors=True)


def test_a_mig_gpus_room_is_each_instances_own(top: Path) -> None:
    env = {**os.environ, "LD_LIBRARY_PATH": str(top / "lib"), "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["why"] == "", seen
    devices = {name: (total, others) for name, total, others in seen["devices"]}
    # GPU0 itself is no room: its instances are, each with its own memory
    assert set(devices) == {"GPU0/MIG0", "GPU0/MIG2", "GPU1", "host"}, seen
    assert devices["GPU0/MIG0"] == (8 * MIB, 1 * MIB)
    assert devices["GPU0/MIG2"] == (19968 * MIB, 500 * MIB)    # pid 4242's ...
    assert seen["free"]["GPU0/MIG2"] == (19968 - 500) * MIB
    assert devices["GPU1"] == ((81559 - 512) * MIB, 0)
    assert seen["names"]["GPU0/MIG2"] == "NVIDIA H100 80GB HBM3 MIG 2g.20gb"
    assert seen["uuids"] == {SMALL: "GPU0/MIG0", LARGE: "GPU0/MIG2", WHOLE: "GPU1",
                             HOST[0].uuid: "GPU0"}
    # ... which the per-process figures book on that instance, not on the whole GPU0
    assert seen["used"] == {"GPU0/MIG2 process": 500.0}
    # a preset pinned to GPU0 by index has no room to be sized on: unknown, said why
    assert "MIG" in seen["unknown"]["GPU0"], seen


def test_a_preset_pinned_by_uuid_is_sized_on_that_device(top: Path, models: Any) -> None:
    config = write_config(top, cuda_engine(top / "engine"), [Path(models.llama).parent])
    model = Path(models.llama).name
    for name, uuid, device in (("large", LARGE, "GPU0/MIG2"), ("whole", WHOLE, "GPU1")):
        write_preset(config, name, f'model = "{model}"\ngpus = "{uuid}"\nport = {free_port()}\n')
        r = lokid_plan(config, name, top / "lib")
        assert r.returncode == 0, r.stderr
        memory = next(line for line in r.stdout.splitlines() if line.startswith("memory: "))
        assert f" on {device} (estimated)" in memory, memory
        assert "one GPU" not in memory, memory
        data = json.loads(lokid_plan(config, name, top / "lib", "--json").stdout)
        assert device in data["memory"]["needs"] and "gpu_count" not in data["memory"]
    # the small instance cannot hold it: refused with that instance's own figures
    write_preset(config, "small", f'model = "{model}"\ngpus = "{SMALL}"\nport = {free_port()}\n')
    r = lokid_plan(config, "small", top / "lib")
    assert r.returncode == 2, r.stdout
    assert " on GPU0/MIG0; it has 8 MiB" in r.stderr, r.stderr
