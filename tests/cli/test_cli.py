"""The `lokid` command as an operator uses it: `plan` and `run`, against the real engine."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from support import enginekit
from support.enginekit import free_port, write_config, write_preset

pytestmark = pytest.mark.engine


# `lokid plan` as root checks the files as the unit's user (loki) would open them; the
# tests' files live in pytest's 0700 temporary directory, so on a host where loki exists
# every plan would be refused. The check has its own test, with a throwaway user.
NO_ENGINE_USER = {"LOKI_ENGINE_USER": "lokid-test-no-such-user"}


def lokid(config: Path, *args: str, state: Path | None = None,
          env: dict[str, str] | None = None, **kw: Any) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **NO_ENGINE_USER, "LOKI_CONFIG_DIR": str(config),
           "LOKI_STATE_DIR": str(state or config.parent / "state"), **(env or {})}
    return subprocess.run([sys.executable, "-m", "lokid.cli", *args], env=env,
                          capture_output=True, text=True, timeout=120, **kw)


@pytest.fixture
def config(tmp_path: Path, engine: str, models: Any) -> Path:
    config = write_config(tmp_path, engine, [models.dir])
    write_preset(config, "demo", f'model = "{Path(models.llama).name}"\nctx = 2048\n'
                 f'port = {free_port()}\n[spec]\nmode = "ngram"\n')
    return config


def test_plan_json_is_the_documented_shape(config: Path, engine: str, models: Any) -> None:
    r = lokid(config, "plan", "demo", "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert set(data) == {"preset", "argv", "env", "notes", "spec", "secrets", "memory",
                         "devices"}
    # a CPU engine: everything on the host, estimated (nothing measured in this state dir)
    assert data["memory"]["sources"] == {"host": "estimate"}
    assert 0 < data["memory"]["needs"]["host"] < 64 * 2**20
    assert data["memory"]["text"].startswith("needs ")
    (host,) = data["devices"]
    assert host["device"] == "host" and 0 < host["free"] <= host["total"]
    assert data["preset"] == "demo"
    assert data["argv"][0] == os.path.realpath(engine)
    assert data["argv"][1:3] == ["-m", models.llama]
    assert data["spec"] == {"mode": "ngram", "types": ["ngram-mod"], "auto": False}
    assert data["env"] == {}


def test_plan_text_shows_command_and_notes(config: Path) -> None:
    write_preset(config, "noted", 'model = "llama.gguf"\n[spec]\nmode = "auto"\n')
    r = lokid(config, "plan", "noted")
    assert r.returncode == 0, r.stderr
    assert "command:\n  " in r.stdout and "-m " in r.stdout
    assert "spec.mode = auto: nothing to draft with" in r.stdout


def test_plan_says_what_a_start_now_would_choose_for_gpus_auto(config: Path) -> None:
    """Issue 29: gpus = "auto"; on this CPU engine there is nothing to choose, and the plan
    says so (tests/planning/test_gpuchoice.py chooses among four recorded H200s)."""
    write_preset(config, "auto", 'model = "llama.gguf"\nctx = 512\ngpus = "auto"\n')
    r = lokid(config, "plan", "auto")
    assert r.returncode == 0, r.stderr
    assert 'gpus = "auto": the fewest GPUs that hold it, chosen at each start' in r.stdout
    assert "a start now: no GPU to choose from" in r.stdout
    data = json.loads(lokid(config, "plan", "auto", "--json").stdout)
    assert data["gpu_choice"] == 0 and "CUDA_VISIBLE_DEVICES" not in data["env"]
    assert data["gpus_now"].startswith("no GPU to choose from")


def test_plan_refuses_a_preset_this_host_can_never_hold(config: Path) -> None:
    """Issue 29: a preset whose need is beyond a device's room with every engine stopped
    is refused with the figures, before any start could fail out of memory."""
    # 2 layers × 4 KV heads × 16 × 2 bytes × (K + V): 512 bytes per token of context;
    # 32768 tokens: 16 MiB of KV alone, beyond a host of 16 MiB for lokid's engines
    write_preset(config, "long", f'model = "llama.gguf"\nctx = 32768\nport = {free_port()}\n')
    assert lokid(config, "plan", "long").returncode == 0
    toml = config / "lokid.toml"
    toml.write_text(toml.read_text() + '[placement]\nhost_memory = "16M"\n')
    r = lokid(config, "plan", "long")
    assert r.returncode == 2, r.stdout
    assert "command:\n" in r.stdout and "memory: needs " in r.stdout   # the plan is shown
    assert r.stderr.startswith("lokid: preset 'long' needs ")
    assert "MiB on host; it has 16 MiB (the estimate: offloaded 0/3 layers; KV 16 MiB " \
        "(32768 × 2 layers × 4 heads × (16 f16 + 16 f16))" in r.stderr
    assert r.stderr.rstrip().endswith("lower ctx, gpu_layers or the KV cache type, or run it "
                                      "on a larger host")
    data = json.loads(lokid(config, "plan", "long", "--json").stdout)
    assert data["memory"]["does_not_fit"].startswith("needs ")
    assert data["devices"][0]["total"] == 16 * 2**20
    # the reserve counts against it too, and a smaller context fits again
    toml.write_text(toml.read_text().replace('host_memory = "16M"',
                                             'host_memory = "64M"\nreserve = { host = "30M" }'))
    assert "it has 34 MiB of 64 MiB (30 MiB reserved)" in lokid(config, "plan", "long").stderr
    write_preset(config, "long", f'model = "llama.gguf"\nctx = 512\nport = {free_port()}\n')
    assert lokid(config, "plan", "long").returncode == 0   # its 24 MiB engine and a little


def test_plan_says_so_where_the_estimate_cannot_size_or_placement_is_off(config: Path) -> None:
    # a KV type the estimate does not know (the engine would refuse it at start): shown
    write_preset(config, "odd", f'model = "llama.gguf"\nctx = 2048\nport = {free_port()}\n'
                 'extra_args = ["-ctk", "q3_weird"]\n')
    r = lokid(config, "plan", "odd")
    assert r.returncode == 0, r.stderr
    assert "\nmemory: unknown (" in r.stdout and "unknown KV cache type 'q3_weird'" in r.stdout
    assert json.loads(lokid(config, "plan", "odd", "--json").stdout)["memory"] == {}
    # [placement] enabled = false: what does not fit is said, not refused
    write_preset(config, "long", f'model = "llama.gguf"\nctx = 32768\nport = {free_port()}\n')
    toml = config / "lokid.toml"
    toml.write_text(toml.read_text() + '[placement]\nenabled = false\nhost_memory = "16M"\n')
    r = lokid(config, "plan", "long")
    assert r.returncode == 0, r.stderr
    assert r.stderr.startswith("lokid: preset 'long' needs ")
    assert "[placement] enabled = false, so it is not refused" in r.stderr


def test_plan_is_read_only(config: Path, tmp_path: Path) -> None:
    state = tmp_path / "state-never-created"
    assert lokid(config, "plan", "demo", state=state).returncode == 0
    assert not state.exists()


@pytest.mark.parametrize("name,text,fragment", [
    ("broken", 'model = "llama.gguf"\nctx = "big"\n', "broken.toml:2: ctx: must be an integer"),
    ("typo", 'model = "llama.gguf"\n[spec]\nmode = "eagle"\n',
     "typo.toml:3: spec.mode: 'eagle' is not valid; valid values: off, auto, mtp, ngram"),
    ("nomodel", 'model = "absent.gguf"\n', "'absent.gguf' is in none of model_dirs"),
    ("corrupt", 'model = "{corrupt}"\n', "not a GGUF file (it does not begin with \"GGUF\")"),
    ("truncated", 'model = "{truncated}"\n', "truncated"),
    ("bad name!", 'model = "x"\n', "invalid preset name"),
])
def test_plan_errors_exit_2_with_one_clear_line(config: Path, models: Any, name: str,
                                                text: str, fragment: str) -> None:
    text = text.format(corrupt=models.corrupt_magic, truncated=models.truncated)
    if name != "bad name!":
        write_preset(config, name, text)
    r = lokid(config, "plan", name)
    assert r.returncode == 2
    assert fragment in r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""


def test_plan_of_a_missing_preset(config: Path) -> None:
    r = lokid(config, "plan", "nope")
    assert r.returncode == 2 and "no preset 'nope'" in r.stderr


def test_plan_with_a_missing_engine_says_how_to_fix_it(config: Path, models: Any) -> None:
    (config / "lokid.toml").write_text('engine = "/opt/none/llama-server"\n'
                                       f'model_dirs = ["{models.dir}"]\n')
    r = lokid(config, "plan", "demo")
    assert r.returncode == 2
    assert "engine '/opt/none/llama-server' not found" in r.stderr
    assert str(config / "lokid.toml") in r.stderr


def test_a_broken_preset_does_not_affect_another(config: Path) -> None:
    write_preset(config, "broken", "model = [\n")
    assert lokid(config, "plan", "broken").returncode == 2
    assert lokid(config, "plan", "demo").returncode == 0


def test_plan_refuses_two_presets_on_one_port(config: Path) -> None:
    port = free_port()
    a = write_preset(config, "a", f'model = "llama.gguf"\nport = {port}\n')
    b = write_preset(config, "b", f'model = "llama.gguf"\nextra_args = ["--port", "{port}"]\n')
    # a preset whose model is missing never takes a port (the packaged example's case)
    write_preset(config, "c", f'model = "absent.gguf"\nport = {port}\n')
    # none has started: a, first by name, holds the port, and b is refused
    assert lokid(config, "plan", "a").returncode == 0
    r = lokid(config, "plan", "b")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr == (f"lokid: {b}: port {port} on 127.0.0.1 belongs to preset a ({a}), "
                        "first by name (no preset has started on it since boot): set another "
                        "port in this preset\n")
    (config / "lokid.toml").write_text((config / "lokid.toml").read_text()
                                       + 'host = "127.0.0.2"\n')
    write_preset(config, "b", f'model = "llama.gguf"\nport = {port}\n'
                 'extra_args = ["--host", "127.0.0.3"]\n')
    assert lokid(config, "plan", "a").returncode == 0  # other addresses, one port: no clash


def test_plan_as_root_checks_the_files_as_the_units_user_will_open_them(
        engine: str, models: Any, engine_user: pwd.struct_passwd) -> None:
    # pytest's own temporary directory is 0700: a tree the other user can walk to
    root = Path(tempfile.mkdtemp(prefix="lokid-access-"))
    try:
        root.chmod(0o755)
        private = root / "private"
        private.mkdir(mode=0o700)
        model = private / "llama.gguf"
        shutil.copy(models.llama, model)
        model.chmod(0o644)
        # the engine as the check sees it (its real path): a wrapper in the readable tree
        wrapper = root / "llama-server"
        wrapper.write_text(f'#!/bin/sh\nexec "{engine}" "$@"\n')
        wrapper.chmod(0o744)
        config = write_config(root, str(wrapper), [private])
        config.chmod(0o755)
        write_preset(config, "p", 'model = "llama.gguf"\n')
        as_unit = {"LOKI_ENGINE_USER": engine_user.pw_name}

        def plan() -> subprocess.CompletedProcess[str]:
            return lokid(config, "plan", "p", env=as_unit)

        r = plan()
        assert r.returncode == 2
        assert r.stderr.strip() == (
            f"lokid: model {model} is not readable by user {engine_user.pw_name}: directory "
            f"{private} (owner root:root, mode 0700) is not searchable by it: chmod o+x "
            f"{private}, or chgrp {engine_user.pw_name} {private} and chmod g+x {private}")
        private.chmod(0o755)
        model.chmod(0o600)
        r = plan()
        assert r.returncode == 2
        assert (f"model {model} is not readable by user {engine_user.pw_name} (owner "
                f"root:root, mode 0600): chmod o+r {model}") in r.stderr
        model.chmod(0o640)
        os.chown(model, 0, engine_user.pw_gid)  # its group may read
        r = plan()
        assert r.returncode == 2
        assert (f"engine {wrapper} is not executable by user {engine_user.pw_name} (owner "
                f"root:root, mode 0744): chmod o+x {wrapper}") in r.stderr
        wrapper.chmod(0o755)
        r = plan()
        assert r.returncode == 0, r.stderr
        private.chmod(0o700)
        assert plan().returncode == 2
        assert lokid(config, "plan", "p").returncode == 0   # no such user: no such unit
        # `lokid run` runs the engine as its own user (root): nothing checked for another
        from lokid.planning.gather import make_plan

        assert make_plan(str(config), "p", as_unit).preset == "p"
    finally:
        shutil.rmtree(root)


# --- lokid run ------------------------------------------------------------------------


class Run:
    """`lokid run` in the background, its stderr collected line by line."""

    def __init__(self, config: Path, preset: str):
        env = {**os.environ, "LOKI_CONFIG_DIR": str(config),
               "LOKI_STATE_DIR": str(config.parent / "state")}
        self.proc = subprocess.Popen([sys.executable, "-m", "lokid.cli", "run", preset],
                                     env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                     text=True)
        self.lines: list[str] = []
        self.ready = threading.Event()
        threading.Thread(target=self._pump, daemon=True).start()

    # lokid's line and the engine's share one stderr: the engine writes a line's time
    # prefix apart from its text, so "lokid: ready at" may land after that prefix
    # ("0.00.017.632 I lokid: ready at …", seen once in make test)
    READY = "lokid: ready at "

    def _pump(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)
            if self.READY in line:
                self.ready.set()

    def url(self) -> str:
        for line in self.lines:
            if self.READY in line:
                return line.split(self.READY, 1)[1].strip()
        raise AssertionError("".join(self.lines))

    def text(self) -> str:
        return "".join(self.lines)


def port_is_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_run_until_ready_then_stop_cleanly(config: Path, sig: int) -> None:
    port = free_port()
    write_preset(config, "r", f'model = "llama.gguf"\nctx = 2048\nport = {port}\n')
    run = Run(config, "r")
    assert run.ready.wait(60), run.text()
    url = run.url()
    assert url == f"http://127.0.0.1:{port}"
    assert "lokid: starting " in run.text()
    assert "load_model: loading model" in run.text()  # the engine's own output streams through
    reply = httpx.post(url + "/v1/chat/completions", timeout=60, json={
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}).json()
    assert reply["timings"]["predicted_n"] > 0
    run.proc.send_signal(sig)
    assert run.proc.wait(60) == 0, run.text()
    assert "lokid: stopping the engine" in run.text()
    assert port_is_free(port)  # no engine left behind


def test_run_refuses_a_busy_port(config: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        write_preset(config, "busy", f'model = "llama.gguf"\nport = {port}\n')
        r = lokid(config, "run", "busy")
    assert r.returncode == 1
    # the holder is named: this test's own process
    assert (f"port {port} on 127.0.0.1 is already in use by another process: "
            f"pid {os.getpid()} ({Path(f'/proc/{os.getpid()}/comm').read_text().strip()})"
            in r.stderr)


def test_run_exits_with_the_engines_status_when_it_fails(config: Path) -> None:
    write_preset(config, "bad", f'model = "llama.gguf"\nport = {free_port()}\n'
                 'extra_args = ["--spec-type", "warp-drive"]\n')
    started = time.monotonic()
    r = lokid(config, "run", "bad")
    assert r.returncode == 1
    assert "exited with status 1 before it was ready" in r.stderr
    assert 'error while handling argument "--spec-type"' in r.stderr
    assert time.monotonic() - started < 60


def engine_pids(port: int) -> list[int]:
    """Live processes whose command line serves ``port`` (this test's engines)."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"--port" in argv and argv[argv.index(b"--port") + 1:][:1] == [str(port).encode()]:
            found.append(int(entry))
    return found


def test_ctrl_c_leaves_nothing_behind_an_engine_wrapper_without_exec(
        config: Path, engine: str, tmp_path: Path) -> None:
    # A wrapper that runs the engine as its child (no exec): SIGTERM to the wrapper
    # alone would leave the real llama-server serving on the port.
    wrapper = tmp_path / "wrap.sh"
    wrapper.write_text(f'#!/bin/sh\n"{engine}" "$@"\nstatus=$?\necho "wrapper: $status"\n'
                       'exit $status\n')
    wrapper.chmod(0o755)
    text = (config / "lokid.toml").read_text().replace(json.dumps(engine),
                                                           json.dumps(str(wrapper)))
    (config / "lokid.toml").write_text(text)
    port = free_port()
    write_preset(config, "wrapped", f'model = "llama.gguf"\nctx = 2048\nport = {port}\n')
    run = Run(config, "wrapped")
    try:
        assert run.ready.wait(60), run.text()
        pids = engine_pids(port)
        assert len(pids) == 2, pids  # the wrapper and the llama-server it runs
        run.proc.send_signal(signal.SIGINT)
        assert run.proc.wait(60) == 0, run.text()
        assert port_is_free(port), run.text()
        assert engine_pids(port) == []
    finally:
        for pid in engine_pids(port):
            os.kill(pid, signal.SIGKILL)


# --- an address the engine could never listen on ------------------------------------------

ADDRESS_COMMANDS = ["plan", "prestart", "run"]
UNPRIVILEGED_PORT_START = Path("/proc/sys/net/ipv4/ip_unprivileged_port_start")
FIX = "such as 127.0.0.1 (this machine only) or 0.0.0.0 (every interface)"


def one_line(r: subprocess.CompletedProcess[str]) -> str:
    """The error, checked to be a single line and no traceback."""
    assert "Traceback" not in r.stderr and r.stdout == "", r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    return lines[0]


@pytest.mark.parametrize("command", ADDRESS_COMMANDS)
@pytest.mark.parametrize("where", ["lokid.toml", "preset"])
def test_a_host_that_does_not_resolve_is_one_line_naming_it_and_its_file(
        config: Path, tmp_path: Path, command: str, where: str) -> None:
    host = "no-such-host.invalid"   # .invalid never resolves (RFC 6761)
    text = f'model = "llama.gguf"\nctx = 2048\nport = {free_port()}\n'
    if where == "lokid.toml":
        path = config / "lokid.toml"
        path.write_text(path.read_text() + f'host = "{host}"\n')
        write_preset(config, "h", text)
        setting = f"host: '{host}'"
    else:
        path = write_preset(config, "h", text + f'extra_args = ["--host", "{host}"]\n')
        setting = f"extra_args: --host '{host}'"
    r = lokid(config, command, "h", env={"LOKI_RUNTIME_DIR": str(tmp_path / "run")})
    assert r.returncode == 2
    line = one_line(r)
    assert line.startswith(f"lokid: {path}: {setting} does not resolve to an address ("), line
    assert line.endswith(f"): use an address or a name of this host, {FIX}")


@pytest.mark.parametrize("command", ADDRESS_COMMANDS)
def test_an_address_of_another_machine_is_one_line(config: Path, tmp_path: Path,
                                                   command: str) -> None:
    host = "192.0.2.123"            # TEST-NET-1 (RFC 5737): no machine's own address
    path = write_preset(config, "far", f'model = "llama.gguf"\nctx = 2048\nport = {free_port()}\n'
                        f'extra_args = ["--host", "{host}"]\n')
    r = lokid(config, command, "far", env={"LOKI_RUNTIME_DIR": str(tmp_path / "run")})
    assert r.returncode == 2
    assert one_line(r) == (f"lokid: {path}: extra_args: --host '{host}' is not an address of "
                           f"this host: use one of its addresses, {FIX}")


def refused(path: Path, key: str, port: int, user: str, start: int) -> str:
    setting = f"--port {port}" if key == "extra_args" else str(port)
    return (f"{path}: {key}: {setting} is below {start}: user {user}, which runs the engine, "
            f"may not listen on it: use a port of {start} or above, or set the sysctl "
            f"net.ipv4.ip_unprivileged_port_start to {port}")


def readable_config(root: Path, engine: str, models: Any) -> Path:
    """A config, model and engine under ``root`` that another user can read and run,
    with state and runtime directories it may write."""
    config = enginekit.readable_config(root, engine, models.llama)
    for d in ("state", "run"):
        (root / d).mkdir(mode=0o777)
        (root / d).chmod(0o777)
    return config


def test_plan_as_root_refuses_a_port_the_units_user_may_not_listen_on(
        engine: str, models: Any, engine_user: pwd.struct_passwd) -> None:
    start = int(UNPRIVILEGED_PORT_START.read_text())
    root = Path(tempfile.mkdtemp(prefix="lokid-port-"))
    try:
        config = readable_config(root, engine, models)
        low = write_preset(config, "low", 'model = "llama.gguf"\nport = 80\n')
        high = write_preset(config, "high", 'model = "llama.gguf"\nport = 8080\n'
                            'extra_args = ["--port", "443"]\n')
        as_unit = {"LOKI_ENGINE_USER": engine_user.pw_name, "LOKI_RUNTIME_DIR": str(root / "run")}
        for name, path, key, port in (("low", low, "port", 80), ("high", high, "extra_args", 443)):
            r = lokid(config, "plan", name, env=as_unit)
            if port >= start:   # the sysctl lowered (container runtimes set 0): anyone's port
                assert r.returncode == 0, r.stderr
                continue
            assert r.returncode == 2
            assert one_line(r) == "lokid: " + refused(path, key, port, engine_user.pw_name,
                                                      start)
        # root itself may: no such user, no unit (the engine runs as root, `lokid run`)
        assert lokid(config, "plan", "low", env={"LOKI_RUNTIME_DIR": str(root / "run")}
                     ).returncode == 0
    finally:
        shutil.rmtree(root)


def test_the_engines_own_user_is_refused_a_privileged_port_in_one_line(
        engine: str, models: Any, engine_user: pwd.struct_passwd,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # What the unit's `lokid engine` meets as loki, and `lokid run` as an operator: the
    # bind itself refused (EACCES), once a traceback.
    import contextlib
    import encodings.idna  # noqa: F401 - loaded before the child drops root
    import io

    from support.users import run_as

    from lokid import cli
    from lokid.planning.gather import make_plan
    from lokid.store import plancache, state  # noqa: F401
    from lokid.unit import foreground, supervisor  # noqa: F401

    start = int(UNPRIVILEGED_PORT_START.read_text())
    if start <= 80:
        pytest.skip(f"net.ipv4.ip_unprivileged_port_start is {start}: no privileged port here")
    root = Path(tempfile.mkdtemp(prefix="lokid-port-"))
    try:
        config = readable_config(root, engine, models)
        path = write_preset(config, "low", 'model = "llama.gguf"\nctx = 2048\nport = 80\n')
        for var, value in (("LOKI_CONFIG_DIR", config), ("LOKI_STATE_DIR", root / "state"),
                           ("LOKI_RUNTIME_DIR", root / "run")):
            monkeypatch.setenv(var, str(value))
        for var in ("NOTIFY_SOCKET", "JOURNAL_STREAM", "INVOCATION_ID"):
            monkeypatch.delenv(var, raising=False)
        # the engine probed as root (the child finds it cached): the test's Python and
        # engine may live where that user cannot read
        make_plan(str(config), "low")
        socket.getaddrinfo("localhost", 80)

        def lokid_as_user(*args: str) -> Callable[[], str]:
            def call() -> str:
                err = io.StringIO()
                with contextlib.redirect_stderr(err):
                    status = cli.main(list(args))
                return f"{status} {err.getvalue()}"
            return call

        def raised(e: BaseException) -> str:
            return f"raised {e!r}"

        name = engine_user.pw_name
        for command in ("run", "prestart"):
            assert run_as(engine_user, lokid_as_user(command, "low"), raised) == (
                f"2 lokid: {refused(path, 'port', 80, name, start)}\n")
        # the unit's main process: final (78), its file named once the unit passes it
        out = run_as(engine_user, lokid_as_user("engine", "low"), raised)
        assert out.startswith("78 lokid: ") and out.count("\n") == 1, out
        assert out.endswith(refused(path, "port", 80, name, start).split(": port: ")[1] + "\n")
    finally:
        shutil.rmtree(root)
