"""lokid.planning.endpoint: a busy port is reported with who holds it (real sockets, real /proc)."""

from __future__ import annotations

import pwd
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.users import run_as

from lokid.core.errors import PortBusyError
from lokid.core.launch.attempt import Mark
from lokid.core.launch.runtimeplan import RuntimePlan
from lokid.planning.endpoint import check_port_free
from lokid.store.runtimedir import write_runtime_plan

LISTEN = """
import socket, sys, time
s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen()
print(s.getsockname()[1], flush=True)
time.sleep(300)
"""


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], int]]:
    """A process named ``portholder`` (its comm: the name it was run by) on a port."""
    name = tmp_path / "portholder"
    name.symlink_to(sys.executable)
    p = subprocess.Popen([str(name), "-c", LISTEN], stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None
    port = int(p.stdout.readline())
    try:
        yield p, port
    finally:
        p.kill()
        p.wait()


def busy(host: str, port: int, runtime_dir: str | None) -> str:
    with pytest.raises(PortBusyError) as e:
        check_port_free(host, port, runtime_dir)
    return str(e.value)


def write_plan(runtime_dir: Path, preset: str, port: int, argv: list[str]) -> None:
    write_runtime_plan(str(runtime_dir), RuntimePlan(
        preset=preset, argv=tuple(argv), env={}, host="127.0.0.1", port=port,
        mark=Mark("f", argv[0], 1)))


def test_the_process_holding_the_port_is_named(
        holder: tuple[subprocess.Popen[str], int], tmp_path: Path) -> None:
    p, port = holder
    assert busy("127.0.0.1", port, None) == (
        f"port {port} on 127.0.0.1 is already in use by another process: "
        f"pid {p.pid} (portholder)")
    # a runtime plan left by a stopped engine on that port is not the holder
    write_plan(tmp_path / "run", "gone", port, ["/usr/bin/llama-server", "--port", str(port)])
    assert busy("127.0.0.1", port, str(tmp_path / "run")).endswith(
        f"in use by another process: pid {p.pid} (portholder)")


def test_the_preset_whose_plan_the_holder_runs_is_named(
        holder: tuple[subprocess.Popen[str], int], tmp_path: Path) -> None:
    p, port = holder
    runtime = tmp_path / "run"
    write_plan(runtime, "other", port, [sys.executable, "-c", LISTEN])
    (runtime / "broken.json").write_text("{")  # unreadable plans are passed over
    assert busy("127.0.0.1", port, str(runtime)) == (
        f"port {port} on 127.0.0.1 is already in use by preset other (pid {p.pid} (portholder))")


def as_user(user: pwd.struct_passwd, host: str, port: int, runtime_dir: str) -> str:
    """check_port_free's message as ``user``, who may not look into root's fds."""

    def check() -> str:
        check_port_free(host, port, runtime_dir)
        return "free"

    return run_as(user, check)


def test_a_holder_this_user_cannot_see(holder: tuple[subprocess.Popen[str], int],
                                       engine_user: pwd.struct_passwd) -> None:
    _, port = holder
    # everything the child calls is loaded before it drops root
    busy("127.0.0.1", port, "/nonexistent")
    # pytest's own temporary directory is 0700: a runtime directory the user can read
    runtime = Path(tempfile.mkdtemp(prefix="lokid-endpoint-"))
    try:
        runtime.chmod(0o755)
        assert as_user(engine_user, "127.0.0.1", port, str(runtime)) == (
            f"port {port} on 127.0.0.1 is already in use by another process (not visible "
            f"to user {engine_user.pw_name})")
        write_plan(runtime, "other", port, ["/usr/bin/llama-server"])
        (runtime / "other.json").chmod(0o644)
        assert as_user(engine_user, "127.0.0.1", port, str(runtime)) == (
            f"port {port} on 127.0.0.1 is already in use by preset other (its runtime plan "
            f"has this port; the process is not visible to user {engine_user.pw_name})")
    finally:
        shutil.rmtree(runtime)
