"""scripts/gpu_check.py, the one-shot check for a machine with a real NVIDIA GPU, run here
against the stand-in driver (tests/support/driverstandin.py) so that what it can do
without a GPU is known to work before a GPU machine's minutes are spent on it: its
emulation of lokid.service's device sandbox (a private /dev holding only the nodes the
unit allows, then none) through the real pynvml. Checks that need nvidia-smi or a CUDA
engine say SKIP here, with why.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support import REPO
from support.driverstandin import Gpu, build, compiler, devices_text, make_nodes

pytestmark = pytest.mark.skipif(
    compiler() is None or os.geteuid() != 0 or shutil.which("unshare") is None,
    reason="needs a C compiler, root and unshare (mount namespaces)")


def test_the_sandbox_emulation_reads_the_gpus_with_the_units_nodes_and_none_without(
        tmp_path: Path) -> None:
    dev = tmp_path / "dev"
    build(tmp_path / "lib", devices_file=str(tmp_path / "devices"), dev_dir=str(dev))
    (tmp_path / "devices").write_text(devices_text([Gpu(0, total=81559, reserved=512)]))
    make_nodes(dev, [0])
    out = tmp_path / "out.json"
    env = {**os.environ, "LD_LIBRARY_PATH": str(tmp_path / "lib"),
           "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}   # no nvidia-smi: its check skips
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "gpu_check.py"),
                           "--dev", str(dev), "--json", str(out)], env=env,
                          capture_output=True, text=True, timeout=300)
    results = {r["check"]: r for r in json.loads(out.read_text())}
    assert done.returncode == 0, done.stdout + done.stderr
    assert results["nvml"]["verdict"] == "SKIP"
    assert results["engine"]["verdict"] == "SKIP"
    sandbox = results["sandbox_daemon"]
    assert sandbox["verdict"] == "PASS", sandbox
    assert sandbox["text"].startswith("lokid.service's nodes: 1; none (PrivateDevices"), sandbox
    assert "(NVML: Driver Not Loaded)" in sandbox["text"], sandbox
    # the namespace's /dev was private: the nodes here are as they were
    assert sorted(os.listdir(dev)) == ["nvidia0", "nvidiactl"]
