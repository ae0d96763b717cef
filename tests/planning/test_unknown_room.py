"""Unknown devices stay unknown (issue 44, item 10): a host whose GPUs could not be read
is no host without GPUs.

The driver cannot answer (the stand-in ``libnvidia-ml.so.1`` through the real pynvml,
with no ``/dev/nvidiactl``: "Driver Not Loaded") and the engine's ``--list-devices``
fails (a CUDA build that cannot start CUDA exits non-zero). ``lokid plan`` of a preset
pinned to GPU1 used to exit 2, "needs 4 MiB on GPU1, which this host does not have",
where the README promises that where the room is unknown nothing waits: it plans, says
that GPU1's room is unknown and why, and refuses nothing.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.driverstandin import Gpu, build, compiler, devices_text
from support.enginekit import write_config, write_preset
from support.gpuplan import cuda_engine, lokid_plan

pytestmark = pytest.mark.skipif(compiler() is None, reason="needs a C compiler")

CUDA_FAILS = ("ggml_cuda_init: failed to initialize CUDA: no CUDA-capable device is "
              "detected\nAvailable devices:\n")


@pytest.fixture
def top() -> Iterator[Path]:
    top = Path(tempfile.mkdtemp(prefix="lokid-unknown-"))
    try:
        build(top / "lib", devices_file=str(top / "devices"), dev_dir=str(top / "dev"))
        (top / "devices").write_text(devices_text([Gpu(0, total=81559), Gpu(1, total=81559)]))
        os.makedirs(top / "run")
        yield top
    finally:
        shutil.rmtree(top, ignore_errors=True)


def test_a_host_whose_gpus_cannot_be_read_refuses_nothing_and_says_why(
        top: Path, models: Any) -> None:
    engine = cuda_engine(top / "engine", CUDA_FAILS, list_status=1)
    config = write_config(top, engine, [Path(models.llama).parent])
    write_preset(config, "pinned", f'model = "{Path(models.llama).name}"\ngpus = "1"\n')
    r = lokid_plan(config, "pinned", top / "lib")
    assert r.returncode == 0, r.stderr
    assert "which this host does not have" not in r.stdout + r.stderr
    memory = next(line for line in r.stdout.splitlines() if line.startswith("memory: "))
    assert " on GPU1 (estimated)" in memory, memory
    # the room is said to be unknown, with both reasons: the driver's and the engine's
    assert "GPU1's room is unknown" in memory, memory
    assert "Driver Not Loaded" in r.stdout, r.stdout
    assert f"{engine} --list-devices failed: exit status 1" in r.stdout, r.stdout
    assert "failed to initialize CUDA" in r.stdout, r.stdout
    data = json.loads(lokid_plan(config, "pinned", top / "lib", "--json").stdout)
    assert "does_not_fit" not in data["memory"]
    assert set(data["memory"]["room_unknown"]) == {"GPU1"}
    assert "Driver Not Loaded" in data["memory"]["room_unknown"]["GPU1"]
    assert [d["device"] for d in data["devices"]] == ["host"]
