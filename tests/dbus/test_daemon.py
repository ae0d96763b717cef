"""The daemon's read-only D-Bus API on a private real dbus-daemon, with the real engine.

In-process tests run lokid.dbus.daemon.Daemon in the test's event loop and talk to it
with a dbus-fast client; one test runs `lokid daemon` as a process and checks
readiness (READY=1 only once the name is owned) and SIGHUP reloads with busctl.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from dbus_fast import DBusError
from support.daemonkit import Running
from support.enginekit import NotifyListener, free_port, write_config, write_preset

from lokid import __version__
from lokid.core.names import (
    BUS_NAME,
    ERROR_PREFIX,
    MANAGER_INTERFACE,
    OBJECT_PATH,
    PRESET_INTERFACE,
    preset_object_path,
)
from lokid.dbus import interfaces
from lokid.store.state import Mark, StateDB

pytestmark = pytest.mark.engine


@pytest.fixture
def config(tmp_path: Path, engine: str, models: Any) -> Path:
    config = write_config(tmp_path, engine, [models.dir])
    assert Path(models.llama).name == "llama.gguf"  # written on first use
    # two ports: of presets on one port, one is broken (tests/dbus/test_unstartable.py)
    write_preset(config, "tiny-llama.v1_a", 'model = "llama.gguf"\nctx = 2048\n'
                 f'port = {free_port()}\n[spec]\nmode = "ngram"\n')
    write_preset(config, "mtp", f'model = "{models.mtp_full}"\nctx = 2048\n'
                 f'port = {free_port()}\n[spec]\nmode = "auto"\n')
    write_preset(config, "broken", 'model = "llama.gguf"\nctx = "big"\n')
    write_preset(config, "nomodel", 'model = "absent.gguf"\n')
    return config


def test_every_exported_method_declares_who_may_call_it() -> None:
    for cls in (interfaces.ManagerInterface, interfaces.PresetInterface):
        methods = [m for m in cls.__dict__.values() if hasattr(m, "__dict__")
                   and any(k.startswith("__DBUS_METHOD") for k in m.__dict__)]
        assert methods, cls
        for m in methods:
            assert getattr(m, interfaces.ACCESS_ATTR, None) in (
                interfaces.READ, interfaces.MANAGE, interfaces.BENCH, interfaces.EDIT,
                interfaces.READ_LOGS), m


async def test_manager_properties_and_get_preset(running: Running) -> None:
    manager = await running.iface(OBJECT_PATH, MANAGER_INTERFACE)
    assert await manager.get_version() == __version__
    assert await manager.get_presets() == sorted(
        preset_object_path(n) for n in ("mtp", "nomodel", "tiny-llama.v1_a"))
    # every preset that cannot start: the file that does not parse (no object), and the
    # one that parses but cannot be planned (its object stays)
    broken = await manager.get_broken_presets()
    assert list(broken) == ["broken", "nomodel"] and "broken.toml:2: ctx: must be an " \
        "integer" in broken["broken"]
    assert "'absent.gguf' is in none of model_dirs" in broken["nomodel"]
    path = await manager.call_get_preset("tiny-llama.v1_a")
    assert path == "/org/lokid/Lokid1/preset/tiny_2dllama_2ev1_5fa"


@pytest.mark.parametrize("name,error,fragment", [
    ("nope", "NotFound", "no preset 'nope'"),
    ("broken", "InvalidPreset", "ctx: must be an integer"),
])
async def test_errors_have_names_and_messages(running: Running, name: str, error: str,
                                              fragment: str) -> None:
    manager = await running.iface(OBJECT_PATH, MANAGER_INTERFACE)
    with pytest.raises(DBusError) as exc:
        await manager.call_get_preset(name)
    assert exc.value.type == ERROR_PREFIX + error
    assert fragment in exc.value.text and "Traceback" not in exc.value.text


async def test_preset_object_and_its_plan(running: Running, engine: str) -> None:
    preset = await running.iface(preset_object_path("tiny-llama.v1_a"), PRESET_INTERFACE)
    assert await preset.get_name() == "tiny-llama.v1_a"
    assert await preset.get_model() == "llama.gguf"
    assert await preset.get_unit() == "loki-engine@tiny-llama.v1_a.service"
    assert await preset.get_spec_mode() == "ngram"
    argv = await preset.get_argv()
    assert argv[0] == os.path.realpath(engine) and "ngram-mod" in argv
    plan = await preset.call_plan()
    assert plan["argv"].value == argv
    assert plan["spec"].value["types"].value == ["ngram-mod"]
    assert plan["spec"].value["auto"].value is False
    assert await preset.get_auto_spec_blocked() == ""


async def test_a_preset_that_cannot_be_planned_says_why(running: Running) -> None:
    preset = await running.iface(preset_object_path("nomodel"), PRESET_INTERFACE)
    assert await preset.get_argv() == []
    assert "'absent.gguf' is in none of model_dirs" in (await preset.get_notes())[0]
    with pytest.raises(DBusError) as exc:
        await preset.call_plan()
    assert exc.value.type == ERROR_PREFIX + "InvalidPreset"
    assert "absent.gguf" in exc.value.text


async def test_an_unexpected_error_crosses_the_bus_without_its_traceback(
        running: Running, monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(self: Any, name: str) -> Any:
        raise KeyError("internal detail")

    monkeypatch.setattr(type(running.daemon.registry), "get", boom)
    manager = await running.iface(OBJECT_PATH, MANAGER_INTERFACE)
    with pytest.raises(DBusError) as exc:
        await manager.call_get_preset("tiny-llama.v1_a")
    assert exc.value.type == ERROR_PREFIX + "Failed"
    assert "internal detail" not in exc.value.text and "Traceback" not in exc.value.text


async def test_a_recorded_verdict_is_served_and_signalled(running: Running, tmp_path: Path
                                                          ) -> None:
    manager = await running.iface(OBJECT_PATH, MANAGER_INTERFACE)
    preset = await running.iface(preset_object_path("mtp"), PRESET_INTERFACE)
    assert "draft-mtp" in await preset.get_argv()
    received: list[tuple[str, str]] = []
    manager.on_verdict_recorded(lambda p, r: received.append((p, r)))
    # what the journal watcher does for an auto launch with layers in RAM:
    # record the failure for the mark the next start would use, then tell the daemon
    view = running.daemon.registry.get("mtp")
    from lokid.core.launch.plan import build_plan, config_fingerprint
    from lokid.planning.gather import gather

    inputs = gather(running.daemon.registry.config_dir, "mtp")
    mark = Mark(config_fingerprint(build_plan(inputs), inputs.model), inputs.caps.path,
                inputs.caps.build)
    with StateDB(str(tmp_path / "state")) as db:
        db.record_failure("mtp", mark, "only 0/3 layers on GPU with the draft")
    from lokid.watch.journalwatch import AutoCut

    running.daemon._on_verdict(AutoCut("mtp", "inv", "only 0/3 layers on GPU with the draft"))
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not (
            received and await preset.get_auto_spec_blocked()):
        await asyncio.sleep(0.05)
    assert received == [("mtp", "only 0/3 layers on GPU with the draft")]
    assert await preset.get_auto_spec_blocked() == "only 0/3 layers on GPU with the draft"
    assert "draft-mtp" not in await preset.get_argv()
    assert view.plan is not None and "draft-mtp" in view.plan.argv


def busctl(address: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["busctl", f"--address={address}", *args], capture_output=True,
                          text=True, timeout=30)


def test_daemon_process_is_ready_only_once_its_name_is_owned_and_reloads_on_sighup(
        config: Path, tmp_path: Path, bus_address: str) -> None:
    notify = NotifyListener(tmp_path / "notify")
    env = {**os.environ, "LOKI_STATE_DIR": str(tmp_path / "state"),
           "LOKI_RUNTIME_DIR": str(tmp_path / "run"), "NOTIFY_SOCKET": notify.path}
    proc = subprocess.Popen([sys.executable, "-m", "lokid.cli", "--config-dir", str(config),
                             "daemon", "--bus", "session", "--bus-address", bus_address],
                            env=env, stderr=subprocess.PIPE, text=True)
    try:
        notify.wait_for("READY=1", timeout=60)
        # the name is owned at READY: the first call needs no retry
        r = busctl(bus_address, "--json=short", "get-property", BUS_NAME, OBJECT_PATH,
                   MANAGER_INTERFACE, "Presets")
        assert r.returncode == 0, r.stderr
        assert len(json.loads(r.stdout)["data"]) == 3
        # broken: the file that does not parse and nomodel, which cannot be planned
        assert notify.wait_for("STATUS=serving 3 presets, 2 broken")
        write_preset(config, "added", 'model = "llama.gguf"\nctx = 2048\n')
        proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            r = busctl(bus_address, "--json=short", "call", BUS_NAME, OBJECT_PATH,
                       MANAGER_INTERFACE, "GetPreset", "s", "added")
            if r.returncode == 0:
                break
            time.sleep(0.1)
        assert json.loads(r.stdout)["data"] == [preset_object_path("added")], r.stderr
        r = busctl(bus_address, "introspect", BUS_NAME, preset_object_path("added"))
        assert ".Plan" in r.stdout and ".AutoSpecBlocked" in r.stdout
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        assert "STOPPING=1" in notify.messages
    finally:
        if proc.poll() is None:
            proc.kill()
        notify.close()


async def test_an_engine_slow_on_help_does_not_hold_the_daemon(tmp_path: Path, engine: str,
                                                                models: Any,
                                                                bus_address: str) -> None:
    """The engine answers --help only after 4 s (a slow CUDA initialisation, or a hang):
    the daemon is on the bus before, its presets saying why they have no plan yet, and
    they are planned (PropertiesChanged) when the probe ends."""
    from support.daemonkit import daemon_on

    slow = tmp_path / "slow-engine"
    slow.write_text(f'#!/bin/sh\ncase " $* " in *" --help "*) sleep 4;; esac\n'
                    f'exec {engine} "$@"\n')
    slow.chmod(0o755)
    config = write_config(tmp_path, str(slow), [models.dir])
    assert Path(models.llama).name == "llama.gguf"  # written on first use
    for i in range(20):
        write_preset(config, f"p{i}", f'model = "llama.gguf"\nport = {21000 + i}\n')
    t0 = time.monotonic()
    async with daemon_on(config, tmp_path, bus_address) as running:
        on_bus = time.monotonic() - t0
        preset = await running.iface(preset_object_path("p7"), PRESET_INTERFACE)
        (note,) = await preset.get_notes()
        assert "has not answered --help yet" in note, note
        assert await preset.get_argv() == []
        assert on_bus < 4, on_bus  # not a timing goal: the probe alone takes 4 s
        for _ in range(300):
            argv = await preset.get_argv()
            if argv:
                break
            await asyncio.sleep(0.1)
        assert argv and argv[0] == str(slow), argv


async def test_a_presets_directory_that_cannot_be_listed_leaves_the_daemon_up(
        tmp_path: Path, engine: str, bus_address: str) -> None:
    """presets/ made a file by mistake: the daemon still takes its name, serves no
    preset, and its status says why."""
    from support.daemonkit import daemon_on

    config = write_config(tmp_path, engine, [tmp_path])
    (config / "presets").rmdir()
    (config / "presets").write_text("not a directory\n")
    async with daemon_on(config, tmp_path, bus_address) as running:
        manager = await running.iface(OBJECT_PATH, MANAGER_INTERFACE)
        assert await manager.get_presets() == []
        assert running.daemon.status().startswith("serving no presets: ")
        assert "cannot list the presets: Not a directory" in running.daemon.status()


async def test_one_preset_is_served_in_the_singular(tmp_path: Path, engine: str, models: Any,
                                                     bus_address: str) -> None:
    """The daemon's status (systemd's StatusText) counts as a sentence does."""
    from support.daemonkit import daemon_on

    config = write_config(tmp_path, engine, [models.dir])
    write_preset(config, "only", f'model = "llama.gguf"\nctx = 2048\nport = {free_port()}\n')
    async with daemon_on(config, tmp_path, bus_address) as running:
        assert running.daemon.status() == "serving 1 preset"


def test_every_action_is_declared_to_polkit_and_let_in_for_group_loki() -> None:
    """An action the interfaces check must be in data/polkit/org.lokid.lokid1.policy (polkit
    refuses an unknown one) and in 50-lokid.rules (or group loki is asked to authenticate)."""
    import xml.etree.ElementTree as ET

    from support import REPO

    declared = {a.get("id") for a in ET.parse(REPO / "data" / "polkit" /
                                              "org.lokid.lokid1.policy").getroot()
                if a.tag == "action"}
    rules = (REPO / "data" / "polkit" / "50-lokid.rules").read_text()
    used = {interfaces.MANAGE, interfaces.BENCH, interfaces.EDIT, interfaces.READ_LOGS}
    assert used <= declared, used - declared
    for action in used:
        assert f'"{action}"' in rules, action
