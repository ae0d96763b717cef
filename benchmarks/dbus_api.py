#!/usr/bin/env python3
"""The daemon's D-Bus API: call latency, memory and idle CPU, against the bus itself.

On a private real dbus-daemon, with `lokid daemon` serving one generated preset:

- whole-process `busctl get-property … Manager Version` (what a script pays),
  side by side with `busctl call org.freedesktop.DBus … GetId` (the bus
  daemon answering itself: the floor of any D-Bus service), median of N runs;
- in-process calls from one dbus-fast client paced at 500/s: p50 and p99 of
  Properties.Get on lokid, and of GetId on the bus daemon;
- the daemon's resident memory, and its CPU over an idle period;
- then, the way it is used: ``StartPreset`` through the bus until
  ``EngineStateChanged(ready)`` (the local runner: prestart and engine as the
  daemon's children), side by side with the raw llama-server started on the
  same command line until ``/health`` answers 200; and the daemon's RSS and
  idle CPU while that engine runs (its output pipe and notify socket open).

Goals (issue 4): busctl median <= 10 ms, in-process p99 <= 5 ms, RSS <= 45 MB,
idle CPU <= 0.1 % (with and without a running engine). Exits 1 when a goal is
missed.

    .venv/bin/python benchmarks/dbus_api.py [--runs 30] [--calls 1000] [--idle 60]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from dbus_fast import Message, MessageType  # noqa: E402
from dbus_fast.aio import MessageBus  # noqa: E402
from support.enginekit import NotifyListener, tiny_config  # noqa: E402

from lokid.core.names import BUS_NAME, MANAGER_INTERFACE, OBJECT_PATH  # noqa: E402

BUS_DAEMON = ("org.freedesktop.DBus", "/org/freedesktop/DBus", "org.freedesktop.DBus")


def busctl_ms(address: str, args: list[str], runs: int) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(["busctl", f"--address={address}", *args], check=True,
                       capture_output=True)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000


async def paced_calls(address: str, message: Message, calls: int, rate: float) -> list[float]:
    bus = await MessageBus(bus_address=address).connect()
    latencies = []
    start = time.perf_counter()
    for i in range(calls):
        target = start + i / rate
        delay = target - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        t0 = time.perf_counter()
        reply = await bus.call(message)
        latencies.append(time.perf_counter() - t0)
        assert reply is not None and reply.message_type == MessageType.METHOD_RETURN, reply
    bus.disconnect()
    return latencies


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


def proc_rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def proc_cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def start_until_ready(address: str) -> float:
    """StartPreset("tiny") → EngineStateChanged("tiny", "ready"), in seconds."""
    bus = await MessageBus(bus_address=address).connect()
    ready = asyncio.Event()

    def on_message(msg: Message) -> bool:
        if msg.member == "EngineStateChanged" and msg.body[:2] == ["tiny", "ready"]:
            ready.set()
        return False

    bus.add_message_handler(on_message)
    await bus.call(Message(destination="org.freedesktop.DBus", path="/org/freedesktop/DBus",
                           interface="org.freedesktop.DBus", member="AddMatch", signature="s",
                           body=[f"type='signal',sender='{BUS_NAME}',"
                                 "member='EngineStateChanged'"]))
    t0 = time.perf_counter()
    reply = await bus.call(Message(destination=BUS_NAME, path=OBJECT_PATH,
                                   interface=MANAGER_INTERFACE, member="StartPreset",
                                   signature="s", body=["tiny"]))
    assert reply is not None and reply.message_type == MessageType.METHOD_RETURN, reply
    await asyncio.wait_for(ready.wait(), 120)
    took = time.perf_counter() - t0
    bus.disconnect()
    return took


def raw_ready_s(argv: Sequence[str], port: int) -> float:
    """The same engine command line, started directly, until /health answers 200."""
    from lokid.planning.endpoint import health_status

    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while health_status("127.0.0.1", port, timeout=1.0) != 200:
            assert proc.poll() is None, "the engine exited"
            time.sleep(0.002)
        return time.perf_counter() - t0
    finally:
        proc.terminate()
        proc.wait(30)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--calls", type=int, default=1000)
    ap.add_argument("--idle", type=float, default=60.0)
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        from support.enginekit import free_port

        port = free_port()
        config = tiny_config(root, "tiny", f"port = {port}\n")
        bus = subprocess.Popen(["dbus-daemon", "--session", "--nofork", "--print-address",
                                f"--address=unix:path={root / 'bus'}"],
                               stdout=subprocess.PIPE, text=True)
        assert bus.stdout is not None
        address = bus.stdout.readline().strip()
        notify = NotifyListener(root / "notify")
        daemon = subprocess.Popen(
            [sys.executable, "-m", "lokid.cli", "--config-dir", str(config), "daemon",
             "--bus", "session", "--bus-address", address],
            env={**os.environ, "LOKI_STATE_DIR": str(root / "state"),
                 "LOKI_RUNTIME_DIR": str(root / "run"), "NOTIFY_SOCKET": notify.path,
                 "PYTHONPATH": str(ROOT)},
            stderr=subprocess.DEVNULL)
        try:
            notify.wait_for("READY=1", timeout=60)
            lokid_busctl = busctl_ms(address, ["get-property", BUS_NAME, OBJECT_PATH,
                                               MANAGER_INTERFACE, "Version"], args.runs)
            bus_busctl = busctl_ms(address, ["call", *BUS_DAEMON, "GetId"], args.runs)
            get = Message(destination=BUS_NAME, path=OBJECT_PATH,
                          interface="org.freedesktop.DBus.Properties", member="Get",
                          signature="ss", body=[MANAGER_INTERFACE, "Version"])
            get_id = Message(destination=BUS_DAEMON[0], path=BUS_DAEMON[1],
                             interface=BUS_DAEMON[2], member="GetId")
            lokid_lat = asyncio.run(paced_calls(address, get, args.calls, 500))
            bus_lat = asyncio.run(paced_calls(address, get_id, args.calls, 500))
            rss = proc_rss_mb(daemon.pid)
            cpu0, t0 = proc_cpu_s(daemon.pid), time.monotonic()
            time.sleep(args.idle)
            idle = (proc_cpu_s(daemon.pid) - cpu0) / (time.monotonic() - t0) * 100

            from lokid.planning.gather import make_plan

            argv = make_plan(str(config), "tiny").argv
            raw = statistics.median(raw_ready_s(argv, port) for _ in range(3))
            via_bus = asyncio.run(start_until_ready(address))
            rss_engine = proc_rss_mb(daemon.pid)
            cpu0, t0 = proc_cpu_s(daemon.pid), time.monotonic()
            time.sleep(args.idle)
            idle_engine = (proc_cpu_s(daemon.pid) - cpu0) / (time.monotonic() - t0) * 100
        finally:
            daemon.terminate()
            daemon.wait(30)
            bus.terminate()
            bus.wait(10)
            notify.close()

    print(f"busctl whole process, median of {args.runs}: lokid get-property "
          f"{lokid_busctl:.1f} ms, bus daemon GetId {bus_busctl:.1f} ms "
          f"(ratio {lokid_busctl / bus_busctl:.2f}x; goal <= 10 ms)")
    print(f"in-process at 500/s, {args.calls} calls: lokid Properties.Get "
          f"p50 {pct(lokid_lat, 0.5):.2f} ms p99 {pct(lokid_lat, 0.99):.2f} ms; "
          f"bus daemon GetId p50 {pct(bus_lat, 0.5):.2f} ms p99 {pct(bus_lat, 0.99):.2f} ms "
          "(goal p99 <= 5 ms)")
    print(f"daemon RSS {rss:.1f} MB (goal <= 45 MB); idle CPU over {args.idle:.0f} s "
          f"{idle:.3f} % (goal <= 0.1 %)")
    print(f"StartPreset to EngineStateChanged(ready): {via_bus * 1000:.0f} ms; the raw engine "
          f"on the same command line to /health 200: {raw * 1000:.0f} ms (median of 3; "
          f"ratio {via_bus / raw:.2f}x, +{(via_bus - raw) * 1000:.0f} ms)")
    print(f"with that engine running: daemon RSS {rss_engine:.1f} MB, idle CPU over "
          f"{args.idle:.0f} s {idle_engine:.3f} %")
    ok = (lokid_busctl <= 10 and pct(lokid_lat, 0.99) <= 5 and max(rss, rss_engine) <= 45
          and max(idle, idle_engine) <= 0.1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
