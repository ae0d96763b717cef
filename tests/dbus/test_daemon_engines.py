"""The daemon's verbs with its local runner: the real engine started, watched and stopped over a
private real dbus-daemon.

On a session bus the daemon runs ``lokid prestart`` and ``lokid engine`` as its own
children (lokid.runners.local_runner); these tests drive it only through D-Bus and check what
an operator would see: EngineStateChanged in order, the properties, the engine
answering HTTP, restarts after a crash, and the refusals.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from dbus_fast import DBusError
from dbus_fast.aio import MessageBus
from support import DATA
from support.daemonkit import Running, daemon_on
from support.enginekit import deaf_engine, free_port, write_config, write_preset
from support.polkit_standin import PolkitStandIn

from lokid.core.names import (
    BUS_NAME,
    ERROR_PREFIX,
    MANAGER_INTERFACE,
    OBJECT_PATH,
    PRESET_INTERFACE,
    preset_object_path,
)
from lokid.host.proc import resident_kib
from lokid.runners import local_runner
from lokid.store.state import StateDB

pytestmark = [pytest.mark.engine, pytest.mark.slow]

LOGS = DATA / "engine-logs"


@pytest.fixture
def ports() -> dict[str, int]:
    return {"ngram": free_port(), "plain": free_port(), "auto": free_port()}


@pytest.fixture
def config(tmp_path: Path, engine: str, models: Any, ports: dict[str, int]) -> Path:
    config = write_config(tmp_path, engine, [models.dir])
    assert Path(models.llama).name == "llama.gguf"
    write_preset(config, "ngram", f'model = "llama.gguf"\nctx = 2048\nport = {ports["ngram"]}\n'
                 '[spec]\nmode = "ngram"\n')
    write_preset(config, "plain", f'model = "llama.gguf"\nctx = 2048\nport = {ports["plain"]}\n')
    write_preset(config, "nomodel", 'model = "absent.gguf"\n')
    return config


def health(port: int) -> int | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
            return int(r.status)
    except OSError:
        return None


def children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(p) for p in f.read().split()]


async def test_start_and_stop_through_the_bus(running: Running, ports: dict[str, int]) -> None:
    manager = await running.iface(OBJECT_PATH, MANAGER_INTERFACE)
    preset = await running.iface(preset_object_path("ngram"), PRESET_INTERFACE)
    assert await preset.get_state() == "inactive" and await manager.get_active_presets() == []
    await manager.call_start_preset("ngram")
    await running.wait_event("ngram", "ready")
    states = [ev[1] for ev in running.events if ev[0] == "ngram"]
    assert states[0] == "loading" and states[-1] == "ready" and "failed" not in states
    assert health(ports["ngram"]) == 200
    assert await preset.get_state() == "ready"
    assert (await preset.get_status()).startswith("ready: ngram (llama.gguf) at http://")
    assert await preset.get_spec_active() == ["ngram-mod"]
    assert await manager.get_active_presets() == ["ngram"]
    # starting what runs is a no-op, as with systemctl start
    seen = len(running.events)
    await manager.call_start_preset("ngram")
    await asyncio.sleep(0.5)
    assert running.events[seen:] == []

    await manager.call_stop_preset("ngram")
    ev = await running.wait_event("ngram", "inactive", after=seen)
    assert [e[1] for e in running.events[seen:] if e[0] == "ngram"] == ["stopping", "inactive"]
    assert ev[2] == "stopped"
    assert health(ports["ngram"]) is None
    assert await manager.get_active_presets() == [] and await preset.get_spec_active() == []


async def test_a_crashed_engine_is_restarted_and_a_restart_gives_a_new_engine(
        running: Running, ports: dict[str, int], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(local_runner, "RESTART_SEC", 0.5)
    manager = await running.iface(OBJECT_PATH, MANAGER_INTERFACE)
    await manager.call_start_preset("plain")
    await running.wait_event("plain", "ready")
    runner = running.daemon.runner
    assert isinstance(runner, local_runner.LocalRunner)
    proc = runner.engines["plain"].proc
    assert proc is not None
    (engine_pid,) = children(proc.pid)
    seen = len(running.events)
    os.kill(engine_pid, signal.SIGKILL)  # what an engine crash looks like to its supervisor
    ev = await running.wait_event("plain", "loading", after=seen)
    assert "restarting in 0.5 s: restart after a failure (1 of 5 " in ev[2]
    assert "the last: the engine exited with status 137" in ev[2], ev
    await running.wait_event("plain", "ready", after=seen)
    assert health(ports["plain"]) == 200

    proc = runner.engines["plain"].proc
    assert proc is not None
    before = children(proc.pid)
    seen = len(running.events)
    await manager.call_restart_preset("plain")
    await running.wait_event("plain", "ready", after=seen)
    assert [e[1] for e in running.events[seen:]] == ["stopping", "loading", "ready"]
    proc = runner.engines["plain"].proc
    assert proc is not None and children(proc.pid) != before
    await manager.call_stop_preset("plain")
    await running.wait_event("plain", "inactive", after=seen)


async def test_the_local_runner_samples_its_engine_for_the_thrash_hint(
        running: Running) -> None:
    # the engine is the daemon's grandchild, of its own user: its /proc files, no port scan
    manager = await running.iface(OBJECT_PATH, MANAGER_INTERFACE)
    runner = running.daemon.runner
    assert isinstance(runner, local_runner.LocalRunner)
    assert await runner.io_sampler("plain") is None  # not started
    await manager.call_start_preset("plain")
    await running.wait_event("plain", "ready")
    proc = runner.engines["plain"].proc
    assert proc is not None
    (engine_pid,) = children(proc.pid)
    sampler = await runner.io_sampler("plain")
    assert sampler is not None
    sample = await sampler()
    after = read_bytes(engine_pid)
    assert sample is not None and sample.memory == "engine RSS"
    # the engine's own figures, not its supervisor's: between what /proc says around them
    assert 0 <= sample.read_bytes <= after
    rss = resident_kib(engine_pid)
    assert sample.memory_bytes is not None and rss is not None
    assert abs(sample.memory_bytes - rss * 1024) <= rss * 1024 // 4, (sample, rss)
    again = await sampler()
    assert again is not None and again.read_bytes >= sample.read_bytes
    seen = len(running.events)
    await manager.call_stop_preset("plain")
    await running.wait_event("plain", "inactive", after=seen)
    assert await sampler() is None  # the process is gone: no figure, never an old one
    assert await runner.io_sampler("plain") is None


def read_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("read_bytes:"))


async def test_a_failed_prestart_is_final_and_says_why(running: Running,
                                                       ports: dict[str, int]) -> None:
    manager = await running.iface(OBJECT_PATH, MANAGER_INTERFACE)
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports["plain"]))
        s.listen()
        await manager.call_start_preset("plain")
        ev = await running.wait_event("plain", "failed")
    assert ev[2].startswith("cannot start: port ") and "already in use" in ev[2], ev
    await asyncio.sleep(0.5)
    assert [e[1] for e in running.events] == ["loading", "failed"]
    assert await manager.get_active_presets() == []


async def test_each_verb_ends_its_job_with_the_outcome(running: Running,
                                                      ports: dict[str, int]) -> None:
    """JobFinished is what `lokictl --wait` follows: a restart ends at ready, not at the
    stopping it passes through; a failed start ends failed, with why."""
    manager = await running.iface(OBJECT_PATH, MANAGER_INTERFACE)
    job = await manager.call_start_preset("plain")
    assert (await running.wait_job(job))[2:5] == ("start", "done", "ready")
    again = await manager.call_start_preset("plain")  # runs already: done at once
    assert again != job and (await running.wait_job(again))[3:5] == ("done", "ready")
    seen = len(running.events)
    job = await manager.call_restart_preset("plain")
    assert (await running.wait_job(job))[2:5] == ("restart", "done", "ready")
    states = [e[1] for e in running.events[seen:]]
    assert states[0] == "stopping" and states[-1] == "ready" and "failed" not in states
    job = await manager.call_stop_preset("plain")
    assert (await running.wait_job(job))[2:5] == ("stop", "done", "inactive")
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports["plain"]))
        s.listen()
        job = await manager.call_start_preset("plain")
        _, _, verb, result, state, detail = await running.wait_job(job)
    assert (verb, result, state) == ("start", "failed", "failed")
    assert "already in use" in detail


async def test_a_stop_while_loading_leaves_automatic_speculation_allowed(
        tmp_path: Path, engine: str, models: Any, ports: dict[str, int],
        bus_address: str) -> None:
    """Under the local runner as under the unit: the operator's stop is no failure."""
    slow = tmp_path / "slow-engine"
    slow.write_text(f'#!/bin/sh\ncase "$1" in --help|--version) exec {engine} "$@";; esac\n'
                    f'sleep 30\nexec {engine} "$@"\n')
    slow.chmod(0o755)
    config = write_config(tmp_path, str(slow), [models.dir])
    write_preset(config, "auto", f'model = "{Path(models.mtp_full).name}"\nctx = 2048\n'
                 f'port = {ports["auto"]}\n[spec]\nmode = "auto"\n')
    async with daemon_on(config, tmp_path, bus_address) as running:
        manager = await running.iface(OBJECT_PATH, MANAGER_INTERFACE)
        preset = await running.iface(preset_object_path("auto"), PRESET_INTERFACE)
        await manager.call_start_preset("auto")
        deadline = time.monotonic() + 30
        while not (tmp_path / "run" / "auto.json").exists():
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        with StateDB(str(tmp_path / "state")) as db:
            assert db.attempt("auto") is not None  # the launch is under way
        job = await manager.call_stop_preset("auto")
        assert (await running.wait_job(job))[3:5] == ("done", "inactive")
        with StateDB(str(tmp_path / "state")) as db:
            assert db.attempt("auto") is None and db.failures("auto") == []
        assert await preset.get_auto_spec_blocked() == ""
        assert "draft-mtp" in " ".join(await preset.get_argv())


