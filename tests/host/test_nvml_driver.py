"""lokid.host.nvml and read_room through the real pynvml and a compiled stand-in driver.

The stand-in ``libnvidia-ml.so.1`` (tests/support/driverstandin.py) is loaded by the
real bindings (PyPI's nvidia-ml-py, a test dependency) in a child process, as the
daemon loads the driver's own library: what the child may open under the device
directory decides what NVML answers. The device nodes are real character nodes
(major 195, made with mknod) with no driver behind them. The same library under the
real units, with Debian's python3-pynvml, is tested in the container
(tests/packaging/test_deb_gpu.py).
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

import pytest
from support import REPO
from support.driverstandin import Gpu, build, compiler, devices_text, make_nodes

pytestmark = pytest.mark.skipif(compiler() is None or os.geteuid() != 0,
                                reason="needs a C compiler and root (mknod)")

CHILD = """
import json, sys
from lokid.core.place.settings import PlacementConfig
from lokid.host.devices import read_room
from lokid.host.nvml import GpuMemory
gpu = GpuMemory()
room = read_room(PlacementConfig(), engine=None, gpu_engine=True, gpu=gpu)
print(json.dumps({"why": gpu.why_unknown(), "used": gpu.used([int(a) for a in sys.argv[1:]]),
                  "devices": [[d.name, d.total, d.others] for d in room.devices],
                  "free": dict(room.free), "names": dict(room.names),
                  "sources": dict(room.sources), "notes": list(room.notes)}))
"""

MIB = 1 << 20


@pytest.fixture
def driver() -> Iterator[Path]:
    # world-readable: one test runs its child as nobody
    top = Path(tempfile.mkdtemp(prefix="lokid-nvml-"))
    try:
        top.chmod(0o755)
        build(top / "lib", devices_file=str(top / "devices"), dev_dir=str(top / "dev"))
        yield top
    finally:
        shutil.rmtree(top, ignore_errors=True)


def ask(top: Path, pids: tuple[int, ...] = (), user: str | None = None) -> dict[str, object]:
    env = {**os.environ, "LD_LIBRARY_PATH": str(top / "lib"), "PYTHONPATH": str(REPO)}
    argv = [sys.executable, "-c", CHILD, *map(str, pids)]
    if user is not None:
        argv = ["setpriv", "--reuid", user, "--regid", "nogroup", "--clear-groups", *argv]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout)
    return result


def test_an_idle_gpu_holds_nothing_of_others_the_drivers_reserve_is_no_ones_room(
        driver: Path) -> None:
    """NVML v1 counts the driver's reserve in "used": an idle H100 showed 512 MiB "held by
    other processes". Read as nvidia-smi reads it (v2), the reserve is out of the total."""
    (driver / "devices").write_text(devices_text([
        Gpu(0, total=81559, reserved=512),
        Gpu(1, total=81559, reserved=512, used=4000, processes=((4242, 3000), (77, 1000)))]))
    make_nodes(driver / "dev", [0, 1])
    seen = ask(driver, (4242,))
    assert seen["why"] == "", seen
    devices = {name: (total, others) for name, total, others in seen["devices"]}  # type: ignore
    assert devices["GPU0"] == ((81559 - 512) * MIB, 0)
    assert devices["GPU1"] == ((81559 - 512) * MIB, 4000 * MIB)
    assert seen["free"]["GPU0"] == (81559 - 512) * MIB  # type: ignore[index]
    assert seen["free"]["GPU1"] == (81559 - 512 - 4000) * MIB  # type: ignore[index]
    assert seen["names"] == {"GPU0": "NVIDIA H100 80GB HBM3", "GPU1": "NVIDIA H100 80GB HBM3"}
    assert "512 MiB reserved by the driver" in seen["sources"]["GPU0"]  # type: ignore[index]
    assert seen["used"] == {"GPU1 process": 3000.0}


def test_no_device_node_is_a_driver_not_loaded_said_in_words(driver: Path) -> None:
    (driver / "devices").write_text(devices_text([Gpu(0, total=81559)]))
    seen = ask(driver)   # no /dev/nvidiactl: a host without nodes, or a sandbox hiding them
    assert seen["used"] is None
    assert str(seen["why"]).startswith(
        "the NVIDIA driver did not answer (NVML: Driver Not Loaded): no NVIDIA driver is "
        "loaded, or this process cannot see its device nodes (/dev/nvidiactl)"), seen
    assert [d[0] for d in seen["devices"]] == ["host"]  # type: ignore[union-attr]


def test_one_gpu_refused_is_that_gpu_unknown_and_the_others_are_read(driver: Path) -> None:
    """A node the process may not open (its mode here; a unit's DeviceAllow= alike) used
    to make every GPU vanish: the whole read failed on the first refusal."""
    (driver / "devices").write_text(devices_text([Gpu(0, total=24000, used=100),
                                                  Gpu(1, total=24000)]))
    make_nodes(driver / "dev", [0, 1])
    (driver / "dev" / "nvidia1").chmod(0o600)    # root's: nobody may not open it
    seen = ask(driver, user="nobody")
    assert [d[0] for d in seen["devices"]] == ["GPU0", "host"], seen  # type: ignore
    assert any(n.startswith("the NVIDIA driver refused GPU1 (NVML: Insufficient Permissions): "
                            "this process may not open the GPU's device node")
               for n in seen["notes"]), seen  # type: ignore[union-attr]
    (driver / "dev" / "nvidiactl").chmod(0o600)  # the control node itself: nothing answers
    seen = ask(driver, user="nobody")
    assert "Insufficient Permissions" in str(seen["why"]), seen


ENGINE_SAYS_NONE = """
import json
from lokid.core.place.settings import PlacementConfig
from lokid.host.devices import read_room
from lokid.host.nvml import GpuMemory
room = read_room(PlacementConfig(), engine="llama-server", gpu_engine=True, gpu=GpuMemory(),
                 lister=lambda engine: ({}, ""))
print(json.dumps({"unknown": dict(room.unknown), "notes": list(room.notes)}))
"""


def test_an_engine_that_lists_no_gpu_where_the_driver_is_down_leaves_them_unknown(
        driver: Path) -> None:
    """Issue 44, item 10, as the walk of a GPU host showed it: the driver's library is
    installed, the driver did not answer (no /dev/nvidiactl), and the engine, which needs
    the same driver, lists no GPU: the GPUs are unknown, not absent (a preset pinned to
    GPU1 was refused "which this host does not have")."""
    (driver / "devices").write_text(devices_text([Gpu(0, total=24000)]))
    env = {**os.environ, "LD_LIBRARY_PATH": str(driver / "lib"), "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", ENGINE_SAYS_NONE], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert list(seen["unknown"]) == ["GPU*"], seen
    assert seen["unknown"]["GPU*"].startswith(
        "the NVIDIA driver did not answer (NVML: Driver Not Loaded)"), seen
    assert seen["unknown"]["GPU*"].endswith("and llama-server --list-devices lists none "
                                            "without it"), seen
    # without the driver's library at all, an empty list is an answer: no GPU here
    env["LD_LIBRARY_PATH"] = str(driver / "nothing")
    done = subprocess.run([sys.executable, "-c", ENGINE_SAYS_NONE], env=env,
                          capture_output=True, text=True, timeout=60)
    assert json.loads(done.stdout)["unknown"] == {}, done.stdout
