"""An on-demand preset planned for the systemd runner (issue 22, item 4): systemd holds
its port, the engine listens on /run/loki/<preset>.sock; under the local runner (and
``lokid run``) nothing changes. Against the real engine's probe and a generated model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support.enginekit import free_port, write_config, write_preset

from lokid.core.launch.plan import build_plan
from lokid.core.launch.portunit import HELD_ENV
from lokid.core.launch.runtimeplan import RuntimePlan
from lokid.planning.gather import gather

pytestmark = pytest.mark.engine

# As tests/cli/test_cli.py: `lokid plan` as root checks files as the unit's user would.
NO_ENGINE_USER = {"LOKI_ENGINE_USER": "lokid-test-no-such-user"}


@pytest.fixture
def config(tmp_path: Path, engine: str, models: Any) -> tuple[Path, int]:
    config = write_config(tmp_path, engine, [models.dir])
    port = free_port()
    write_preset(config, "lazy", f'model = "{Path(models.llama).name}"\nctx = 2048\n'
                 f'port = {port}\n[serve]\non_demand = true\n')
    write_preset(config, "steady", f'model = "{Path(models.llama).name}"\nctx = 2048\n'
                 f'port = {free_port()}\n')
    return config, port


def listen_args(argv: tuple[str, ...] | list[str]) -> list[str]:
    i = list(argv).index("--host")
    return list(argv[i:i + 4])


def test_planned_for_the_unit_the_engine_listens_on_its_socket(config: tuple[Path, int]
                                                               ) -> None:
    root, port = config
    env = {**os.environ, **NO_ENGINE_USER, "LOKI_CONFIG_DIR": str(root),
           "LOKI_STATE_DIR": str(root.parent / "state")}
    r = subprocess.run([sys.executable, "-m", "lokid.cli", "plan", "lazy"], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "--host /run/loki/lazy.sock -c 2048" in r.stdout
    assert "--port" not in r.stdout
    assert (f"on demand: systemd holds port {port} (loki-port@lazy.socket), the engine "
            "listens on /run/loki/lazy.sock") in r.stdout
    r = subprocess.run([sys.executable, "-m", "lokid.cli", "plan", "lazy", "--json"],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["socket"] == "/run/loki/lazy.sock"
    # a preset not on demand: its port is its engine's own
    r = subprocess.run([sys.executable, "-m", "lokid.cli", "plan", "steady", "--json"],
                       env=env, capture_output=True, text=True, timeout=120)
    data = json.loads(r.stdout)
    assert "socket" not in data and listen_args(data["argv"])[2] == "--port"


def test_the_unit_plans_by_the_generators_mark_and_the_local_runner_never(
        config: tuple[Path, int]) -> None:
    root, port = config
    local = build_plan(gather(str(root), "lazy", environ={}))
    assert listen_args(local.argv) == ["--host", "127.0.0.1", "--port", str(port)]
    assert local.socket == "" and not any("systemd holds" in n for n in local.notes)
    # in the unit: the drop-in's mark, what the generator wrote
    marked = build_plan(gather(str(root), "lazy",
                               environ={HELD_ENV: "loki-port@lazy.socket"}))
    assert listen_args(marked.argv)[:2] == ["--host", "/run/loki/lazy.sock"]
    assert "--port" not in marked.argv
    assert (marked.host, marked.port, marked.socket) == ("127.0.0.1", port,
                                                         "/run/loki/lazy.sock")
    # another preset's mark is not this one's
    other = build_plan(gather(str(root), "lazy",
                              environ={HELD_ENV: "loki-port@steady.socket"}))
    assert other.socket == ""
    # the runtime plan keeps it (the engine's health probe and port check read it)
    from lokid.core.launch.attempt import Mark

    rp = RuntimePlan.of(marked, Mark("f", "/e", 1))
    assert RuntimePlan.from_json(json.loads(json.dumps(rp.to_json()))).socket == \
        "/run/loki/lazy.sock"
    assert "socket" not in RuntimePlan.of(local, Mark("f", "/e", 1)).to_json()