@pytest.mark.parametrize("name,error", [
    ("nope", "NotFound"), ("../etc/passwd", "NotFound"), ("x" * 300, "NotFound"),
    ("nomodel", "InvalidPreset"),
])
async def test_what_cannot_start_is_refused_with_a_reason(running: Running, name: str,
                                                          error: str) -> None:
    manager = await running.iface(OBJECT_PATH, MANAGER_INTERFACE)
    with pytest.raises(DBusError) as exc:
        await manager.call_start_preset(name)
    assert exc.value.type == ERROR_PREFIX + error
    assert len(exc.value.text) < 400 and "Traceback" not in exc.value.text
    assert running.events == []


async def test_clear_failures_forgets_the_recorded_cut(running: Running, tmp_path: Path) -> None:
    from lokid.store.state import Mark

    with StateDB(str(tmp_path / "state")) as db:
        db.record_failure("plain", Mark("f" * 16, "/e", 1), "layers in RAM")
        db.record_failure("plain", Mark("e" * 16, "/e", 1), "layers in RAM")
    preset = await running.iface(preset_object_path("plain"), PRESET_INTERFACE)
    assert await preset.call_clear_failures() == 2
    assert await preset.call_clear_failures() == 0
    with StateDB(str(tmp_path / "state")) as db:
        assert db.failures("plain") == []


