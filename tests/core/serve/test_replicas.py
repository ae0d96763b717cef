"""lokid.core.serve.replicas and [serve] replicas/max_replicas (issue 47): instance names, the
settings and their errors, each replica's port, the port conflicts every replica counts
in, the generator's drop-ins and lokid plan's replica lines (planned with the real
engine's --help and a generated model)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.enginekit import write_config, write_preset

from lokid.core.config import files as cfg
from lokid.core.errors import ConfigError
from lokid.core.serve import replicas as rp


def preset(tmp_path: Path, body: str, name: str = "p") -> cfg.Preset:
    (tmp_path / "presets").mkdir(exist_ok=True)
    (tmp_path / "presets" / f"{name}.toml").write_text('model = "m"\n' + body)
    return cfg.load_preset(str(tmp_path), name)


@pytest.mark.parametrize(("name", "found"), [
    ("m", ("m", 1)), ("m:2", ("m", 2)), ("a-b.c_d:16", ("a-b.c_d", 16)),
    ("m:1", None), ("m:0", None), ("m:02", None), ("m:17", None), ("m:", None),
    ("m:x", None), (":2", None), ("../x:2", None), ("m:2:2", None), ("m:２", None),
])
def test_instance_names_split_into_preset_and_index(name: str, found: object) -> None:
    assert rp.split_instance(name) == found
    if found is None:
        with pytest.raises(ConfigError, match="invalid preset name"):
            rp.check_instance_name(name)
    else:
        rp.check_instance_name(name)
        assert rp.instance(*found) == name


def test_replica_one_is_the_preset_itself() -> None:
    assert rp.instance("m", 1) == "m" and not rp.is_replica("m")
    assert rp.is_replica("m:3") and rp.preset_of("m:3") == "m"
    assert rp.replica_names("m", 1) == [] and rp.replica_names("m", 3) == ["m:2", "m:3"]


@pytest.mark.parametrize(("body", "count", "bound"), [
    ("", 1, 1),
    ("[serve]\nreplicas = 2\n", 2, 2),
    ("[serve]\nreplicas = 2\nmax_replicas = 4\n", 2, 4),
    ("[serve]\nmax_replicas = 3\n", 1, 3),
])
def test_replicas_and_their_bound_parse_with_defaults(tmp_path: Path, body: str, count: int,
                                                      bound: int) -> None:
    serve = preset(tmp_path, body).serve
    assert (serve.replicas, serve.max_replicas) == (count, bound)


@pytest.mark.parametrize(("body", "error"), [
    ("[serve]\nreplicas = 0\n", r"replicas: 0 is out of range \(engines a start runs, 1 to 16\)"),
    ("[serve]\nreplicas = 17\n", "replicas: 17 is out of range"),
    ("[serve]\nreplicas = true\n", "replicas: must be an integer"),
    ("[serve]\nreplicas = 3\nmax_replicas = 2\n", "max_replicas: 2 is below replicas = 3"),
    ("[serve]\nreplica = 2\n", "replica"),
])
def test_a_bad_replica_setting_names_the_file_line_and_key(tmp_path: Path, body: str,
                                                           error: str) -> None:
    with pytest.raises(ConfigError, match=error) as e:
        preset(tmp_path, body)
    assert "p.toml" in str(e.value)


def test_a_broken_replica_setting_costs_only_its_own_preset(tmp_path: Path) -> None:
    (tmp_path / "presets").mkdir()
    (tmp_path / "presets" / "bad.toml").write_text(
        'model = "m"\n[serve]\nreplicas = 3\nmax_replicas = 2\n')
    preset(tmp_path, "[serve]\nreplicas = 2\n", "good")
    good, bad = cfg.load_presets(str(tmp_path))
    assert set(good) == {"good"} and set(bad) == {"bad"}


def test_each_replica_is_the_preset_on_its_own_port(tmp_path: Path) -> None:
    p = preset(tmp_path, 'port = 9000\nextra_args = ["-np", "2"]\n'
               "[serve]\non_demand = true\nreplicas = 2\nmax_replicas = 3\n")
    glob = cfg.GlobalConfig()
    assert rp.replica_preset(p, glob, 1) is p
    third = rp.replica_preset(p, glob, 3)
    assert (third.name, third.port, third.path, third.extra_args) == \
        ("p:3", 9002, p.path, ("-np", "2"))
    assert not third.serve.on_demand   # the held port is replica 1's
    with pytest.raises(ConfigError, match="max_replicas is 3"):
        rp.replica_preset(p, glob, 4)


def test_a_port_in_extra_args_moves_with_the_replica(tmp_path: Path) -> None:
    p = preset(tmp_path, 'extra_args = ["--port", "7000", "--port=7001"]\n'
               "[serve]\nreplicas = 2\n")
    assert rp.replica_preset(p, cfg.GlobalConfig(), 2).extra_args == \
        ("--port", "7001", "--port=7002")


def test_a_replica_past_port_65535_is_refused(tmp_path: Path) -> None:
    p = preset(tmp_path, "port = 65535\n[serve]\nreplicas = 2\n")
    with pytest.raises(ConfigError, match="port 65536, past 65535"):
        rp.replica_preset(p, cfg.GlobalConfig(), 2)


def test_every_replica_port_counts_in_the_conflicts(tmp_path: Path) -> None:
    """A preset set on the port of another's replica 3 (max_replicas, not started) is
    refused before that replica ever starts; the replicas' ports are the preset's + k - 1."""
    from lokid.core.launch.conflicts import port_conflicts
    from lokid.planning.gather import listeners

    models = tmp_path / "models"
    models.mkdir()
    (models / "m").write_bytes(b"")
    glob = cfg.GlobalConfig(model_dirs=(str(models),))
    a = preset(tmp_path, "port = 8000\n[serve]\nreplicas = 2\nmax_replicas = 3\n", "a")
    b = preset(tmp_path, "port = 8002\n", "b")
    found = listeners(glob, {"a": a, "b": b})
    assert {n: e.port for n, e in found.items()} == {"a": 8000, "a:2": 8001, "a:3": 8002,
                                                     "b": 8002}
    clashes = port_conflicts(found)
    assert list(clashes) == ["b"] and "belongs to preset a:3" in clashes["b"]


def test_the_generator_writes_each_replicas_own_dropin(tmp_path: Path) -> None:
    from lokid.unit.generator import generate

    models = tmp_path / "models"
    models.mkdir()
    (models / "m.gguf").write_bytes(b"\0" * 1024)
    config = write_config(tmp_path, "/usr/bin/llama-server", [models])
    write_preset(config, "r", 'model = "m.gguf"\ngpus = [1]\n'
                 "[serve]\non_demand = true\nreplicas = 2\nmax_replicas = 3\n")
    out = tmp_path / "gen"
    written = generate(str(config), str(out))
    assert written[:3] == ["loki-engine@r.service", "loki-engine@r:2.service",
                           "loki-engine@r:3.service"]
    own = (out / "loki-engine@r.service.d" / "50-lokid-preset.conf").read_text()
    third = (out / "loki-engine@r:3.service.d" / "50-lokid-preset.conf").read_text()
    assert "Description=lokid engine r:3: m.gguf" in third
    assert 'Environment="CUDA_VISIBLE_DEVICES=1"' in third
    assert "loki-port@r.socket" in own and "loki-port" not in third   # replica 1's port
    assert not (out / "loki-engine@r:4.service.d").exists()


def test_lokid_plan_shows_each_replica_and_its_command_line(tmp_path: Path, engine: str,
                                                            models: object,
                                                            capsys: pytest.CaptureFixture[str],
                                                            monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    from lokid.cli import main

    llama = models.llama  # type: ignore[attr-defined]
    config = write_config(tmp_path, engine, [Path(llama).parent])
    write_preset(config, "r", f'model = "{Path(llama).name}"\nport = 18500\n'
                 "[serve]\nreplicas = 2\nmax_replicas = 3\nidle_stop = \"10m\"\n")
    monkeypatch.setenv("LOKI_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("LOKI_RUNTIME_DIR", str(tmp_path / "run"))
    assert main(["--config-dir", str(config), "plan", "r"]) == 0
    text = capsys.readouterr().out
    assert "replicas = 2: a start runs r on port 18500, r:2 on port 18501" in text
    assert "up to 3 (max_replicas, up to port 18502) by StartReplica" in text
    line = next(x for x in text.splitlines() if x.startswith("replica 3 "))
    assert line.startswith("replica 3 (loki-engine@r:3.service): ")
    assert "--port 18502" in line
    assert main(["--config-dir", str(config), "plan", "r", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert "18500" in data["argv"]
    assert [(r["index"], r["port"], r["unit"]) for r in data["replicas"]] == [
        (2, 18501, "loki-engine@r:2.service"), (3, 18502, "loki-engine@r:3.service")]
    assert main(["--config-dir", str(config), "plan", "r:2", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["preset"], "replicas" in data) == ("r:2", False) and "18501" in data["argv"]
    # its answers name the preset's model, never "r:2"; its stops are its preset's: no
    # idle stop of its own (its plan named one, which no one runs)
    assert data["argv"][data["argv"].index("--alias") + 1] == "r"
    notes = "\n".join(data["notes"])
    assert "replica 2 of preset r: its own loki-engine@ unit, started with the preset" in notes
    assert "idle_stop = 10min: stopped after" not in notes, notes
