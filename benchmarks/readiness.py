#!/usr/bin/env python3
"""Readiness overhead of the unit's whole start path against the raw engine, side by side.

For the same generated tiny model and the real llama-server b11434:

- raw: spawn llama-server with the plan's argv, then poll GET /health every
  millisecond until it answers 200 (the best any manager could do);
- lokid: the unit's two steps as systemd runs them, one after the other with
  one INVOCATION_ID: `lokid prestart <preset>` (ExecStartPre: config, GGUF
  header, the engine's --help/--version probe, the state DB, the runtime plan)
  to its exit, then `lokid engine <preset>` (ExecStart: runs that plan and
  supervises), with NOTIFY_SOCKET on a real datagram socket; the time is from
  the first spawn to READY=1.
  Two cases: a start that plans (the first after a change: its record of the
  last ready start's plan removed first) and a restart that reuses that plan
  (lokid.store.plancache: nothing it was made from changed).

lokid runs as installed: its modules byte-compiled (the Debian package's
postinst runs py3compile; tests/support/bytecode.py says why a benchmark must
do it here). ``--source`` times the other case, every module compiled from
source at each start, what this machine's PYTHONDONTWRITEBYTECODE=1 gives a
checkout.

Runs alternate (raw, lokid planning, raw, lokid reusing, …) so machine noise
hits all alike; prints the medians and the median extra times. Goal: at most
100 ms extra. Exits 1 when the median overhead of either case is above
--max-extra-ms.

    .venv/bin/python benchmarks/readiness.py [--runs 15] [--max-extra-ms 100] [--source]
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from support.bytecode import installed_env, source_env  # noqa: E402
from support.enginekit import free_port, tiny_config  # noqa: E402
from support.startcost import arguments, raw_start, report, stop, wait_port_free  # noqa: E402

from lokid.unit.steps import prestart  # noqa: E402


def lokid_run(env: dict[str, str], sock_path: str) -> float:
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(sock_path)
        sock.settimeout(60)
        env = {**env, "NOTIFY_SOCKET": sock_path, "INVOCATION_ID": os.urandom(16).hex()}
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "lokid.cli", "prestart", "bench"], env=env,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        proc = subprocess.Popen([sys.executable, "-m", "lokid.cli", "engine", "bench"],
                                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            while True:
                data = sock.recv(4096).decode()
                if "READY=1" in data.split("\n"):
                    return time.perf_counter() - t0
        finally:
            stop(proc)
            os.unlink(sock_path)


def main() -> int:
    args = arguments(15)

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        port = free_port()
        config = tiny_config(root, "bench", f"port = {port}\n")
        state, runtime = str(root / "state"), str(root / "run")
        plan = prestart(str(config), state, runtime, "bench", environ={})  # the raw argv
        env = {**os.environ, "LOKI_CONFIG_DIR": str(config), "LOKI_STATE_DIR": state,
               "LOKI_RUNTIME_DIR": runtime, "PYTHONPATH": str(ROOT)}
        env.pop("NOTIFY_SOCKET", None)
        env = source_env(env) if args.source else installed_env(env, str(root / "pycache"))

        time.sleep(1.1)  # a plan is kept for reuse once its files are a second old
        raw, planning, reusing = [], [], []
        raw_start(list(plan.argv), port)  # warm the page cache and the binary
        wait_port_free(port)
        lokid_run(env, str(root / "notify-warm"))  # ready once: its plan is kept
        wait_port_free(port)
        reuse = Path(runtime, "bench.reuse")
        assert reuse.exists(), "the ready start kept no plan to reuse"
        for i in range(args.runs):
            raw.append(raw_start(list(plan.argv), port))
            wait_port_free(port)
            kept = reuse.read_bytes()
            reuse.unlink()
            planning.append(lokid_run(env, str(root / f"notify-p{i}")))
            wait_port_free(port)
            reuse.write_bytes(kept)
            raw.append(raw_start(list(plan.argv), port))
            wait_port_free(port)
            reusing.append(lokid_run(env, str(root / f"notify-r{i}")))
            wait_port_free(port)

    return report(args, env, "raw llama-server, spawn -> first /health 200",
                  "lokid prestart spawn -> lokid engine READY=1", raw, planning, reusing)


if __name__ == "__main__":
    sys.exit(main())