async def test_reload_over_the_bus_serves_a_new_preset(running: Running, config: Path) -> None:
    manager = await running.iface(OBJECT_PATH, MANAGER_INTERFACE)
    write_preset(config, "added", 'model = "llama.gguf"\nctx = 2048\n')
    (config / "presets" / "plain.toml").unlink()
    await manager.call_reload()
    assert preset_object_path("added") in await manager.get_presets()
    assert preset_object_path("plain") not in await manager.get_presets()


def fit_wrapper(root: Path, engine: str) -> Path:
    """An engine that prints a recorded --fit load (layers pushed to RAM with a draft,
    Vulkan lavapipe: tests/data/engine-logs/README.md), then runs the real one with its
    own log silenced (a CPU build's load would read as a second, GPU-less load)."""
    log = LOGS / "vulkan-lavapipe-fit-target-lv4.log"
    path = root / "fit-engine"
    path.write_text(f"#!{sys.executable}\n"
                    "import os, sys\n"
                    "if not {'--help', '--version'} & set(sys.argv):\n"
                    f"    sys.stderr.write(open({str(log)!r}).read())\n"
                    "    sys.stderr.flush()\n"
                    "    os.dup2(os.open(os.devnull, os.O_WRONLY), 2)\n"
                    f"os.execv({engine!r}, [{engine!r}] + sys.argv[1:])\n")
    path.chmod(0o755)
    return path


