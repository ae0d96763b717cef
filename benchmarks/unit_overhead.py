#!/usr/bin/env python3
"""What a step costs in loki-engine@'s unit itself, before lokid does anything: systemd's
sandbox and an interpreter, per process.

In a booted Debian 13 container (the systemd tests' rootfs with python3, user ``loki`` added),
units with loki-engine@.service's own [Service] sandbox settings (read from units/), each
an ExecStart that sends READY=1 at once (a Python one-liner, as deb_install.py's floor
unit), and variants: without the sandbox settings, without one of them, with an
ExecStartPre of ``/bin/true`` or ``python3 -c pass``. ``--reps`` rounds (9), the variants
interleaved; per variant the medians of ``systemctl start`` and, by systemd's own
timestamps, of the ExecStartPre step and of ExecStart -> READY=1.

It says how much of lokid's share of a start (benchmarks/deb_install.py) any
ExecStartPre in this unit costs, whatever it runs.

Measured in issue 31's third session, --reps 9 (2-CPU machine): floor start 60.7 ms, its
step 50.7 ms; without the sandbox settings 41.2 / 32.7 ms; without ProtectKernelTunables
51.6 / 41.8 ms, without ProtectKernelLogs 55.6 / 45.4 ms; an ExecStartPre of /bin/true
takes 35.4 ms (start 90.6 ms, 1.49x the floor's), 19.1 ms without the sandbox; of
python3 -c pass 43.5 ms (start 99.0 ms, 1.63x).

    .venv/bin/python benchmarks/unit_overhead.py [--reps 9]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from deb_install import FLOOR, STEPS  # noqa: E402
from support.debpkg import runtime_packages  # noqa: E402
from support.systemd_harness import Container  # noqa: E402

# loki-engine@'s sandbox: its [Service] lines from ProtectSystem= on (the unit's own file)
SANDBOX_FROM = "ProtectSystem="

ROUNDS = STEPS + r"""
import json, subprocess, sys, time
names, reps = json.loads(sys.argv[1])
out = {n: [] for n in names}
for _ in range(reps):
    for n in names:
        u = f"x-{n}.service"
        t0 = time.monotonic()
        subprocess.run(["systemctl", "start", u], check=True)
        out[n].append([(time.monotonic() - t0) * 1e3, *(x * 1e3 for x in steps(u))])
        subprocess.run(["systemctl", "stop", u], check=True)
        time.sleep(0.05)
print(json.dumps(out))
"""


def sandbox() -> list[str]:
    lines = (ROOT / "units" / "loki-engine@.service").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(SANDBOX_FROM))
    return [line for line in lines[start:] if "=" in line and not line.startswith("#")
            and not line.startswith("[")]


def unit(pre: str | None, settings: list[str]) -> str:
    py = f'/usr/bin/python3 -c "{FLOOR}"'
    return "\n".join(["[Service]", "Type=notify", "NotifyAccess=main",
                      *([f"ExecStartPre={pre}"] if pre else []), f"ExecStart={py}",
                      "User=loki", "Group=loki", *settings]) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=9)
    args = ap.parse_args()
    sb = sandbox()
    variants = {
        "floor (the unit's sandbox)": unit(None, sb),
        "floor without the sandbox settings": unit(None, []),
        "without ProtectKernelTunables": unit(None, [s for s in sb
                                                     if not s.startswith("ProtectKernelTunables")]),
        "without ProtectKernelLogs": unit(None, [s for s in sb
                                                 if not s.startswith("ProtectKernelLogs")]),
        "ExecStartPre=/bin/true": unit("/bin/true", sb),
        "ExecStartPre=/bin/true, no sandbox": unit("/bin/true", []),
        "ExecStartPre=python3 -c pass": unit("/usr/bin/python3 -c pass", sb),
    }
    names = {name: f"v{i}" for i, name in enumerate(variants)}
    # python3: the floor's ExecStart and the timing script (the package brings it otherwise)
    with Container(suite="trixie", packages=[*runtime_packages("trixie"), "python3"]) as ct:
        ct.run(["useradd", "--system", "--user-group", "loki"])
        for name, text in variants.items():
            ct.write_file(f"/etc/systemd/system/x-{names[name]}.service", text)
        ct.systemctl("daemon-reload")
        r = ct.run(["python3", "-c", ROUNDS, json.dumps([list(names.values()), args.reps])],
                   timeout=120 + 30 * args.reps)
        got = json.loads(r.stdout)
    print(f"trixie, loki-engine@'s sandbox ({len(sb)} settings), {args.reps} rounds, medians:")
    for name, key in names.items():
        start, pre, main_ = (statistics.median(row[i] for row in got[key]) for i in range(3))
        print(f"  {name:36} start {start:6.1f} ms   ExecStartPre {pre:5.1f} ms   "
              f"ExecStart -> READY=1 {main_:5.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
