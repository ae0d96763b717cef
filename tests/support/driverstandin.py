"""The NVIDIA driver's user-space boundary, stood in for by programs compiled here.

No GPU and no NVIDIA driver exist on this machine, so the tests stand in for the
driver where it meets everything else, never inside lokid's process:

- ``libnvidia-ml.so.1`` (``driver/libnvidia-ml.c``): the NVML functions pynvml
  calls, over a devices file the test writes, failing as the real library does when
  ``/dev/nvidiactl`` or ``/dev/nvidiaN`` cannot be opened (absent, refused by mode,
  refused by the device cgroup). The real pynvml (PyPI's nvidia-ml-py here, Debian's
  python3-pynvml in the containers) loads it by name, in whatever process asks.
- ``nvidia-modprobe`` (``driver/nvidia-modprobe.c``): makes the device nodes when it
  runs as root, and fails otherwise, logging who ran it: the real one's setuid bit
  does nothing under ``NoNewPrivileges=``.
- Device nodes made with ``mknod`` (major 195, as the driver's): opening one with no
  driver behind it gives ENXIO, which the library counts as reachable; a sandbox
  that hides it gives ENOENT, one whose device policy refuses it EPERM.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

SOURCES = Path(__file__).resolve().parent / "driver"
NVIDIA_MAJOR = 195
CTL_MINOR = 255


@dataclass(frozen=True)
class Mig:
    """One MIG instance of a stand-in GPU in MIG mode: its slot under that GPU (NVML's
    index for nvmlDeviceGetMigDeviceHandleByIndex) and what NVML says of it. MiB."""

    slot: int
    uuid: str
    total: int
    used: int = 0
    name: str = "NVIDIA H100 80GB HBM3 MIG 1g.10gb"
    processes: tuple[tuple[int, int], ...] = ()   # (pid, MiB)


@dataclass(frozen=True)
class Gpu:
    """One stand-in GPU: what NVML will say of it. Sizes in MiB."""

    minor: int
    total: int
    reserved: int = 0
    used: int = 0           # by processes (NVML v2's "used"; v1 adds the reserve)
    name: str = "NVIDIA H100 80GB HBM3"
    uuid: str = ""
    processes: tuple[tuple[int, int], ...] = ()   # (pid, MiB)
    mig: bool = False
    migs: tuple[Mig, ...] = ()   # its MIG instances (with mig=True)

    def uuid_text(self) -> str:
        return self.uuid or f"GPU-5f0c{self.minor:04x}-1111-2222-3333-4444{self.minor:08x}"


def devices_text(gpus: Sequence[Gpu]) -> str:
    """The stand-in library's devices file for ``gpus`` (its format: driver/libnvidia-ml.c)."""
    lines = []
    for g in gpus:
        lines.append(f"gpu {g.minor} {g.uuid_text()} {g.total} {g.reserved} {g.used} {g.name}")
    for i, g in enumerate(gpus):
        lines += [f"proc {i} {pid} {mib}" for pid, mib in g.processes]
        if g.mig:
            lines.append(f"mig {i} 1")
        for m in g.migs:
            lines.append(f"migdev {i} {m.slot} {m.uuid} {m.total} {m.used} {m.name}")
            lines += [f"migproc {i} {m.slot} {pid} {mib}" for pid, mib in m.processes]
    return "\n".join(lines) + "\n"


def compiler() -> str | None:
    return shutil.which("cc") or shutil.which("gcc")


def build(dest: Path, *, devices_file: str, dev_dir: str = "/dev",
          modprobe_log: str = "/run/nvidia-modprobe-standin.log") -> tuple[Path, Path]:
    """Compile the stand-in library and nvidia-modprobe into ``dest``: the library reads
    ``devices_file`` and looks for the nodes under ``dev_dir``. Returns their paths."""
    cc = compiler()
    if cc is None:
        raise RuntimeError("no C compiler (cc): apt-get install gcc")
    dest.mkdir(parents=True, exist_ok=True)
    lib, modprobe = dest / "libnvidia-ml.so.1", dest / "nvidia-modprobe"
    defines = [f'-DSTANDIN_FILE="{devices_file}"', f'-DSTANDIN_DEV="{dev_dir}"',
               f'-DSTANDIN_LOG="{modprobe_log}"']
    flags = ["-O2", "-Wall", "-Wextra", "-Werror", *defines]
    for argv in ([cc, *flags, "-shared", "-fPIC", "-Wl,-soname,libnvidia-ml.so.1", "-o",
                  str(lib), str(SOURCES / "libnvidia-ml.c")],
                 [cc, *flags, "-o", str(modprobe), str(SOURCES / "nvidia-modprobe.c")]):
        done = subprocess.run(argv, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed:\n{done.stderr}")
    return lib, modprobe


def make_nodes(dev_dir: Path, minors: Iterable[int], ctl: bool = True) -> list[Path]:
    """``nvidiactl`` and ``nvidia<minor>`` character nodes (major 195) under ``dev_dir``
    (root only: mknod needs CAP_MKNOD)."""
    dev_dir.mkdir(parents=True, exist_ok=True)
    made = []
    for name, minor in ([("nvidiactl", CTL_MINOR)] if ctl else []) + \
            [(f"nvidia{m}", m) for m in minors]:
        path = dev_dir / name
        if not path.exists():
            os.mknod(path, 0o20666, os.makedev(NVIDIA_MAJOR, minor))
            os.chmod(path, 0o666)
        made.append(path)
    return made