async def test_layers_in_ram_seen_in_the_engine_pipe_cut_auto_speculation(
        tmp_path: Path, engine: str, models: Any, bus_address: str) -> None:
    config = write_config(tmp_path, str(fit_wrapper(tmp_path, engine)), [models.dir])
    write_preset(config, "auto", f'model = "{models.mtp_full}"\nctx = 2048\n'
                 f'port = {free_port()}\n[spec]\nmode = "auto"\n')
    async with daemon_on(config, tmp_path, bus_address) as running:
        manager = await running.iface(OBJECT_PATH, MANAGER_INTERFACE)
        preset = await running.iface(preset_object_path("auto"), PRESET_INTERFACE)
        verdicts: list[tuple[str, str]] = []
        manager.on_verdict_recorded(lambda p, r: verdicts.append((p, r)))
        assert "draft-mtp" in await preset.get_argv()
        await manager.call_start_preset("auto")
        await running.wait_event("auto", "ready")
        assert await preset.get_spec_active() == ["draft-mtp"]
        deadline = time.monotonic() + 30
        # wait for both: the property was once read set while the signal had not arrived
        # yet (a full run on a loaded machine), and the test then failed on [] == [...]
        while time.monotonic() < deadline and not (verdicts and
                                                   await preset.get_auto_spec_blocked()):
            await asyncio.sleep(0.05)
        reason = "only 0/3 layers on GPU with the draft: --fit moved layers to RAM"
        assert verdicts == [("auto", reason)]
        assert await preset.get_auto_spec_blocked() == reason
        assert "draft-mtp" not in await preset.get_argv()  # the next start runs without it


def busctl_as(address: str, user: str, groups: str, *args: str
              ) -> subprocess.CompletedProcess[str]:
    """busctl as another user (setpriv: real uid, gid and supplementary groups)."""
    return subprocess.run(["setpriv", f"--reuid={user}", "--regid=nogroup",
                           f"--groups={groups}" if groups else "--clear-groups",
                           "busctl", f"--address={address}", *args],
                          capture_output=True, text=True, timeout=60)


async def test_verbs_need_root_or_the_manage_group(config: Path, tmp_path: Path,
                                                   open_bus_address: str) -> None:
    # the manage group is "users" here: the host has no loki group, and tests do not
    # add one; the container tests check the real loki group
    async with daemon_on(config, tmp_path, open_bus_address, manage_group="users") as running:
        def call(user: str, groups: str, *args: str) -> subprocess.CompletedProcess[str]:
            return busctl_as(open_bus_address, user, groups, "call", BUS_NAME, *args)

        plain = preset_object_path("plain")
        r = await asyncio.to_thread(call, "nobody", "", OBJECT_PATH, MANAGER_INTERFACE,
                                    "StartPreset", "s", "plain")
        assert r.returncode != 0
        assert "needs root or membership of group 'users'" in r.stderr, r.stderr
        r = await asyncio.to_thread(call, "nobody", "", plain, PRESET_INTERFACE,
                                    "ClearFailures")
        assert r.returncode != 0 and "membership of group" in r.stderr, r.stderr
        # reading needs nothing
        r = await asyncio.to_thread(call, "nobody", "", plain, PRESET_INTERFACE, "Plan")
        assert r.returncode == 0, r.stderr
        # a member of the group (its supplementary groups, as the socket shows them)
        r = await asyncio.to_thread(call, "nobody", "users", plain, PRESET_INTERFACE,
                                    "ClearFailures")
        assert r.returncode == 0 and r.stdout.strip() == "u 0", r.stderr
        assert running.events == []


