"""Two presets on one port under a real systemd (Debian 12): the newcomer is refused, the
running one is never taken down (issue 20, item 5).

lokid is installed in the session's container as its package will be
(tests/support/lokid_install.py); the engine is the real llama-server. ``glm`` runs,
then ``dup.toml`` is dropped with its port and systemd reloaded (the generator runs):
a restart of glm by hand and a crash restart both bring it back, a start of dup fails
once with the reason as its Status, and the daemon (lokid.service, D-Bus activated)
lists dup as broken and glm as fine, in ``lokictl presets`` and ``lokictl status``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from support.lokid_install import CONFIG_DIR, LokidSystem, install, unit
from support.systemd_harness import Container

pytestmark = [pytest.mark.systemd, pytest.mark.engine, pytest.mark.slow]


@pytest.fixture(scope="module")
def lk(systemd_container: Container, container_engine: str, models: Any
       ) -> Iterator[LokidSystem]:
    system = install(systemd_container, container_engine, [models.llama])
    yield system
    systemd_container.systemctl("stop", "lokid.service", check=False)
    system.cleanup()


def lokictl(ct: Container, *args: str) -> Any:
    return ct.run(["env", "PYTHONPATH=/opt/lokid", "python3", "-m", "lokid.ctl", *args],
                  check=False, timeout=120)


def test_a_preset_dropped_on_a_running_ones_port_is_the_one_refused(lk: LokidSystem) -> None:
    ct = lk.ct
    port = lk.preset("glm", 'model = "llama.gguf"\n')
    lk.dropin("glm", {"RestartSec": "1"})
    ct.systemctl("start", unit("glm"))
    assert lk.health(port) == 200
    # dup comes first by name, and takes glm's port; daemon-reload runs the generator
    lk.write_preset_text("dup", f'model = "llama.gguf"\nctx = 2048\nport = {port}\n')
    reason = (f"{CONFIG_DIR}/presets/dup.toml: port {port} on 127.0.0.1 belongs to preset "
              f"glm ({CONFIG_DIR}/presets/glm.toml), the last to start on it: set another "
              "port in this preset")

    # the restart by hand that exited 78 (glm down): glm comes back
    ct.systemctl("restart", unit("glm"))
    assert lk.show("glm", "ActiveState")["ActiveState"] == "active"
    assert lk.health(port) == 200
    # a crash restart too
    restarts = int(lk.show("glm", "NRestarts")["NRestarts"])
    ct.run(["kill", "-KILL", str(lk.engine_pid("glm"))])
    lk.wait_restarts("glm", restarts + 1, timeout=30)
    ct.wait_for(unit("glm"), "active", timeout=60)
    assert lk.health(port) == 200

    # the newcomer fails once, with the reason as its Status
    r = ct.systemctl("start", unit("dup"), check=False)
    assert r.returncode != 0
    props = lk.show("dup", "ActiveState", "ExecMainStatus", "StatusText")
    assert props == {"ActiveState": "failed", "ExecMainStatus": "78",
                     "StatusText": reason}, props
    assert lk.show("glm", "ActiveState")["ActiveState"] == "active"

    # the daemon says the same: dup broken with the reason, glm running and fine
    r = lokictl(ct, "reload")
    assert r.returncode == 0, r.stderr
    rows = {row["Name"]: row for row in json.loads(lokictl(ct, "presets", "--json").stdout)}
    assert rows["dup"]["State"] == "broken" and rows["dup"]["Error"] == reason, rows["dup"]
    assert rows["glm"]["State"] == "ready" and "Error" not in rows["glm"], rows["glm"]
    text = lokictl(ct, "presets").stdout
    assert any(line.startswith("dup ") and " broken " in line and "belongs to preset glm"
               in line for line in text.splitlines()), text
    status = json.loads(lokictl(ct, "status", "--json").stdout)
    assert status["broken"] == {"dup": reason}, status
    assert "Traceback" not in lk.journal("glm") + lk.journal("dup")
