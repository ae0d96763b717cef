"""`lokid daemon` as a process on a private real dbus-daemon, for the benchmarks.

Yields once the daemon sent READY=1 (presets planned, engines' state known, bus name
owned); everything is stopped at the end of the block. ``started`` is the
perf_counter() time the daemon was spawned, for the benchmarks that time readiness.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from . import REPO
from .enginekit import NotifyListener


@dataclass
class DaemonProcess:
    address: str      # the private bus
    proc: subprocess.Popen[bytes]
    started: float    # perf_counter() at the spawn
    ready: float      # perf_counter() at READY=1


@contextmanager
def daemon_process(config: Path, root: Path, runtime: Path | None = None,
                   runner: str = "local", ready_timeout: float = 300,
                   env: Mapping[str, str] | None = None) -> Iterator[DaemonProcess]:
    """``lokid daemon --bus session --runner RUNNER`` for ``config``; its state in
    ``root/state``, its runtime files in ``runtime`` (default ``root/run``); its
    environment ``env`` (default this process's) with those added."""
    bus = subprocess.Popen(["dbus-daemon", "--session", "--nofork", "--print-address",
                            f"--address=unix:path={root / 'bus'}"],
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert bus.stdout is not None
    address = bus.stdout.readline().strip()
    notify = NotifyListener(root / "notify")
    started = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "lokid.cli", "--config-dir", str(config), "daemon",
         "--bus", "session", "--bus-address", address, "--runner", runner],
        env={**(os.environ if env is None else env), "LOKI_STATE_DIR": str(root / "state"),
             "LOKI_RUNTIME_DIR": str(runtime or root / "run"), "NOTIFY_SOCKET": notify.path,
             "PYTHONPATH": str(REPO)},
        stderr=subprocess.DEVNULL)
    try:
        notify.wait_for("READY=1", timeout=ready_timeout)
        yield DaemonProcess(address, proc, started, time.perf_counter())
    finally:
        proc.terminate()
        proc.wait(30)
        bus.terminate()
        bus.wait(10)
        notify.close()
        os.unlink(root / "notify")


@contextmanager
def daemon_on_bus(config: Path, root: Path, bus_address: str) -> Iterator[str]:
    """``lokid daemon --bus session`` for ``config`` as a process on the caller's bus (its
    state and runtime files under ``root``), until the block ends; yields the address."""
    notify = NotifyListener(root / "notify")
    env = {**os.environ, "LOKI_STATE_DIR": str(root / "state"),
           "LOKI_RUNTIME_DIR": str(root / "run"), "NOTIFY_SOCKET": notify.path}
    proc = subprocess.Popen([sys.executable, "-m", "lokid.cli", "--config-dir", str(config),
                             "daemon", "--bus", "session", "--bus-address", bus_address],
                            env=env, stderr=subprocess.DEVNULL)
    try:
        notify.wait_for("READY=1", timeout=60)
        yield bus_address
    finally:
        proc.terminate()
        proc.wait(30)
        notify.close()
