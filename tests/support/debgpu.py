"""A GPU host as far as this machine allows: a booted Debian container with lokid's .deb,
Debian's python3-pynvml and the stand-in NVIDIA driver installed by apt
(tests/packaging/test_deb_gpu.py, scripts/walk_gpu.py). Not to be confused with
tests/support/gpuhost.py (a GPU host for one process, on this machine).

The stand-in driver (tests/support/driverstandin.py) is packaged as what Debian's
driver packages provide (``libnvidia-ml.so.1``, on which python3-pynvml depends, and the
setuid ``nvidia-modprobe``), so apt resolves it as it would the real one. The driver's
``/proc/driver/nvidia/gpus`` listing, which a container cannot fake under the kernel's
own /proc, is written elsewhere and given to loki-gpu-nodes.service by a drop-in
(LOKI_NVIDIA_GPUS_DIR). The engine is the real CPU build of b11434, in a copy beside
which an empty ``libggml-cuda.so`` makes lokid count it as a GPU engine (lokid reads an
engine's backends from the library files beside it): it runs on the CPU, and the GPU
figures are the stand-in driver's.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .debpkg import Build, runtime_packages
from .driverstandin import Gpu, build, devices_text
from .enginekit import engine_binary
from .systemd_harness import Container

SUITE = "trixie"
BUS = "org.lokid.Lokid1"
MANAGER = "org.lokid.Lokid1.Manager"
DEVICES_FILE = "/etc/nvml-standin/devices"
GPUS_DIR = "/srv/driver/gpus"
ENGINE = "/opt/cuda-engine"
MODEL_DIR = "/srv/models"
MODPROBE_LOG = "/run/nvidia-modprobe-standin.log"
MIB = 1 << 20


def multiarch() -> str:
    return subprocess.run(["gcc", "-print-multiarch"], capture_output=True, text=True,
                          check=True).stdout.strip() or "x86_64-linux-gnu"


def driver_deb(top: Path) -> Path:
    """The stand-in driver as a package ``nvidia-driver-standin``, built into ``top``."""
    lib, modprobe = build(top / "bin", devices_file=DEVICES_FILE, modprobe_log=MODPROBE_LOG)
    root = top / "root"
    libdir = root / "usr" / "lib" / multiarch()
    (root / "DEBIAN").mkdir(parents=True)
    libdir.mkdir(parents=True)
    (root / "usr" / "bin").mkdir(parents=True)
    shutil.copy(lib, libdir / "libnvidia-ml.so.1")
    shutil.copy(modprobe, root / "usr" / "bin" / "nvidia-modprobe")
    os.chmod(root / "usr" / "bin" / "nvidia-modprobe", 0o4755)
    arch = subprocess.run(["dpkg", "--print-architecture"], capture_output=True, text=True,
                          check=True).stdout.strip()
    (root / "DEBIAN" / "control").write_text(
        "Package: nvidia-driver-standin\nVersion: 1.0\nArchitecture: " + arch + "\n"
        "Maintainer: lokid tests <tests@lokid.invalid>\n"
        "Provides: libnvidia-ml.so.1, libnvidia-ml1, nvidia-modprobe\n"
        "Description: stand-in for the NVIDIA driver's NVML and nvidia-modprobe (tests)\n")
    deb = top / "nvidia-driver-standin_1.0.deb"
    subprocess.run(["dpkg-deb", "--root-owner-group", "--build", str(root), str(deb)],
                   check=True, capture_output=True)
    return deb


def apt(ct: Container, *args: str) -> str:
    r = ct.run(["apt-get", "-q", "-y", *args], check=False, timeout=900,
               env={"DEBIAN_FRONTEND": "noninteractive"})
    if r.returncode != 0:
        raise RuntimeError(f"apt-get {' '.join(args)}:\n{r.stdout[-4000:]}\n{r.stderr}")
    return r.stdout + r.stderr


def write_gpus(ct: Container, gpus: Sequence[Gpu]) -> None:
    """The stand-in library's devices, and the driver's ``information`` file per GPU (as
    the driver formats it) where loki-gpu-nodes.service is told to read the listing."""
    ct.write_file(DEVICES_FILE, devices_text(gpus))
    for g in gpus:
        bus = f"0000:{0x17 + g.minor:02x}:00.0"
        ct.write_file(f"{GPUS_DIR}/{bus}/information",
                      f"Model: \t\t {g.name}\nIRQ:   \t\t 180\nGPU UUID: \t {g.uuid_text()}\n"
                      f"Video BIOS: \t 95.04.52.00.03\nBus Type: \t PCIe\n"
                      f"DMA Size: \t 52 bits\nDMA Mask: \t 0xfffffffffffff\n"
                      f"Bus Location: \t {bus}\nDevice Minor: \t {g.minor}\n"
                      f"GPU Excluded:\t No\n")


def boot(b: Build, deb: Path, gpus: Sequence[Gpu], models: dict[str, Path]) -> Container:
    """A booted container of :data:`SUITE` with the driver, python3-pynvml and lokid
    installed by apt, ``models`` (name → file) in :data:`MODEL_DIR`, the engine copy at
    :data:`ENGINE`. The caller stops it."""
    binds = {"/debs": str(b.deb.parent), "/driver": str(deb.parent),
             "/opt/engine": os.path.dirname(engine_binary())}
    ct = Container(suite=SUITE, packages=runtime_packages(SUITE), binds=binds)
    ct.start()
    try:
        ct.write_file("/etc/apt/sources.list.d/contrib.list",
                      f"deb http://deb.debian.org/debian {SUITE} contrib\n")
        write_gpus(ct, gpus)
        ct.write_file("/etc/systemd/system/loki-gpu-nodes.service.d/driver-listing.conf",
                      f"[Service]\nEnvironment=LOKI_NVIDIA_GPUS_DIR={GPUS_DIR}\n")
        ct.run(["cp", "-a", "/opt/engine", ENGINE])
        ct.run(["touch", f"{ENGINE}/libggml-cuda.so"])
        for name, path in models.items():
            ct.write_file(f"{MODEL_DIR}/{name}", path.read_bytes())
        apt(ct, "update")
        apt(ct, "install", f"/driver/{deb.name}")
        apt(ct, "install", "python3-pynvml", f"/debs/{b.deb.name}")
    except BaseException:
        ct.stop()
        raise
    return ct


def nodes(ct: Container) -> list[str]:
    out = ct.run(["sh", "-c", "ls /dev | grep '^nvidia' || true"]).stdout
    return sorted(out.split())


def devices(ct: Container) -> dict[str, dict[str, Any]]:
    """The daemon's Devices property, device → its row."""
    out = ct.run(["busctl", "--json=short", "get-property", BUS, "/org/lokid/Lokid1",
                  MANAGER, "Devices"]).stdout
    rows = json.loads(out)["data"]
    return {r["device"]["data"]: {k: v["data"] for k, v in r.items()} for r in rows}


def wait_devices(ct: Container, want: set[str], timeout: float = 30.0
                 ) -> dict[str, dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while True:
        seen = devices(ct)
        if want <= set(seen) or time.monotonic() > deadline:
            return seen
        time.sleep(0.5)
