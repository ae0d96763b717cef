"""The Debian package on a fresh Debian 13: install to ready, against the raw engine.

Builds the package in a trixie container (tests/support/debpkg.py, as tests/packaging/test_deb.py
does), boots a bare trixie (systemd, dbus, apt, the engine's shared libraries),
and measures, side by side in that one container:

- ``apt-get install ./lokid_*.deb`` (downloads from deb.debian.org included);
- lokid: ``systemctl start loki-engine@demo`` until it returns (the unit is
  active exactly when /health answers 200), on the real llama-server b11434 and
  a generated model, median of --reps starts;
- the reference: the same llama-server command line (``lokid plan demo --json``)
  spawned by hand until /health answers 200, median of --reps starts.

and prints the ratio. Needs root and what the container tests need.

    .venv/bin/python benchmarks/deb_install.py [--suite trixie] [--reps 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from support.debpkg import build_in_container, runtime_packages  # noqa: E402
from support.enginekit import engine_binary, free_port  # noqa: E402
from support.models import write_llama  # noqa: E402
from support.systemd_harness import Container  # noqa: E402

ENGINE_DIR = "/opt/engine"

# Spawns argv, polls /health until 200, prints the seconds, stops the engine.
RAW_START = """
import json, subprocess, sys, time, urllib.request
argv, url = json.loads(sys.argv[1]), sys.argv[2]
t0 = time.monotonic()
p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
while True:
    try:
        if urllib.request.urlopen(url, timeout=1).status == 200:
            break
    except OSError:
        pass
    time.sleep(0.01)
print(time.monotonic() - t0)
p.terminate()
p.wait()
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--suite", default="trixie")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        built = build_in_container(args.suite, work)
        if built.rc != 0:
            print(built.log[-3000:], file=sys.stderr)
            return 1
        model = work / "llama.gguf"
        write_llama(model)
        binds = {"/debs": str(work), ENGINE_DIR: os.path.dirname(engine_binary())}
        with Container(suite=args.suite, packages=runtime_packages(args.suite),
                       binds=binds) as ct:
            env = {"DEBIAN_FRONTEND": "noninteractive"}
            ct.run(["apt-get", "-q", "-y", "update"], timeout=600, env=env)
            t0 = time.monotonic()
            ct.run(["apt-get", "-q", "-y", "install", f"/debs/{built.deb.name}"], timeout=900,
                   env=env)
            install_s = time.monotonic() - t0
            engine = f"{ENGINE_DIR}/{os.path.basename(engine_binary())}"
            ct.write_file("/srv/models/llama.gguf", model.read_bytes())
            ct.write_file("/etc/loki/lokid.toml", f"engine = {json.dumps(engine)}\n"
                          'model_dirs = ["/srv/models"]\n')
            port = free_port()
            ct.write_file("/etc/loki/presets/demo.toml",
                          f'model = "llama.gguf"\nctx = 2048\nport = {port}\n')
            ct.systemctl("daemon-reload")
            plan = json.loads(ct.run(["lokid", "plan", "demo", "--json"]).stdout)
            lokid, raw = [], []
            for _ in range(args.reps):
                t0 = time.monotonic()
                ct.systemctl("start", "loki-engine@demo.service", timeout=300)
                lokid.append(time.monotonic() - t0)
                ct.systemctl("stop", "loki-engine@demo.service", timeout=120)
                r = ct.run(["runuser", "-u", "loki", "--", "env",
                            *(f"{k}={v}" for k, v in plan["env"].items()), "python3", "-c",
                            RAW_START, json.dumps(plan["argv"]),
                            f"http://127.0.0.1:{port}/health"], timeout=300)
                raw.append(float(r.stdout))
    lk, rw = statistics.median(lokid), statistics.median(raw)
    print(f"{args.suite}: lokid {built.version}, tiny generated model, {args.reps} starts each")
    print(f"apt-get install ./{built.deb.name}: {install_s:.1f} s (downloads included)")
    print(f"start to ready: lokid (systemctl start loki-engine@demo) {lk * 1000:.0f} ms, "
          f"raw llama-server spawn to /health 200 {rw * 1000:.0f} ms, ratio {lk / rw:.1f}x "
          f"(+{(lk - rw) * 1000:.0f} ms)")
    print(f"install to ready: {install_s + lk:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
