"""The real-systemd harness does what lokid's unit tests will rely on.

Each check is a property of systemd 252 (Debian 12) that loki-engine@.service
depends on: Type=notify readiness and STATUS=, template instances named like
presets, Debian's python3 running lokid, and the real llama-server serving
from a unit and leaving nothing behind when it stops.
"""

from __future__ import annotations

import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from support.enginekit import free_port
from support.systemd_harness import Container

pytestmark = pytest.mark.systemd


def test_systemd_is_pid1_and_running(systemd_container: Container) -> None:
    ct = systemd_container
    assert ct.run(["cat", "/proc/1/comm"]).stdout.strip() == "systemd"
    state = ct.systemctl("is-system-running", check=False).stdout.strip()
    assert state in ("running", "degraded"), ct.systemctl("--failed", check=False).stdout
    assert ct.systemctl("is-active", "systemd-journald.service", "dbus.service",
                        check=False).stdout.split() == ["active", "active"]


# Tells systemd it is still starting, waits, then ready: the unit must stay
# "activating" until READY=1, which is what lokid's engine supervisor relies on.
NOTIFY_PROBE = textwrap.dedent("""\
    import time
    from systemd import daemon
    print("notify-probe starting", flush=True)
    daemon.notify("STATUS=waiting for the model")
    time.sleep(2)
    daemon.notify("READY=1\\nSTATUS=probe ready on port 1234")
    print("notify-probe ready", flush=True)
    time.sleep(3600)
""")


def test_notify_unit_is_active_only_after_ready(systemd_container: Container) -> None:
    ct = systemd_container
    unit = "harness-notify.service"
    ct.systemctl("reset-failed", unit, check=False)
    ct.run(["systemd-run", "--no-block", "--collect", f"--unit={unit}",
            "-p", "Type=notify", "-p", "NotifyAccess=all",
            "python3", "-c", NOTIFY_PROBE])
    try:
        deadline = time.monotonic() + 20
        while ct.show(unit, "StatusText")["StatusText"] != "waiting for the model":
            assert time.monotonic() < deadline, ct.show(unit, "ActiveState", "StatusText")
            time.sleep(0.05)
        # STATUS= arrived but READY=1 did not: still starting.
        assert ct.show(unit, "ActiveState", "SubState") == {
            "ActiveState": "activating", "SubState": "start"}
        ct.wait_for(unit, "active", timeout=20)
        assert ct.show(unit, "StatusText")["StatusText"] == "probe ready on port 1234"
        log = ct.wait_journal(unit, "notify-probe ready")
        assert "notify-probe starting" in log
    finally:
        ct.systemctl("stop", unit, check=False)


PROBE_TEMPLATE = textwrap.dedent("""\
    [Unit]
    Description=harness probe %i

    [Service]
    Type=oneshot
    RemainAfterExit=yes
    Environment=PROBE_INSTANCE=%i
    ExecStart=/bin/sh -c 'echo "instance=[$PROBE_INSTANCE] unescaped=[%I]"'
""")


def test_template_instance_name_comes_back_verbatim(systemd_container: Container) -> None:
    ct = systemd_container
    ct.write_file("/etc/systemd/system/harness-probe@.service", PROBE_TEMPLATE)
    ct.systemctl("daemon-reload")
    # Preset names may contain "-", "." and "_". %i is the name as written;
    # %I would turn "-" into "/" (unit-name unescaping): lokid must use %i.
    unit = "harness-probe@a-b.c_d.service"
    ct.systemctl("start", unit)
    try:
        props = ct.show(unit, "ActiveState", "Description", "Environment")
        assert props == {"ActiveState": "active", "Description": "harness probe a-b.c_d",
                         "Environment": "PROBE_INSTANCE=a-b.c_d"}
        ct.wait_journal(unit, "instance=[a-b.c_d] unescaped=[a/b.c_d]")
    finally:
        ct.systemctl("stop", unit, check=False)


def test_lokid_imports_with_debian_python(systemd_container: Container) -> None:
    # Debian's python3 with Debian's httpx, dbus-fast and python3-systemd: what the
    # Debian package of lokid will run on.
    r = systemd_container.run([
        "python3", "-c",
        "import sys; sys.path.insert(0, '/opt/lokid'); import lokid.core.launch.plan; "
        "import httpx, systemd.daemon, dbus_fast; "
        "print(lokid.core.launch.plan.__file__)"])
    assert r.stdout.strip() == "/opt/lokid/lokid/core/launch/plan.py"


@pytest.mark.engine
def test_real_engine_runs_inside(systemd_container: Container, container_engine: str) -> None:
    r = systemd_container.run([container_engine, "--version"])
    assert "build 11434" in r.stdout + r.stderr


@pytest.mark.engine
def test_real_engine_serves_from_a_unit(systemd_container: Container, container_engine: str,
                                        models: Any) -> None:
    ct = systemd_container
    model = "/srv/harness-models/llama.gguf"
    ct.write_file(model, Path(models.llama).read_bytes())
    port = free_port()       # the container shares the host's network
    unit = "engine-smoke.service"
    ct.systemctl("reset-failed", unit, check=False)
    ct.run(["systemd-run", f"--unit={unit}", "--collect", "--", container_engine, "-m", model,
            "--host", "127.0.0.1", "--port", str(port), "-c", "512"])
    try:
        deadline = time.monotonic() + 60
        while ct.run(["curl", "-sf", f"http://127.0.0.1:{port}/health"],
                     check=False).returncode != 0:
            if time.monotonic() > deadline:
                raise AssertionError("engine not healthy in 60 s:\n" + ct.journal(unit)[-3000:])
            assert ct.show(unit, "ActiveState")["ActiveState"] == "active", ct.journal(unit)
            time.sleep(0.1)
        # Its output goes to the journal, where lokid's watcher will read it.
        ct.wait_journal(unit, "model loaded")
    finally:
        ct.systemctl("stop", unit, check=False)
    assert ct.show(unit, "ActiveState")["ActiveState"] == "inactive"
    assert ct.run(["pgrep", "-x", "llama-server"], check=False).returncode == 1
