"""A preset's replicas under the daemon's local runner (issue 47): the real engines of the
tiny model, each answering on its own port, driven over a private real dbus-daemon as an
operator (or the gateway's scaling rule) would: StartPreset starts [serve] replicas,
StartReplica one more up to max_replicas, StopReplica one, StopPreset every one, leaving
no process behind."""

from __future__ import annotations

import asyncio
import json
import os
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from dbus_fast import DBusError
from support.daemonkit import Running
from support.enginekit import free_ports, write_config, write_preset

from lokid.core.names import ERROR_PREFIX, MANAGER_INTERFACE, OBJECT_PATH, PRESET_INTERFACE
from lokid.core.names import preset_object_path as path_of

pytestmark = [pytest.mark.engine, pytest.mark.slow]


def answer(port: int) -> str:
    """The engine's completion of a two-token request on ``port`` ("" when it does not
    answer)."""
    body = json.dumps({"prompt": "a", "n_predict": 2}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/completion", body,
                                     {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return str(json.load(r).get("content", "")) or "(empty)"
    except OSError:
        return ""


def engine_children() -> list[str]:
    """The command lines of this process's children that run an engine or a preset's step
    (the daemon runs in it: its local runner's steps and engines are its children; its
    spare step, ``lokid engine -``, told no preset yet, runs no engine)."""
    out = []
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/children") as f:
                pids = f.read().split()
        except OSError:
            continue
        for pid in pids:
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    out.append(f.read().replace(b"\0", b" ").decode())
            except OSError:
                pass
    return [c for c in out if "llama-server" in c or " engine r" in c or " prestart " in c]


def engines_on(ports: range) -> list[str]:
    """Every process on this machine whose command line has ``--port P`` for P in
    ``ports`` (an engine left behind, wherever it was reparented)."""
    found = []
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        if any(a == "--port" and b.isdigit() and int(b) in ports
               for a, b in zip(argv, argv[1:], strict=False)):
            found.append(" ".join(argv))
    return found


async def rows(preset: Any) -> dict[int, dict[str, Any]]:
    return {int(r["index"].value): {k: v.value for k, v in r.items()}
            for r in await preset.get_replicas()}


async def wait_rows(preset: Any, want: dict[int, str], timeout: float = 120) -> dict[int, Any]:
    """The Replicas rows once each index in ``want`` is in its state."""
    deadline = time.monotonic() + timeout
    found: dict[int, Any] = {}
    while time.monotonic() < deadline:
        found = await rows(preset)
        if all(k in found and found[k]["state"] == s for k, s in want.items()):
            return found
        await asyncio.sleep(0.1)
    raise AssertionError(f"replicas not {want} in {timeout} s: {found}")


@pytest.fixture
def base() -> int:
    return free_ports(3)


@pytest.fixture
def config(tmp_path: Path, engine: str, models: Any, base: int) -> Path:
    config = write_config(tmp_path, engine, [models.dir])
    assert Path(models.llama).name == "llama.gguf"   # written on first use
    (tmp_path / "metrics").mkdir()
    toml = config / "lokid.toml"
    toml.write_text(toml.read_text().replace('metrics_textfile = ""', 'metrics_textfile = '
                                             f'"{tmp_path / "metrics" / "lokid.prom"}"'))
    write_preset(config, "r", f'model = "llama.gguf"\nctx = 512\nport = {base}\n'
                 "[serve]\nreplicas = 2\nmax_replicas = 3\n")
    # on the port of r's replica 3, which may start any time: refused before it starts
    # (the holder of a port no one started on is the first by name: r:3 before z)
    write_preset(config, "z", f'model = "llama.gguf"\nctx = 512\nport = {base + 2}\n')
    return config


async def metric(path: Path, line: str, timeout: float = 30) -> None:
    """Wait until the Prometheus textfile at ``path`` holds ``line``."""
    deadline = time.monotonic() + timeout
    text = ""
    while time.monotonic() < deadline:
        text = path.read_text() if path.exists() else ""
        if line in text.splitlines():
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"no {line!r} in {path}:\n{text}")


async def lokictl(address: str, capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """lokictl's output (its own event loop, in a thread: this one runs the daemon)."""
    from lokid.ctl.main import main

    capsys.readouterr()
    assert await asyncio.to_thread(main, ["--address", address, *args]) == 0
    return capsys.readouterr().out


async def test_replicas_start_answer_on_their_ports_and_stop_together(
        running: Running, base: int, tmp_path: Path, bus_address: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    manager = await running.iface(OBJECT_PATH, MANAGER_INTERFACE)
    preset = await running.iface(path_of("r"), PRESET_INTERFACE)
    assert await preset.get_max_replicas() == 3
    # a verdict recorded for a replica's start plans its preset again
    assert (await asyncio.to_thread(running.daemon.registry.refresh, "r:2")).name == "r"
    broken = await manager.get_broken_presets()
    assert list(broken) == ["z"] and f"port {base + 2} on 127.0.0.1 belongs to preset r:3" \
        in broken["z"]
    # no replica past the first while the preset itself does not run
    with pytest.raises(DBusError) as refused:
        await manager.call_start_replica("r")
    assert refused.value.type == ERROR_PREFIX + "Busy" and "start it first" in refused.value.text

    await manager.call_start_preset("r")
    await running.wait_event("r", "ready")
    found = await wait_rows(preset, {1: "ready", 2: "ready"})
    assert {k: (r["unit"], r["port"], r["url"]) for k, r in found.items()} == {
        1: ("loki-engine@r.service", base, f"http://127.0.0.1:{base}"),
        2: ("loki-engine@r:2.service", base + 1, f"http://127.0.0.1:{base + 1}")}
    assert answer(base) and answer(base + 1) and not answer(base + 2)
    assert len(engines_on(range(base, base + 3))) == 2
    # replicas are no presets: the preset is active once, its replicas are its Replicas
    assert await manager.get_active_presets() == ["r"]
    assert {e[0] for e in running.events} == {"r"}
    # Prometheus: the preset's engine as before, its replica with replica="2"
    prom = tmp_path / "metrics" / "lokid.prom"
    await metric(prom, 'lokid_engine_up{preset="r",model="llama.gguf",replica="2"} 1')
    await metric(prom, 'lokid_engine_up{preset="r",model="llama.gguf"} 1')
    # lokictl: status names both engines, replica list has a line each, top shows r:2
    assert f"replicas of r: 1 ready :{base}, 2 ready :{base + 1}" in \
        await lokictl(bus_address, capsys, "status")
    listed = (await lokictl(bus_address, capsys, "replica", "list", "r")).splitlines()
    assert [line.split()[:4] for line in listed[1:]] == [
        ["1", "loki-engine@r.service", "ready", str(base)],
        ["2", "loki-engine@r:2.service", "ready", str(base + 1)]]
    top = (await lokictl(bus_address, capsys, "top", "--once")).splitlines()
    assert any(line.split()[:2] == ["r:2", "ready"] for line in top), top

    # two asked at once: one gets replica 3, the other is told max_replicas run
    both = await asyncio.gather(manager.call_start_replica("r"),
                                manager.call_start_replica("r"), return_exceptions=True)
    assert 3 in both and any(isinstance(e, DBusError) and "max_replicas is 3" in e.text
                             for e in both), both
    await wait_rows(preset, {1: "ready", 2: "ready", 3: "ready"})
    assert answer(base + 2)
    with pytest.raises(DBusError) as full:
        await manager.call_start_replica("r")
    assert full.value.type == ERROR_PREFIX + "Busy" and "max_replicas is 3" in full.value.text

    with pytest.raises(DBusError) as own:
        await manager.call_stop_replica("r", 1)
    assert own.value.type == "org.freedesktop.DBus.Error.InvalidArgs"
    assert "replica 3 of r is stopping" in \
        await lokictl(bus_address, capsys, "replica", "stop", "r", "3")
    await wait_rows(preset, {1: "ready", 2: "ready", 3: "inactive"})
    assert not answer(base + 2) and answer(base + 1)
    # the index freed is the next one started
    assert await manager.call_start_replica("r") == 3
    await wait_rows(preset, {3: "loading"}, timeout=30)

    await manager.call_stop_preset("r")
    await running.wait_event("r", "inactive")
    await wait_rows(preset, {1: "inactive", 2: "inactive", 3: "inactive"})
    assert not answer(base) and not answer(base + 1) and not answer(base + 2)
    deadline = time.monotonic() + 30
    while (engine_children() or engines_on(range(base, base + 3))) \
            and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    assert engine_children() == [] and engines_on(range(base, base + 3)) == []


def test_a_preset_is_idle_only_when_every_replica_is(tmp_path: Path) -> None:
    """Its idle stop stops every replica: a request in flight on replica 2 holds the stop
    (and counts in RequestsInFlight) while the preset's own engine is idle; the deadline
    counts from the end of the last request on any of them. Real engine lines
    (tests/data/engine-logs: launch_slot_ and release), fed to the real meters."""
    from types import SimpleNamespace

    from lokid.core.serve.tables import Serve
    from lokid.dbus.idle import IdleStops
    from lokid.runners.runner import READY, EngineState
    from lokid.watch.meter import Meters

    launch = "0.07.629.506 I slot launch_slot_: id  2 | task 19 | processing task, is_child = 0"
    idle = "0.07.773.095 I srv  update_slots: all slots are idle"
    view = SimpleNamespace(serve=Serve(idle_stop=3.0, replicas=2, max_replicas=2))
    host = SimpleNamespace(runtime_dir=str(tmp_path), exported={},
                           registry=SimpleNamespace(presets={"r": view}),
                           engine_state=lambda name: EngineState(READY))
    meters = Meters(str(tmp_path))
    stops = IdleStops(host, meters)
    stops.on_state("r", EngineState(READY))
    ready_at = stops.clocks["r"].ready_at
    meters.feed("r", "a", "0.00.000.001 I main: server is listening", ready_at)
    assert stops.deadline("r") == ready_at + 3.0
    meters.feed("r:2", "b", launch, ready_at + 1)
    assert stops.deadline("r") is None and stops.in_flight("r") == 1
    meters.feed("r:2", "b", idle, ready_at + 5)
    assert stops.deadline("r") == ready_at + 8.0 and stops.in_flight("r") == 0


def test_a_replica_state_is_logged_once_per_change(caplog: pytest.LogCaptureFixture) -> None:
    """systemd reports a replica unit's ActiveState and its StatusText in two signals (the
    Unit's and the Service's PropertiesChanged), so the runner reports "ready" twice, its
    status alone changed: the operator walk's journal said "replica m:2: ready" twice
    per start. Logged once per state and detail, as the preset's own engine is."""
    import logging
    from types import SimpleNamespace

    from lokid.dbus.replicas import Replicas
    from lokid.runners.runner import INACTIVE, LOADING, READY, EngineState

    host = SimpleNamespace(exported={}, registry=SimpleNamespace(presets={}))
    replicas = Replicas(host)
    caplog.set_level(logging.INFO, logger="lokid.daemon")
    for state in [EngineState(LOADING, "starting m:2"), EngineState(LOADING, "loading m:2: 2 s"),
                  EngineState(READY, "loading m:2: 2 s"), EngineState(READY, "ready: m:2"),
                  EngineState(LOADING, "", "restarting after a failure"),
                  EngineState(LOADING, "starting m:2", "restarting after a failure"),
                  EngineState(READY, "ready: m:2"), EngineState(INACTIVE, "", "stopped")]:
        assert replicas.on_state("m:2", state)
    assert [r.getMessage() for r in caplog.records] == [
        "replica m:2: loading", "replica m:2: ready",
        "replica m:2: loading (restarting after a failure)", "replica m:2: ready",
        "replica m:2: inactive (stopped)"]


async def test_a_restart_rolls_through_the_replicas_one_at_a_time(running: Running) -> None:
    """RestartPreset (after an edit) restarts the preset's engine, then replica 2 once the
    engine answers again: at no moment are both down, and each runs a new start."""
    from lokid.store.runtimedir import read_runtime_plan

    manager = await running.iface(OBJECT_PATH, MANAGER_INTERFACE)
    preset = await running.iface(path_of("r"), PRESET_INTERFACE)
    runtime = running.daemon.runtime_dir
    await manager.call_start_preset("r")
    await wait_rows(preset, {1: "ready", 2: "ready"})
    before = {n: read_runtime_plan(runtime, n).invocation for n in ("r", "r:2")}
    states = running.daemon.runner.states   # type: ignore[union-attr]
    seen: list[tuple[str, str]] = []        # (r's state, r:2's state) at each look

    async def sample() -> None:
        while True:
            seen.append((states["r"].state, states["r:2"].state))
            await asyncio.sleep(0.005)

    sampler = asyncio.get_running_loop().create_task(sample())
    try:
        await manager.call_restart_preset("r")
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            now = {n: read_runtime_plan(runtime, n).invocation for n in ("r", "r:2")}
            if all(now[n] != before[n] for n in now) and seen[-1] == ("ready", "ready"):
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError(f"not both restarted in 120 s: {seen[-20:]}")
    finally:
        sampler.cancel()
    assert ("ready", "ready") in seen and not [s for s in seen if "ready" not in s], seen
    # the preset's own engine went first, its replica once it answered again
    first_down = next(i for i, s in enumerate(seen) if s[0] != "ready")
    second_down = next(i for i, s in enumerate(seen) if s[1] != "ready")
    assert first_down < second_down
    await manager.call_stop_preset("r")
    await wait_rows(preset, {1: "inactive", 2: "inactive"})


async def test_a_roll_asks_the_engine_when_the_log_count_is_stale(
        running: Running, config: Path, base: int, caplog: pytest.LogCaptureFixture) -> None:
    """A roll's drain waits while the engine's log counts a request in flight; a count
    left stale (the engine's release line late, as the journal delivers it: here a
    launch line fed with no release) is checked with the engine's /slots, which serves
    none: each engine is restarted at once, said in the journal, not after its whole drain
    ("passed with 1 requests in flight", the operator walk). Each replica's ready is
    logged once per start."""
    import logging

    from lokid.store.runtimedir import read_runtime_plan

    caplog.set_level(logging.INFO, logger="lokid.daemon")
    manager = await running.iface(OBJECT_PATH, MANAGER_INTERFACE)
    preset = await running.iface(path_of("r"), PRESET_INTERFACE)
    # a drain short enough that the code before this test waited it out in seconds
    write_preset(config, "r", f'model = "llama.gguf"\nctx = 512\nport = {base}\n'
                 '[serve]\nreplicas = 2\nmax_replicas = 3\ndrain = "6s"\n')
    await manager.call_reload()
    await manager.call_start_preset("r")
    await wait_rows(preset, {1: "ready", 2: "ready"})
    runtime = running.daemon.runtime_dir
    before = {n: read_runtime_plan(runtime, n).invocation for n in ("r", "r:2")}
    launch = "0.07.629.506 I slot launch_slot_: id  0 | task 9 | processing task, is_child = 0"
    for name, invocation in before.items():
        running.daemon.telemetry.on_line(name, invocation, launch, time.time())
    counts = {k: r["in_flight"] for k, r in (await rows(preset)).items() if k in (1, 2)}
    assert counts == {1: 1, 2: 1}   # what the bus shows, the engines serving nothing

    await manager.call_restart_preset("r")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        now = {n: read_runtime_plan(runtime, n).invocation for n in ("r", "r:2")}
        states = await rows(preset)
        if all(now[n] != before[n] for n in now) and \
                [states[k]["state"] for k in (1, 2)] == ["ready", "ready"]:
            break
        await asyncio.sleep(0.1)
    else:
        raise AssertionError("r and r:2 not both restarted in 120 s")
    said = [r.getMessage() for r in caplog.records if r.name == "lokid.daemon"]
    assert not [m for m in said if "passed with" in m], said
    for name in ("r", "r:2"):
        assert f"{name}: drained: its log still counts 1 requests in flight, its engine's " \
            "/slots serves none (the count is stale)" in said, said
    # each state of r:2 said once as it comes (the local runner reports STATUS= while it
    # loads: "loading (starting)" was said three times a start), ready once per start
    lines = [m for m in said if m.startswith("replica r:2: ")]
    assert lines.count("replica r:2: ready") == 2, lines
    assert all(a != b for a, b in zip(lines, lines[1:], strict=False)), lines
    await manager.call_stop_preset("r")
    await wait_rows(preset, {1: "inactive", 2: "inactive"})
