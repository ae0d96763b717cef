"""The Debian package on a fresh Debian 13: install to ready, against the raw engine.

Builds the package in a trixie container (tests/support/debpkg.py, as tests/packaging/test_deb.py
does), boots a bare trixie (systemd, dbus, apt, the engine's shared libraries),
and measures, side by side in that one container:

- ``apt-get install ./lokid_*.deb`` (downloads from deb.debian.org included);
- lokid: ``systemctl start loki-engine@demo`` until it returns (the unit is
  active exactly when /health answers 200), on the real llama-server b11434 and
  a generated model, median of --reps starts, twice a round: a first start
  (the kept plan removed: ``lokid prestart`` plans, as after a change) and a
  restart (the last ready start's plan reused, as after ``systemctl restart``
  of a preset nobody edited);
- the reference: the same llama-server command line (``lokid plan demo --json``)
  spawned by hand as user loki until /health answers 200, median of --reps starts;
- the floor under lokid: ``systemctl start`` of a unit with loki-engine@'s own
  [Service] settings (Type=notify, user, sandbox) whose ExecStart is a Python
  one-liner sending READY=1 at once, and no ExecStartPre: what systemd and one
  Python interpreter cost any notify unit, before lokid does anything (lokid's
  second interpreter, its planning step, is lokid's share).

All three are timed inside the container, one after the other in each round
(so machine noise hits all alike), by one Python process calling ``systemctl``
or spawning the engine, and prints each start's share over the raw engine and
over the floor; then, by systemd's own timestamps, how long each start's planning step
(ExecStartPre) and engine step (ExecStart to READY=1) took, beside the floor's one step.
Needs root and what the container tests need.

Measured in issue 31's third session, --reps 9: raw engine 24 ms, floor unit 62 ms; a
restart 148 ms, lokid's share over the floor 63 ms (62 ms in another run; ExecStartPre
61 ms, ExecStart -> READY=1 79 ms against the floor's 52 ms); a first start 211 ms,
share 126 ms. Its second session measured 75 ms and 133 ms; issue 20, 122 ms and 175 ms.
Its fourth session (the engine step now also takes a group's note, lokid.unit.held): a
restart 147 ms, its steps 58 ms and 76 ms, but the floor unit at 56 ms in that run, so a
share of 69 ms: the share is a difference of two noisy figures, +-6 ms between runs.
Its sixth session, --reps 9: raw 29 ms, floor 60 ms; a restart 156 ms, share 67 ms (its
steps 53 ms and 84 ms against the floor's 50); a first start 238 ms, share 148 ms.
Its seventh session (a restart that nothing changed hands its kept plan over without json, re,
enum or signal: lokid.unit.keptstart; the package's /usr/bin/lokid without the generated
script's re), --reps 9, three runs: a restart's share 55, 63 and 62 ms (its planning step 51,
49 and 54 ms; the engine step 78, 85 and 78 ms against the floor's 49, 47 and 52), against 70
ms for the tree before it in the same hour (planning step 63 ms); a first start's share
119-124 ms.
Its eighth session: the packaged command with ``#!/usr/bin/python3 -S`` for the unit's steps
(site skipped: 1-3 ms of a bare ``python3`` in a chroot of this trixie) was measured by a
variant of this script, a restart with the same unit's steps run by ``python3
/usr/bin/lokid`` (site at start) interleaved in each round, --reps 15: 140 ms without
site, 141 ms with it (planning step 50 against 49 ms, engine step 77 against 79 ms): no
gain above the noise, and not taken. A restart's share in the eleven runs of that session
(the seventh session's tree and this one's, whose restart path is the same): 45 to 85 ms,
median 58, at most 60 in 6 of 11 (the floor unit between 58 and 80 ms): a difference of
two noisy figures, +-10 ms between runs of one tree.
Issue 31's goal for a restart's share is 60 ms. What any ExecStartPre costs in this unit
(benchmarks/unit_overhead.py, --reps 9): ``/bin/true`` 35 ms (19 ms without the unit's
sandbox settings), ``python3 -c pass`` 44 ms; so a Python helper alone takes most of the
share, whatever it does.

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

# In the container's timing scripts (this one's, unit_overhead.py's): systemd's own
# timestamps of the unit's start just made, in seconds: leaving inactive (ExecStartPre
# begins), ExecStart begins, READY=1 (active): the planning step and the engine step.
STEPS = """
import subprocess
def steps(unit):
    shown = subprocess.run(["systemctl", "show", unit, "-p", "InactiveExitTimestampMonotonic",
                            "-p", "ExecMainStartTimestampMonotonic",
                            "-p", "ActiveEnterTimestampMonotonic"],
                           capture_output=True, text=True, check=True).stdout
    t = {k: int(v) for k, v in (line.split("=", 1) for line in shown.split())}
    main = t["ExecMainStartTimestampMonotonic"]
    return [max(0, main - t["InactiveExitTimestampMonotonic"]) / 1e6,
            (t["ActiveEnterTimestampMonotonic"] - main) / 1e6]
"""

# Runs in the container as root: --reps rounds of (lokid's unit planning, lokid's unit
# reusing that plan, the floor unit, the raw engine as loki), each timed; prints one JSON
# object of the four lists.
ROUNDS = STEPS + """
import json, os, subprocess, sys, time, urllib.request
argv, env, url, reps = json.loads(sys.argv[1])
def timed(cmd):
    t0 = time.monotonic()
    subprocess.run(cmd, check=True)
    return time.monotonic() - t0