async def test_lokictl_as_an_unprivileged_user_exits_3_with_the_reason(
        config: Path, tmp_path: Path, open_bus_address: str) -> None:
    async with daemon_on(config, tmp_path, open_bus_address):
        r = await asyncio.to_thread(
            subprocess.run, ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
                             sys.executable, "-m", "lokid.ctl", "--address", open_bus_address,
                             "start", "plain"], capture_output=True, text=True, timeout=60)
        assert r.returncode == 3, r
        assert r.stderr.startswith("lokictl: StartPreset needs root or membership of group "
                                   "'loki'"), r.stderr
        r = await asyncio.to_thread(
            subprocess.run, ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
                             sys.executable, "-m", "lokid.ctl", "--address", open_bus_address,
                             "show", "plain"], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and "State: inactive" in r.stdout, r


@pytest.mark.parametrize("allowed,ok", [({"org.lokid.lokid1.manage"}, True), (set(), False)])
async def test_where_polkit_runs_it_decides(config: Path, tmp_path: Path,
                                            open_bus_address: str, allowed: set[str],
                                            ok: bool) -> None:
    polkit_bus = await MessageBus(bus_address=open_bus_address).connect()
    stand_in = PolkitStandIn(allowed)
    polkit_bus.export("/org/freedesktop/PolicyKit1/Authority", stand_in)
    await polkit_bus.request_name("org.freedesktop.PolicyKit1")
    try:
        async with daemon_on(config, tmp_path, open_bus_address):
            # nobody, in the manage group: with polkit on the bus, only polkit's answer counts
            r = await asyncio.to_thread(
                busctl_as, open_bus_address, "nobody", "users", "call", BUS_NAME,
                preset_object_path("plain"), PRESET_INTERFACE, "ClearFailures")
    finally:
        polkit_bus.disconnect()
    assert (r.returncode == 0) is ok, r.stderr
    if not ok:
        assert "not authorized by polkit for org.lokid.lokid1.manage" in r.stderr, r.stderr
    ((kind, subject), action, flags), = stand_in.calls
    assert kind == "system-bus-name" and subject["name"].value.startswith(":1.")
    assert action == "org.lokid.lokid1.manage"
    assert flags == 1  # busctl allows interactive authorisation by default: passed on


