"""lokid.unit.generator: an on-demand preset's port held by systemd (issue 22, item 4):
``loki-port@<preset>.socket`` listening on the preset's host:port, enabled by the
generator's own link, and the engine's drop-in marked to listen on its UNIX socket."""

from __future__ import annotations

import configparser
from pathlib import Path
from typing import Any

import pytest
from support import REPO
from support.enginekit import free_port, write_config, write_preset

from lokid.core.launch.portunit import HELD_ENV, UNIT_RUNTIME_DIR, engine_socket
from lokid.unit.generator import PORT_SOCKET_TEMPLATE_PATH, generate

ON_DEMAND = '\n[serve]\non_demand = true\n'


def config_with(tmp_path: Path, presets: dict[str, str], toml: str = "") -> Path:
    models = tmp_path / "models"
    models.mkdir(parents=True, exist_ok=True)
    (models / "m.gguf").write_bytes(b"\0" * 1024)
    config = write_config(tmp_path, "/usr/bin/llama-server", [models])
    if toml:
        with open(config / "lokid.toml", "a") as f:
            f.write(toml)
    for name, text in presets.items():
        write_preset(config, name, 'model = "m.gguf"\n' + text)
    return config


def socket_dropin(out: Path, preset: str) -> str:
    return (out / f"loki-port@{preset}.socket.d" / "50-lokid-port.conf").read_text()


def engine_dropin(out: Path, preset: str) -> str:
    return (out / f"loki-engine@{preset}.service.d" / "50-lokid-preset.conf").read_text()


def test_an_on_demand_preset_gets_its_port_unit_enabled_and_its_engine_marked(
        tmp_path: Path) -> None:
    config = config_with(tmp_path, {"lazy": "port = 18123" + ON_DEMAND,
                                    "v6": 'port = 18124\nextra_args = ["--port", "18125"]'
                                          + ON_DEMAND,
                                    "steady": "port = 18126\n"},
                         toml='host = "::1"\n')
    out = tmp_path / "gen"
    written = generate(str(config), str(out))
    assert "loki-port@lazy.socket" in written and "loki-port@v6.socket" in written
    assert not any("steady" in u for u in written if u.startswith("loki-port@"))
    # the address as a socket unit writes it; extra_args' --port wins, as in the plan
    assert socket_dropin(out, "lazy").splitlines()[-2:] == ["[Socket]",
                                                            "ListenStream=[::1]:18123"]
    assert "ListenStream=[::1]:18125" in socket_dropin(out, "v6")
    link = out / "sockets.target.wants" / "loki-port@lazy.socket"
    assert link.is_symlink() and str(link.readlink()) == PORT_SOCKET_TEMPLATE_PATH
    text = engine_dropin(out, "lazy")
    assert f'Environment="{HELD_ENV}=loki-port@lazy.socket"' in text
    assert "Wants=loki-port@lazy.socket" in text and "After=loki-port@lazy.socket" in text
    # systemd reads it: every section well-formed (a repeated section is allowed there,
    # configparser merges them only with strict=False)
    parsed = configparser.ConfigParser(strict=False, interpolation=None)
    parsed.read_string(text)
    assert parsed["Unit"]["Wants"] == "loki-port@lazy.socket"
    steady = engine_dropin(out, "steady")
    assert HELD_ENV not in steady and "loki-port@" not in steady
    assert not (out / "loki-port@steady.socket.d").exists()
    assert not (out / "sockets.target.wants" / "loki-port@steady.socket").exists()


def test_a_host_name_or_a_port_held_by_another_preset_gets_no_port_unit(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = config_with(tmp_path, {"named": "port = 18130" + ON_DEMAND,
                                    "a": "port = 18131" + ON_DEMAND,
                                    "b": "port = 18131" + ON_DEMAND,
                                    "hosted": 'port = 18132\nextra_args = ["--host", '
                                              '"127.0.0.2"]' + ON_DEMAND},
                         toml='host = "localhost"\n')
    out = tmp_path / "gen"
    written = generate(str(config), str(out))
    # localhost is a name, no ListenStream= address: none of them is held
    assert [u for u in written if u.startswith("loki-port@")] == []
    err = capsys.readouterr().err
    assert "preset named:" in err and "is a name: systemd's socket unit listens on " \
        "addresses only" in err
    assert "preset hosted:" in err and "extra_args sets --host" in err
    for name in ("named", "a", "b", "hosted"):
        assert HELD_ENV not in engine_dropin(out, name)

    config2 = config_with(tmp_path / "two", {"a": "port = 18131" + ON_DEMAND,
                                             "b": "port = 18131" + ON_DEMAND})
    out2 = tmp_path / "gen2"
    # two on one port: the first by name holds it (no start on record); the other's
    # start is refused anyway, and two sockets cannot listen on one port
    ports = [u for u in generate(str(config2), str(out2)) if u.startswith("loki-port@")]
    assert ports == ["loki-port@a.socket"]
    assert HELD_ENV in engine_dropin(out2, "a") and HELD_ENV not in engine_dropin(out2, "b")


def test_the_shipped_relay_reaches_the_socket_the_engine_is_planned_on() -> None:
    """units/loki-port@.service's ExecStart= and lokid.core.launch.portunit name one path."""
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.read_string((REPO / "units" / "loki-port@.service").read_text())
    exec_start = unit["Service"]["ExecStart"].split()
    assert exec_start[0] == "/usr/lib/systemd/systemd-socket-proxyd"
    # %t is /run for a system unit; %i the preset
    assert exec_start[1].replace("%t", "/run").replace("%i", "x") == engine_socket("x")
    assert engine_socket("x") == f"{UNIT_RUNTIME_DIR}/x.sock"
    for key in ("Wants", "PartOf"):   # not Requires=/BindsTo=: see the unit's comment
        assert unit["Unit"][key] == "loki-engine@%i.service"
    assert "Requires" not in unit["Unit"] or "engine" not in unit["Unit"]["Requires"]
    assert "loki-engine@%i.service" in unit["Unit"]["After"]
    socket = configparser.ConfigParser(strict=False, interpolation=None)
    socket.read_string((REPO / "units" / "loki-port@.socket").read_text())
    assert "ListenStream" not in socket["Socket"]    # the generator's, per instance
    assert socket["Install"]["WantedBy"] == "sockets.target"


def test_a_kept_plan_is_reused_only_where_the_port_is_held_as_it_was(
        tmp_path: Path, engine: str, models: Any) -> None:
    """The daemon keeps a plan ready for a cold start (lokid.dbus.readyplans); a start in
    the unit reuses it only when the generator's mark says what the plan assumed: a plan
    for the engine's port is not run where systemd holds it, nor the other way round."""
    import os
    import time

    from lokid.dbus.readyplans import keep_ready
    from lokid.unit.steps import _reuse

    config = write_config(tmp_path, engine, [models.dir])
    write_preset(config, "lazy", f'model = "{Path(models.llama).name}"\nctx = 2048\n'
                 f"port = {free_port()}{ON_DEMAND}")
    state, runtime = str(tmp_path / "state"), str(tmp_path / "run")
    time.sleep(1.1)   # a plan is kept once its files are a second old
    # as under the local runner (no mark): for the engine's own port
    assert keep_ready(str(config), state, runtime, "lazy", for_unit=False)
    marked = {**os.environ, HELD_ENV: "loki-port@lazy.socket"}
    assert _reuse(state, runtime, "lazy", "inv-1", marked) is None
    reused = _reuse(state, runtime, "lazy", "inv-2", dict(os.environ))
    assert reused is not None and reused[0].socket == ""
