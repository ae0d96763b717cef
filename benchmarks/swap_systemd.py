#!/usr/bin/env python3
"""A GPU group's swap under a real systemd: what a client waits, and where it goes.

In a booted Debian 12 container, lokid installed as the tests install it (the tree
bound in) with its socket-activated gateway; two on-demand presets of the generated
tiny llama, ``alpha`` and ``beta``, in one GPU group. One client inside the container
asks alpha, beta, alpha, beta… one after the other (a short stream of ``--tokens``
each): every request is a swap. Measured per swap: the swap gap, from the last byte of
the previous stream to the first byte of the next (what a client waits: the group's
rule, the old engine's stop, the new one's start, the slots), and by systemd's own
lines of the two units (their journal timestamps): how long after the old unit's
"Stopping" the new one's "Starting" came, how long before the old one's "Stopped" (the
overlap: its planning step and its interpreter while the old engine tears down), and
the new one's "Started" after the old one's "Stopped". Medians and spreads over
``--swaps`` swaps (the first one, to a preset never loaded yet, not counted); and the
engine steps' own lines of how long they waited for the old engine's processes.

Measured in issue 31's fourth session, --swaps 21, two runs each, the same script on the
commit before the overlap (54c6ef5) and after it: the swap gap 435 and 428 ms before,
341 and 324 ms after (-24 %); the new unit's "Starting" 89-93 ms after the old one's
"Stopping" before, 18 ms after; it came 16-18 ms after the old unit's "Stopped" before,
48-58 ms before it now (its planning step and interpreter overlap the old engine's
teardown); the new unit "Started" 174-180 ms after the old one's "Stopped" before,
80-88 ms now. With the tiny model the old engine is gone before the new step reaches
its spawn (each step's line: "waited 0 ms"); a GPU engine's teardown lasts longer, and
the wait is then where it belongs, just before the spawn.

The client's side against systemd's lines (one clock, CLOCK_MONOTONIC) adds: the old
stream's last byte to the old unit's "Stopping" (the group's rule, the slot save, the
call), the new unit's "Starting" to "Started", and "Started" to the new stream's first
byte; and ``--cold`` cold starts of alpha through the gateway after the swaps (each after
``systemctl stop``), with alpha's unit's "Starting" to "Started" taken out of each.
Issue 31's fifth session, --swaps 21 --cold 9, the commit before it (703b2d3, its tree
byte-compiled as the installed one is) and after it: the swap gap 344 -> 193 ms; last
byte -> "Stopping" 118 -> 11 ms (the group's rule held an idle holder whose client never
came back within the hold: lokid.core.serve.swaps); "Started" -> first byte 62 -> 15 ms (the
gateway's first connection started the port's relay unit: it now connects to the
engine's socket, lokid.gateway.sockets); a cold start 236 -> 180 ms, of which outside
alpha's unit 81 -> 41 ms.

    .venv/bin/python benchmarks/swap_systemd.py [--swaps 21] [--tokens 8] [--cold 9]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from support import models as gen  # noqa: E402
from support.enginekit import engine_binary, free_port  # noqa: E402
from support.systemd_harness import Container  # noqa: E402

ENGINE_DIR = "/opt/engine"
GROUP = '[serve]\non_demand = true\ngroup = "gpu0"\n'

# Runs in the container: the requests one after the other, each stream's first and last
# byte (CLOCK_MONOTONIC, as systemd's *Monotonic timestamps), one JSON list.
CLIENT = r"""
import http.client, json, sys, time
port, swaps, tokens = map(int, sys.argv[1:4])
out = []
for i in range(swaps + 1):
    model = ("alpha", "beta")[i % 2]
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    sent = time.monotonic()
    c.request("POST", "/v1/completions", json.dumps(
        {"model": model, "prompt": "Once", "max_tokens": tokens, "stream": True,
         "temperature": 0}), {"Content-Type": "application/json"})
    r = c.getresponse()
    first = None
    while True:
        chunk = r.read1(65536)
        if first is None:
            first = time.monotonic()
        if not chunk:
            break
    last = time.monotonic()
    c.close()
    out.append([model, r.status, sent, first, last])
