"""``lokid plan`` on a GPU host stood in for at its own boundaries, in a child process.

- The NVIDIA driver: the compiled ``libnvidia-ml.so.1`` (:mod:`support.driverstandin`),
  loaded by the real pynvml through ``LD_LIBRARY_PATH``, its device nodes made with
  mknod (or left out: "Driver Not Loaded").
- The engine: an executable at the engine's path that answers ``--version`` and
  ``--help`` with the real b11434 texts (tests/data/engine) and ``--list-devices`` with
  the text and the exit status the test gives; a ``libggml-cuda.so`` beside it says "a
  CUDA build" the way lokid reads it (the names of its libraries).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from support import REPO
from support.engine_data import DATA

NO_ENGINE_USER = {"LOKI_ENGINE_USER": "lokid-test-no-such-user"}


def cuda_engine(dest: Path, list_devices: str = "", list_status: int = 0) -> str:
    """A stand-in CUDA engine in ``dest``: ``--list-devices`` prints ``list_devices``
    (to stderr as well when it fails, where llama.cpp's errors go) and exits
    ``list_status``."""
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "devices.txt").write_text(list_devices)
    engine = dest / "llama-server"
    engine.write_text(f"""#!/bin/sh
case "$1" in
--version) exec cat "{DATA / 'b11434-version.txt'}" ;;
--help) exec cat "{DATA / 'b11434-help.txt'}" ;;
--list-devices) cat "{dest / 'devices.txt'}"
    [ {list_status} = 0 ] || cat "{dest / 'devices.txt'}" >&2
    exit {list_status} ;;
*) exit 1 ;;
esac
""")
    engine.chmod(0o755)
    for lib in ("libggml-base.so", "libggml-cpu.so", "libggml-cuda.so"):
        (dest / lib).write_bytes(b"")
    return str(engine)


def lokid_plan(config: Path, preset: str, driver_lib: Path, *args: str
               ) -> subprocess.CompletedProcess[str]:
    """``lokid plan`` as an operator runs it, with the stand-in driver library."""
    env = {**os.environ, **NO_ENGINE_USER, "LOKI_CONFIG_DIR": str(config),
           "LOKI_STATE_DIR": str(config.parent / "state"),
           "LOKI_RUNTIME_DIR": str(config.parent / "run"),
           "LD_LIBRARY_PATH": str(driver_lib), "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "lokid.cli", "plan", preset, *args],
                          env=env, capture_output=True, text=True, timeout=120)