async def test_a_stop_past_its_timeout_kills_and_leaves_no_engine(
        tmp_path: Path, engine: str, models: Any, bus_address: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(local_runner, "STOP_TIMEOUT", 2.0)
    monkeypatch.setenv("DEAF_PID", str(tmp_path / "deaf.pid"))
    config = write_config(tmp_path, str(deaf_engine(tmp_path, engine)), [models.dir])
    write_preset(config, "deaf", f'model = "llama.gguf"\nctx = 2048\nport = {free_port()}\n')
    assert Path(models.llama).exists()
    async with daemon_on(config, tmp_path, bus_address) as running:
        manager = await running.iface(OBJECT_PATH, MANAGER_INTERFACE)
        await manager.call_start_preset("deaf")
        await running.wait_event("deaf", "ready")
        pid = int((tmp_path / "deaf.pid").read_text())
        t0 = time.monotonic()
        await manager.call_stop_preset("deaf")
        await running.wait_event("deaf", "inactive", timeout=30)
        assert time.monotonic() - t0 >= 2.0  # SIGTERM was ignored: the timeout ended it
    deadline = time.monotonic() + 5
    while alive(pid) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert not alive(pid), "the engine outlived its supervisor"


def alive(pid: int) -> bool:
    """Running (a zombie left for an init that does not reap is dead)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


async def test_a_preset_fixed_since_the_load_starts_without_a_reload(
        tmp_path: Path, engine: str, models: Any, bus_address: str) -> None:
    extra = tmp_path / "extra"
    extra.mkdir()
    config = write_config(tmp_path, engine, [models.dir, extra])
    write_preset(config, "late", f'model = "late.gguf"\nctx = 2048\nport = {free_port()}\n')
    async with daemon_on(config, tmp_path, bus_address) as running:
        manager = await running.iface(OBJECT_PATH, MANAGER_INTERFACE)
        with pytest.raises(DBusError) as exc:
            await manager.call_start_preset("late")
        assert exc.value.type == ERROR_PREFIX + "InvalidPreset" and "late.gguf" in exc.value.text
        shutil.copy(models.llama, extra / "late.gguf")  # the operator copies the model in
        await manager.call_start_preset("late")
        await running.wait_event("late", "ready")
        preset = await running.iface(preset_object_path("late"), PRESET_INTERFACE)
        assert str(extra / "late.gguf") in await preset.get_argv()
        await manager.call_stop_preset("late")
        await running.wait_event("late", "inactive")


async def test_an_overlong_engine_line_is_dropped_whole_and_the_lines_after_it_are_read(
        tmp_path: Path, engine: str, models: Any, bus_address: str,
        caplog: pytest.LogCaptureFixture) -> None:
    """The local runner reads its child's pipe in chunks: a line longer than its limit
    (a wrapper prints one before the real engine starts) is dropped, whole, and what
    follows is logged and counted: the engine becomes ready and its requests show in
    Stats."""
    import httpx

    wrapper = tmp_path / "long-line-engine"
    wrapper.write_text(
        "#!/bin/sh\n"
        f'case " $* " in *" --help "*|*" --version "*) exec {engine} "$@";; esac\n'
        # after lokid's own lines of this start (its plan, logged once the engine is
        # spawned): written meanwhile on the same pipe, they would cut the long line
        "sleep 1\n"
        f"head -c {local_runner.LINE_LIMIT + 200_000} /dev/zero | tr '\\0' x\n"
        "echo; echo 'the line after the long one'\n"
        f'exec {engine} "$@"\n')
    wrapper.chmod(0o755)
    config = write_config(tmp_path, str(wrapper), [models.dir])
    port = free_port()
    write_preset(config, "plain", f'model = "{Path(models.llama).name}"\nctx = 2048\n'
                 f'port = {port}\n')
    caplog.set_level("INFO", logger="lokid.engine")
    async with daemon_on(config, tmp_path, bus_address) as running:
        manager = await running.iface(OBJECT_PATH, MANAGER_INTERFACE)
        preset = await running.iface(preset_object_path("plain"), PRESET_INTERFACE)
        await manager.call_start_preset("plain")
        await running.wait_event("plain", "ready")
        async with httpx.AsyncClient(timeout=120) as client:
            r = await client.post(f"http://127.0.0.1:{port}/v1/chat/completions", json={
                "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4})
            assert r.status_code == 200, r.text
        deadline = time.monotonic() + 10
        while (stats := await preset.get_stats())["requests"].value != 1:
            assert time.monotonic() < deadline, stats
            await asyncio.sleep(0.1)
        await manager.call_stop_preset("plain")
        await running.wait_event("plain", "inactive")
    lines = [line for r in caplog.records if r.name == "lokid.engine"
             for line in r.getMessage().split("\n")]
    assert "plain: the line after the long one" in lines
    assert max(map(len, lines)) < 10_000  # the long line itself never reached the log
    assert any("listening on" in line for line in lines)


async def test_an_engine_with_a_gpu_backend_but_no_load_lines_gets_the_drivers_answer(
        tmp_path: Path, engine: str, models: Any, bus_address: str) -> None:
    """The engine (a wrapper beside a libggml-cuda.so, so lokid sees a CUDA build) runs
    at the default verbosity: no buffer lines. The daemon asks the NVIDIA driver through
    the real pynvml over the start's processes; there is no driver here, and Stats says
    why the memory is unknown (lokictl stats prints it). An engine without any GPU
    backend is never asked about."""
    pytest.importorskip("pynvml", reason="nvidia-ml-py is a test dependency: make setup")
    gpu_dir = tmp_path / "gpu-engine"
    gpu_dir.mkdir()
    (gpu_dir / "libggml-cuda.so").write_bytes(b"")
    wrapper = gpu_dir / "llama-server"
    wrapper.write_text(f'#!/bin/sh\nexec {engine} "$@"\n')
    wrapper.chmod(0o755)
    config = write_config(tmp_path, str(wrapper), [models.dir])
    name = Path(models.llama).name
    write_preset(config, "gpu", f'model = "{name}"\nctx = 2048\nport = {free_port()}\n')
    async with daemon_on(config, tmp_path, bus_address) as running:
        manager = await running.iface(OBJECT_PATH, MANAGER_INTERFACE)
        preset = await running.iface(preset_object_path("gpu"), PRESET_INTERFACE)
        await manager.call_start_preset("gpu")
        await running.wait_event("gpu", "ready")
        telemetry = running.daemon.telemetry
        deadline = time.monotonic() + 10   # READY can come before the engine's lines are read
        while "invocation" not in (stats := await preset.get_stats()):
            assert time.monotonic() < deadline, stats
            await asyncio.sleep(0.05)
        await telemetry.sample_gpu()
        assert await running.daemon.runner.engine_pids("gpu")  # the start's processes
        stats = await preset.get_stats()
        assert "memory_mib" not in stats, stats
        assert stats["memory_note"].value.startswith(
            "the NVIDIA driver did not answer (NVML: NVML Shared Library Not Found): "
            "libnvidia-ml.so.1 is not installed"), stats
        # the real engine here has no GPU backend library: such an engine is not asked about
        assert await telemetry.has_gpu(engine) is False
        telemetry.gpu_engines[str(wrapper)] = False
        await telemetry.sample_gpu()
        assert "memory_note" not in await preset.get_stats()
        await manager.call_stop_preset("gpu")
        await running.wait_event("gpu", "inactive")


async def test_a_ready_load_is_measured_kept_and_forgotten_when_the_preset_changes(
        running: Running, config: Path, tmp_path: Path) -> None:
    """Issue 29: SETTLE seconds after READY, the daemon reads what the engine holds (here
    the host's share: the engine's resident memory under the local runner), keeps it in
    the state DB under the preset's memory key, shows it in Stats, and places the next
    start of the same configuration by it; an edit that changes memory makes it unknown."""
    manager = await running.iface(OBJECT_PATH, MANAGER_INTERFACE)
    preset = await running.iface(preset_object_path("plain"), PRESET_INTERFACE)
    runner = running.daemon.runner
    assert isinstance(runner, local_runner.LocalRunner)
    assert running.daemon.registry.presets["plain"].footprint is None
    # before any load: the GGUF estimate, on the host (a CPU engine), nothing held by lokid
    memory = plain(await preset.get_memory())
    assert memory["sources"] == {"host": "estimate"} and memory["needs"]["host"] > 0
    estimated = memory["needs"]["host"]
    host = await host_device(manager, lambda d: True)
    assert host["lokid"] == 0 and 0 < host["free"] <= host["total"]
    await manager.call_start_preset("plain")
    await running.wait_event("plain", "ready")
    proc = runner.engines["plain"].proc
    assert proc is not None
    (engine_pid,) = children(proc.pid)
    deadline = time.monotonic() + 20
    while "footprint" not in (stats := await preset.get_stats()):
        assert time.monotonic() < deadline, stats
        await asyncio.sleep(0.2)
    footprint = stats["footprint"].value
    held = footprint["bytes"].value["host"].value
    rss = resident_kib(engine_pid)
    assert rss is not None and abs(held - rss * 1024) <= rss * 1024 // 4, (held, rss)
    assert footprint["sources"].value["host"].value == "measured: the engine's resident memory"
    assert "host" in footprint["text"].value and "MiB" in footprint["text"].value
    view = running.daemon.registry.presets["plain"]
    with StateDB(str(tmp_path / "state")) as db:
        kept = db.footprint("plain", view.memory_key)
    assert kept is not None and kept.held["host"] == held
    # measured now: the need is the footprint, and the device counts it as lokid's
    memory = plain(await preset.get_memory())
    assert memory["needs"] == {"host": held} and memory["sources"] == {"host": "process"}
    assert memory["text"].startswith(f"needs {held / 2**20:.0f} MiB on host (measured: the "
                                     "engine's resident memory; estimated ")
    await host_device(manager, lambda d: d["lokid"] == held)
    assert estimated != held   # the two figures differ: the test tells them apart
    seen = len(running.events)
    await manager.call_stop_preset("plain")
    await running.wait_event("plain", "inactive", after=seen)
    await manager.call_reload()   # read again from the state DB: the same configuration
    again = running.daemon.registry.presets["plain"]
    assert again.memory_key == view.memory_key and again.footprint == kept
    text = (config / "presets" / "plain.toml").read_text()
    (config / "presets" / "plain.toml").write_text(text.replace("ctx = 2048", "ctx = 4096"))
    await manager.call_reload()   # another context: another footprint, not measured yet
    edited = running.daemon.registry.presets["plain"]
    assert edited.memory_key != view.memory_key and edited.footprint is None
    assert plain(await preset.get_memory())["sources"] == {"host": "estimate"}
    await host_device(manager, lambda d: d["lokid"] == 0)   # stopped: nothing held


def plain(value: Any) -> Any:
    from lokid.host.buscall import plain as unwrap

    return unwrap(value)


async def host_device(manager: Any, ok: Any, timeout: float = 20) -> dict[str, Any]:
    """The manager's Devices entry of the host, once ``ok`` holds for it (the daemon reads
    the room again when a reading is older than 2 s, and after each state change)."""
    deadline = time.monotonic() + timeout
    while True:
        devices = plain(await manager.get_devices())
        (host,) = [d for d in devices if d["device"] == "host"]
        if ok(host) or time.monotonic() > deadline:
            assert ok(host), devices
            return dict(host)
        await asyncio.sleep(0.3)


async def test_a_preset_the_host_can_never_hold_says_so_with_the_figures(
        running: Running, config: Path) -> None:
    """Issue 29: Memory's does_not_fit, against [placement] host_memory, re-read at Reload."""
    manager = await running.iface(OBJECT_PATH, MANAGER_INTERFACE)
    preset = await running.iface(preset_object_path("plain"), PRESET_INTERFACE)
    assert "does_not_fit" not in plain(await preset.get_memory())
    toml = config / "lokid.toml"
    toml.write_text(toml.read_text() + '[placement]\nhost_memory = "1M"\n')
    await manager.call_reload()
    host = await host_device(manager, lambda d: d["total"] == 2**20)
    assert host["source"].endswith("bounded by [placement] host_memory = 1 MiB")
    memory = plain(await preset.get_memory())
    assert memory["does_not_fit"].startswith("needs ")
    assert memory["does_not_fit"].endswith("MiB on host; it has 1 MiB")
    rows = await lokictl(running, "presets")
    (line,) = [x for x in rows.splitlines() if x.startswith("plain ")]
    assert " est " in line and "(does not fit: needs " in line
    top = await lokictl(running, "top", "--once")
    assert "DEVICE  TOTAL  LOKID  OTHERS  RESERVED  FREE  FROM" in top
    assert "\nhost    1M     0M" in top


async def lokictl(running: Running, *args: str) -> str:
    """lokictl's output (in a process of its own: the daemon runs in this loop)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "lokid.ctl", "--address", running.daemon.bus_address or "",
        *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    return out.decode()