print(json.dumps(out))
"""

# Runs in the container after the swaps: --cold cold starts of alpha through the gateway,
# each after `systemctl stop` of both engines (the request to first byte, CLOCK_MONOTONIC).
COLD = r"""
import http.client, json, subprocess, sys, time
port, rounds = map(int, sys.argv[1:3])
out = []
for i in range(rounds):
    subprocess.run(["systemctl", "stop", "loki-engine@alpha.service",
                    "loki-engine@beta.service"], check=True)
    time.sleep(0.5)   # the gateway hears of the stop (the daemon's signal)
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    sent = time.monotonic()
    c.request("POST", "/v1/completions", json.dumps(
        {"model": "alpha", "prompt": "Once", "max_tokens": 1, "stream": True,
         "temperature": 0}), {"Content-Type": "application/json"})
    r = c.getresponse()
    r.read1(65536)
    first = time.monotonic()
    r.read()
    c.close()
    out.append([r.status, sent, first])
print(json.dumps(out))
"""


def journal_marks(ct: Container) -> list[tuple[float, str, str]]:
    """systemd's own lines of the engine units this boot: (CLOCK_MONOTONIC seconds, what,
    preset), what being stopping, stopped, starting or started."""
    r = ct.run(["journalctl", "-b", "-o", "json", "--no-pager", "_PID=1"], timeout=120)
    marks = []
    for line in r.stdout.splitlines():
        entry = json.loads(line)
        message = entry.get("MESSAGE")
        if not isinstance(message, str) or "loki-engine@" not in message:
            continue
        what = message.split(" ", 1)[0]
        if what in ("Stopping", "Stopped", "Starting", "Started"):
            preset = message.split("loki-engine@", 1)[1].split(".service", 1)[0]
            marks.append((int(entry["__MONOTONIC_TIMESTAMP"]) / 1e6, what, preset))
    return marks


def spread(values: list[float]) -> str:
    return (f"{statistics.median(values):7.1f} ms ({min(values):.1f} to {max(values):.1f})"
            if values else "    n/a")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--swaps", type=int, default=21)
    ap.add_argument("--tokens", type=int, default=8)
    ap.add_argument("--cold", type=int, default=9, help="cold starts of alpha, after the swaps")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = gen.write_llama(Path(tmp) / "llama.gguf")
        ct = Container(binds={ENGINE_DIR: os.path.dirname(engine_binary()),
                              "/opt/lokid": str(ROOT)})
        ct.start()
        try:
            from support.lokid_install import MODEL_DIR, install, serve_gateway

            engine = f"{ENGINE_DIR}/{os.path.basename(engine_binary())}"
            install(ct, engine, [str(model)], gateway=True)
            port = free_port()
            ct.run(["mkdir", "-p", "/etc/loki/presets"])
            for name in ("alpha", "beta"):
                ct.write_file(f"/etc/loki/presets/{name}.toml",
                              f'port = {free_port()}\nmodel = "llama.gguf"\nctx = 2048\n{GROUP}')
            serve_gateway(ct, engine, MODEL_DIR, port)
            # alpha's cold start, beta's first load (a swap, not counted), then --swaps swaps
            r = ct.run(["python3", "-c", CLIENT, str(port), str(args.swaps + 1),
                        str(args.tokens)], timeout=900)
            served = json.loads(r.stdout)
            cold = json.loads(ct.run(["python3", "-c", COLD, str(port), str(args.cold)],
                                     timeout=900).stdout) if args.cold else []
            marks = journal_marks(ct)
            waited = [w for w in ct.run(["journalctl", "-b", "-o", "cat", "--no-pager", "-g",
                                         "to stop [(]its GPU group"],
                                        check=False).stdout.split("\n") if w.strip()]
        finally:
            ct.stop()
    bad = [row for row in served if row[1] != 200] + [row for row in cold if row[0] != 200]
    if bad:
        print("failed:", bad)
        return 1
    gaps = [(b[3] - a[4]) * 1e3 for a, b in zip(served[:-1], served[1:], strict=True)][1:]
    # each swap by systemd's lines: the old unit's stop begins, the new one's start begins,
    # the old one is inactive, the new one active
    after_stop, overlap, active_after = [], [], []
    for i, (when, what, preset) in enumerate(marks):
        if what != "Stopping":
            continue
        later = marks[i + 1:]
        start = next((m for m in later if m[1] == "Starting" and m[2] != preset), None)
        stopped = next((m for m in later if m[1] == "Stopped" and m[2] == preset), None)
        if start is None or stopped is None:
            continue
        started = next((m for m in later if m[1] == "Started" and m[2] == start[2]), None)
        after_stop.append((start[0] - when) * 1e3)
        overlap.append((stopped[0] - start[0]) * 1e3)
        if started is not None:
            active_after.append((started[0] - stopped[0]) * 1e3)
    after_stop, overlap, active_after = after_stop[1:], overlap[1:], active_after[1:]
    # the client's side of each swap against systemd's lines (one clock: CLOCK_MONOTONIC):
    # the old stream's last byte to the old unit's "Stopping" (the gateway's rule, the slot
    # save, the D-Bus call), the new unit's "Starting" to its "Started", and "Started" to
    # the new stream's first byte (READY=1 seen by the daemon, its signal, the gateway's
    # slot restore and the request)
    to_stopping, unit_start, to_first = [], [], []
    for a, b in list(zip(served[:-1], served[1:], strict=True))[1:]:
        stopping = next((m for m in marks if m[1] == "Stopping" and m[2] == a[0]
                         and a[4] <= m[0] <= b[3]), None)
        starting = next((m for m in marks if m[1] == "Starting" and m[2] == b[0]
                         and a[4] <= m[0] <= b[3]), None)
        started = next((m for m in marks if m[1] == "Started" and m[2] == b[0]
                        and a[4] <= m[0] <= b[3]), None)
        if stopping is not None:
            to_stopping.append((stopping[0] - a[4]) * 1e3)
        if starting is not None and started is not None:
            unit_start.append((started[0] - starting[0]) * 1e3)
        if started is not None:
            to_first.append((b[3] - started[0]) * 1e3)
    print(f"{len(gaps)} swaps alpha <-> beta under systemd ({args.tokens}-token streams), "
          "medians (spread):")
    print(f"  swap gap, last byte of a stream -> first byte of the next : {spread(gaps)}")
    print(f"  old unit 'Stopping' -> new unit 'Starting'                : {spread(after_stop)}")
    print(f"  new unit 'Starting' -> old unit 'Stopped' (overlap, > 0)   : {spread(overlap)}")
    print(f"  old unit 'Stopped' -> new unit 'Started'                  : {spread(active_after)}")
    print(f"  last byte -> old unit 'Stopping' (rule, slot save, the call) : "
          f"{spread(to_stopping)}")
    print(f"  new unit 'Starting' -> its 'Started' (its two steps)      : {spread(unit_start)}")
    print(f"  new unit 'Started' -> first byte (signal, slots, request) : {spread(to_first)}")
    print(f"  engine steps that waited for the old engine: {len(waited)}; the last: "
          f"{waited[-1] if waited else 'none'}")
    if cold:
        # each cold start by systemd's lines of alpha's unit: "Starting" to "Started" (its
        # two steps and the engine's load) and the rest: the gateway, the daemon, the
        # request after READY
        first, unit_part, rest = [], [], []
        for _status, sent, got in cold:
            first.append((got - sent) * 1e3)
            starting = next((m for m in marks if m[1] == "Starting" and m[2] == "alpha"
                             and sent <= m[0] <= got), None)
            started = next((m for m in marks if m[1] == "Started" and m[2] == "alpha"
                            and sent <= m[0] <= got), None)
            if starting is not None and started is not None:
                unit_part.append((started[0] - starting[0]) * 1e3)
                rest.append((got - sent) * 1e3 - unit_part[-1])
        print(f"{len(cold)} cold starts of alpha through the gateway (1 token), medians (spread):")
        print(f"  request -> first byte                                     : {spread(first)}")
        print(f"  alpha's unit 'Starting' -> 'Started' (its two steps, load) : "
              f"{spread(unit_part)}")
        print(f"  the rest (gateway, daemon, systemd's job, the request)   : {spread(rest)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
