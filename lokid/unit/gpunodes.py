"""``lokid gpu-nodes``: the NVIDIA driver's modules and device nodes, made once at boot by
``loki-gpu-nodes.service`` (root, before lokid.service and every engine).

Why a step of its own (issue 44, item 2): Debian's driver packages make no
``/dev/nvidia*`` node at boot (their udev rule only sets ACLs, and ``nvidia-load.conf``
loads ``nvidia-drm``, not ``nvidia-uvm``). The driver's libraries make them on first
use through the setuid-root ``nvidia-modprobe``; but an engine runs as loki with
``NoNewPrivileges=yes`` and ``ProtectKernelModules=yes``, so there the helper stays
loki, makes nothing, and the first CUDA engine after a reboot falls back to the CPU
(10 to 100 times slower, and active all the same). Giving the engine privileges would
give them to llama-server too; instead this step runs as root once, with nothing but
``nvidia-modprobe`` (the driver's own tool, no shell, no module name of ours), and
every engine and the daemon are ordered after it.

What it asks ``nvidia-modprobe`` for (its options as NVIDIA/nvidia-modprobe reads them):
the driver and ``/dev/nvidiactl`` (``-c=255``, the control node's minor), one
``/dev/nvidiaN`` per GPU the driver lists (``-c=N``, the minors from
``/proc/driver/nvidia/gpus/*/information``), and ``nvidia-uvm`` with its two nodes
(``-u -c=0 -c=1``, which CUDA needs and NVML does not). Each outcome is said in one
line; the step fails (and ``systemctl --failed`` shows it) only when the driver's tool
failed, never when the host has no NVIDIA GPU (then the unit's condition keeps it from
running at all).
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Callable, Sequence

MODPROBE = "/usr/bin/nvidia-modprobe"
GPUS_DIR = "/proc/driver/nvidia/gpus"
TIMEOUT = 60.0     # loading a module takes seconds on a large host
MAX_GPUS = 64

_MINOR = re.compile(r"^Device Minor:\s*(\d{1,3})\s*$", re.M)


def minors(gpus_dir: str = GPUS_DIR) -> list[int]:
    """The device minors the driver gives its GPUs (``Device Minor:`` of each GPU's
    ``information``), sorted; [] when the driver is not loaded (the directory is absent)."""
    found: set[int] = set()
    try:
        entries = sorted(os.listdir(gpus_dir))[:MAX_GPUS]
    except OSError:
        return []
    for entry in entries:
        try:
            with open(os.path.join(gpus_dir, entry, "information"), "rb") as f:
                text = f.read(1 << 14).decode("utf-8", "replace")
        except OSError:
            continue
        m = _MINOR.search(text)
        if m and int(m[1]) < 255:
            found.add(int(m[1]))
    return sorted(found)


def calls(found: Sequence[int]) -> list[list[str]]:
    """The ``nvidia-modprobe`` argument lists, in order: the driver and its control node
    first (it loads the module, after which the GPUs are listed), then each GPU's node,
    then the unified memory module and its nodes."""
    return [["-c=255"], *([f"-c={m}"] for m in found), ["-u", "-c=0", "-c=1"]]


def run(modprobe: str = MODPROBE, gpus_dir: str = GPUS_DIR,
        say: Callable[[str], None] = print, dev: str = "/dev") -> int:
    """Make the nodes; 0 when every call succeeded, 1 otherwise (each failure said)."""
    if not os.path.exists(modprobe):
        say(f"{modprobe} is not installed: no NVIDIA driver's nodes to make")
        return 0

    def call(args: list[str]) -> bool:
        try:
            done = subprocess.run([modprobe, *args], capture_output=True, timeout=TIMEOUT,
                                  stdin=subprocess.DEVNULL, check=False)
        except (OSError, subprocess.SubprocessError) as e:
            say(f"{modprobe} {' '.join(args)} failed: {type(e).__name__}: {e}")
            return False
        if done.returncode != 0:
            out = (done.stderr or done.stdout).decode("utf-8", "replace").strip()[-300:]
            say(f"{modprobe} {' '.join(args)} exited {done.returncode}"
                + (f": {out}" if out else ""))
            return False
        return True

    ok = call(calls([])[0])
    found = minors(gpus_dir)
    for args in calls(found)[1:]:
        ok = call(args) and ok
    nodes = sorted(n for n in os.listdir(dev) if n.startswith("nvidia"))
    say(f"the NVIDIA driver lists {len(found)} GPU(s) (minors {found or 'none'}); "
        f"device nodes now: {', '.join(os.path.join(dev, n) for n in nodes) or 'none'}")
    return 0 if ok else 1
