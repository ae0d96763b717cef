#!/usr/bin/env python3
"""The floor under the gateway's resting memory: what its imports cost, stack by stack.

Issue 31 asks for a gateway at rest in at most 25 MiB (VmRSS; llama.cpp's router, one
C++ process, rests in ~17 MiB). benchmarks/vs_router.py measures the live gateway (44 MiB
after a request); this script says what part of it any gateway of this design would
carry. Fresh interpreters (this venv's, as the gateway runs), each importing one stack
of modules, every stack the one before plus more; per stack the median of ``--reps``
interpreters of VmRSS and of its private part (Private_Clean + Private_Dirty of
/proc/self/smaps_rollup: what is not a page of a shared library or file also mapped
by another process, such as libpython and libcrypto in the daemon), after a collection:

1. the interpreter alone (``site`` included);
2. + json, socket and asyncio, with ``ssl`` kept out (``sys.modules["ssl"] = None``:
   asyncio then runs without TLS), as a gateway that loads TLS only for its first
   external API would rest;
3. + dbus-fast (the design card's D-Bus library: the gateway follows the daemon's
   signals and calls its methods);
4. + h11, a pure-Python HTTP/1.1 layer (httpx's own: installed with it) as the smallest
   stand-in for an HTTP server and client of the gateway's own;
5. + lokid's routing and placement rules the gateway runs (lokid.core.fleet.route,
   lokid.core.place.policy, lokid.core.config.external): stack 5 is the floor of a gateway
   without aiohttp and without TLS at rest, before a line of its own HTTP code;
6. stack 5 with ssl allowed and uvloop (the loop the relay's CPU per token was measured
   on: uvloop imports ssl, it cannot run without it);
7. the gateway as it is: ``lokid.gateway.server`` (aiohttp and aiohttp.web, uvloop, ssl,
   aiohttp's default TLS context built at import).

Measured in issue 31's sixth session (2-CPU machine, CPython 3.11.7, --reps 5), VmRSS
(private part): interpreter 8.6 MiB (2.9); + json, socket, asyncio 15.1 (9.0); + dbus-fast
22.3 (16.2); + h11 22.7 (16.6); + lokid's rules, the floor, 23.9 (17.8); with ssl and
uvloop 26.5 (20.4); the gateway's imports today 40.5 (34.0), and 44 MiB live at rest after
requests (vs_router.py). So the goal leaves 1.1 MiB over the floor for every line of a
gateway's own HTTP server and client, routes, rules and state, and none at all for the
uvloop its relay's CPU per token was measured on (1.11x systemd-socket-proxyd's): a
gateway without aiohttp would rest at ~26-27 MiB without uvloop and ~30 with it. The
aiohttp it runs on is the rest (+16.6 MiB over the floor, its default TLS context built
at import included); MALLOC_ARENA_MAX=1 or 2 changes nothing (43.7 MiB either way): the
memory is what is imported, not the allocator's.

    .venv/bin/python benchmarks/gateway_memory_floor.py [--reps 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

BASE = ["json", "socket", "asyncio"]
DBUS = ["dbus_fast", "dbus_fast.aio"]
LOKID = ["lokid.core.fleet.route", "lokid.core.place.policy", "lokid.core.config.external"]
# (label, modules, ssl kept out)
STACKS: list[tuple[str, list[str], bool]] = [
    ("interpreter alone", [], True),
    ("+ json, socket, asyncio (no ssl)", BASE, True),
    ("+ dbus-fast", BASE + DBUS, True),
    ("+ h11", BASE + DBUS + ["h11"], True),
    ("+ lokid's routing rules: the floor", BASE + DBUS + ["h11"] + LOKID, True),
    ("floor with ssl and uvloop", BASE + DBUS + ["h11"] + LOKID + ["ssl", "uvloop"], False),
    ("the gateway today (lokid.gateway.server)", ["lokid.gateway.server"], False),
]

CHILD = r"""
import gc, importlib, sys
if {no_ssl}:
    sys.modules["ssl"] = None
for name in {modules!r}:
    importlib.import_module(name)
gc.collect()
def field(path, key):
    for line in open(path):
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0
roll = "/proc/self/smaps_rollup"
print(field("/proc/self/status", "VmRSS"),
      field(roll, "Private_Clean") + field(roll, "Private_Dirty"))
"""


def measure(modules: list[str], no_ssl: bool) -> dict[str, int]:
    out = subprocess.run([sys.executable, "-c", CHILD.format(modules=modules, no_ssl=no_ssl)],
                         capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}).stdout
    rss, private = out.split()
    return {"rss": int(rss), "private": int(private)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--reps", type=int, default=5)
    args = p.parse_args()
    got: dict[str, dict[str, list[int]]] = {s[0]: {"rss": [], "private": []} for s in STACKS}
    for _ in range(args.reps):   # interleaved: the machine's drift hits every stack alike
        for label, modules, no_ssl in STACKS:
            for k, v in measure(modules, no_ssl).items():
                got[label][k].append(v)
    print(f"Python {sys.version.split()[0]}, {args.reps} fresh interpreters per stack "
          "(medians; KiB -> MiB)")
    print(f"  {'stack':44} {'VmRSS':>8} {'step':>7} {'private':>8}")
    last = 0.0
    for label, _, _ in STACKS:
        rss = statistics.median(got[label]["rss"]) / 1024
        private = statistics.median(got[label]["private"]) / 1024
        step = f"{rss - last:+.1f}" if last and not label.startswith("the gateway") else ""
        print(f"  {label:44} {rss:8.1f} {step:>7} {private:8.1f}")
        last = rss
    floor = statistics.median(got[STACKS[4][0]]["rss"]) / 1024
    today = statistics.median(got[STACKS[-1][0]]["rss"]) / 1024
    print(f"issue 31's goal, gateway at rest <= 25 MiB: the floor leaves "
          f"{25 - floor:.1f} MiB for all of the gateway's own code, its HTTP layer and its "
          f"state; its imports today are {today - floor:+.1f} MiB over that floor")
    return 0


if __name__ == "__main__":
    sys.exit(main())