def raw():
    t0 = time.monotonic()
    p = subprocess.Popen(["runuser", "-u", "loki", "--", "env", *env, *argv],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while True:
        try:
            if urllib.request.urlopen(url, timeout=1).status == 200:
                break
        except OSError:
            pass
        time.sleep(0.002)
    took = time.monotonic() - t0
    p.terminate()
    p.wait()
    return took
out = {"first": [], "restart": [], "floor": [], "raw": [],
       "first_steps": [], "restart_steps": [], "floor_steps": []}
time.sleep(1.1)  # a plan is kept for reuse once its files are a second old (the preset's)
for _ in range(reps):
    try:
        os.unlink("/run/loki/demo.reuse")
    except FileNotFoundError:
        pass
    out["first"].append(timed(["systemctl", "start", "loki-engine@demo.service"]))
    out["first_steps"].append(steps("loki-engine@demo.service"))
    # the plan is kept just after READY=1 (untimed): a stop at once could come first
    deadline = time.monotonic() + 5
    while not os.path.exists("/run/loki/demo.reuse") and time.monotonic() < deadline:
        time.sleep(0.01)
    subprocess.run(["systemctl", "stop", "loki-engine@demo.service"], check=True)
    if not os.path.exists("/run/loki/demo.reuse"):
        sys.exit("the first start kept no plan to reuse")
    out["restart"].append(timed(["systemctl", "start", "loki-engine@demo.service"]))
    out["restart_steps"].append(steps("loki-engine@demo.service"))
    subprocess.run(["systemctl", "stop", "loki-engine@demo.service"], check=True)
    out["floor"].append(timed(["systemctl", "start", "loki-floor.service"]))
    out["floor_steps"].append(steps("loki-floor.service"))
    subprocess.run(["systemctl", "stop", "loki-floor.service"], check=True)
    out["raw"].append(raw())
    time.sleep(1.1)  # a plan is kept for reuse once its files are a second old
print(json.dumps(out))
"""

# READY=1 at once, then wait to be stopped: the floor unit's ExecStart.
FLOOR = ("import os, socket, time; s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM); "
         "a = os.environ['NOTIFY_SOCKET']; s.connect(chr(0) + a[1:] if a[0] == '@' else a); "
         "s.send(b'READY=1'); time.sleep(3600)")


def floor_unit(engine_unit: str) -> str:
    """loki-engine@.service's settings with the floor's ExecStart, no ExecStartPre or
    ExecStopPost."""
    lines = []
    for line in engine_unit.splitlines():
        if line.startswith("ExecStart="):
            line = f'ExecStart=/usr/bin/python3 -c "{FLOOR}"'
        elif line.startswith(("ExecStartPre=", "ExecStopPost=", "WantedBy=")):
            continue
        lines.append(line.replace("%i", "floor").replace("%I", "floor"))
    return "\n".join(lines) + "\n"


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
            unit = ct.run(["cat", "/usr/lib/systemd/system/loki-engine@.service"]).stdout
            ct.write_file("/etc/systemd/system/loki-floor.service", floor_unit(unit))
            ct.systemctl("daemon-reload")
            plan = json.loads(ct.run(["lokid", "plan", "demo", "--json"]).stdout)
            env_args = [f"{k}={v}" for k, v in plan["env"].items()]
            r = ct.run(["python3", "-c", ROUNDS, json.dumps(
                [plan["argv"], env_args, f"http://127.0.0.1:{port}/health", args.reps])],
                timeout=120 + 60 * args.reps)
            times = json.loads(r.stdout)
    first, again, fl, rw = (statistics.median(times[k])
                            for k in ("first", "restart", "floor", "raw"))
    print(f"{args.suite}: lokid {built.version}, tiny generated model, {args.reps} rounds")
    print(f"apt-get install ./{built.deb.name}: {install_s:.1f} s (downloads included)")
    print(f"raw llama-server spawned as loki to /health 200          : {rw * 1000:6.0f} ms")
    print(f"systemctl start of the floor unit (sandbox, python3, READY=1): {fl * 1000:4.0f} ms")
    for what, lk in (("first start (prestart plans)", first),
                     ("restart (the kept plan reused)", again)):
        print(f"systemctl start loki-engine@demo, {what:31}: {lk * 1000:6.0f} ms "
              f"(+{(lk - rw) * 1000:.0f} ms over the raw engine, ratio {lk / rw:.1f}x; "
              f"lokid's own share over the floor: {(lk - rw - fl) * 1000:.0f} ms)")
    # where the time goes, by systemd's timestamps: each step pays systemd's sandbox and
    # an interpreter, which the floor unit's ExecStart -> READY=1 measures alone
    for what in ("first", "restart", "floor"):
        pre, main = (statistics.median(s[i] for s in times[f"{what}_steps"]) for i in (0, 1))
        print(f"  {what:8}: ExecStartPre (planning step) {pre * 1000:4.0f} ms, "
              f"ExecStart -> READY=1 {main * 1000:4.0f} ms")
    print(f"install to ready: {install_s + first:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
