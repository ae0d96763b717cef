"""lokid.unit.generator: per-preset drop-ins for loki-engine@<preset>.service."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support import DATA
from support.enginekit import write_config, write_preset

from lokid.unit.generator import BASE_START_TIMEOUT, MAX_START_TIMEOUT, generate, start_timeout


def dropin(out: Path, preset: str) -> str:
    return (out / f"loki-engine@{preset}.service.d" / "50-lokid-preset.conf").read_text()


def test_one_dropin_per_valid_preset(tmp_path: Path) -> None:
    models = tmp_path / "models"
    models.mkdir()
    (models / "big.gguf").write_bytes(b"\0" * (3 * 2**20))
    config = write_config(tmp_path, "/usr/bin/llama-server", [models])
    write_preset(config, "a-b.c_d", 'model = "big.gguf"\ngpus = [0, 2]\n')
    write_preset(config, "cpu", 'model = "/elsewhere/missing%.gguf"\n')
    write_preset(config, "broken", "model = \n")
    out = tmp_path / "gen"
    assert generate(str(config), str(out)) == ["loki-engine@a-b.c_d.service",
                                               "loki-engine@cpu.service"]
    text = dropin(out, "a-b.c_d")
    assert "Description=lokid engine a-b.c_d: big.gguf" in text
    assert 'Environment="CUDA_VISIBLE_DEVICES=0,2"' in text
    assert f"TimeoutStartSec={start_timeout(3 * 2**20)}" in text
    cpu = dropin(out, "cpu")
    assert "CUDA_VISIBLE_DEVICES" not in cpu
    assert "Description=lokid engine cpu: missing%%.gguf" in cpu  # % is a specifier
    assert f"TimeoutStartSec={BASE_START_TIMEOUT}" in cpu  # size unknown (disk not mounted?)
    assert not (out / "loki-engine@broken.service.d").exists()


@pytest.mark.parametrize(("name", "env", "golden"), [
    ("gpus", "", "engine-gpus.conf"),
    ("own", '\n[env]\nCUDA_DEVICE_ORDER = "FASTEST_FIRST"\n', "engine-gpus-own-order.conf")])
def test_a_gpus_dropin_pins_the_gpus_in_nvmls_numbering(tmp_path: Path, name: str, env: str,
                                                         golden: str) -> None:
    """Golden drop-ins: CUDA numbers GPUs fastest first unless CUDA_DEVICE_ORDER says
    PCI_BUS_ID, while lokid names them by NVML (nvidia-smi's PCI bus order), so the
    drop-in writes both, unless the preset orders them itself (issue 44, item 4)."""
    models = tmp_path / "models"
    models.mkdir()
    (models / "big.gguf").write_bytes(b"\0" * (3 * 2**20))
    config = write_config(tmp_path, "/usr/bin/llama-server", [models])
    path = write_preset(config, name, f'model = "big.gguf"\ngpus = [1, 0]\n{env}')
    generate(str(config), str(tmp_path / "gen"))
    expected = (DATA / "generated" / golden).read_text().replace("@PRESET@", str(path))
    assert dropin(tmp_path / "gen", name) == expected


def test_start_timeout_scales_with_the_model_and_is_bounded() -> None:
    assert start_timeout(None) == BASE_START_TIMEOUT
    assert start_timeout(40 * 2**30) > start_timeout(4 * 2**30) > BASE_START_TIMEOUT
    assert start_timeout(10 * 2**40) == MAX_START_TIMEOUT


def test_generator_command_takes_systemds_three_directories(tmp_path: Path) -> None:
    config = write_config(tmp_path, "/usr/bin/llama-server", [tmp_path])
    write_preset(config, "p", 'model = "m.gguf"\n')
    dirs = [tmp_path / d for d in ("normal", "early", "late")]
    r = subprocess.run([sys.executable, "-m", "lokid.cli", "--config-dir", str(config),
                        "generate", *map(str, dirs)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "Description=lokid engine p: m.gguf" in dropin(dirs[0], "p")
    assert not dirs[1].exists() and not dirs[2].exists()


def test_the_preset_on_a_held_port_is_reported_and_both_still_generated(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    from lokid.core.launch.attempt import Mark
    from lokid.core.launch.runtimeplan import RuntimePlan
    from lokid.store.runtimedir import write_runtime_plan

    monkeypatch.delenv("SYSTEMD_SCOPE", raising=False)  # stderr, not the kernel log
    run = tmp_path / "run"
    monkeypatch.setenv("LOKI_RUNTIME_DIR", str(run))
    models = tmp_path / "models"
    models.mkdir()
    (models / "m.gguf").write_bytes(b"\0" * 1024)
    config = write_config(tmp_path, "/usr/bin/llama-server", [models])
    a = write_preset(config, "a", 'model = "m.gguf"\nport = 9000\n')
    b = write_preset(config, "b", 'model = "m.gguf"\nextra_args = ["--port=9000"]\n')
    write_preset(config, "c", 'model = "m.gguf"\n')
    write_preset(config, "example", 'model = "absent.gguf"\n')  # cannot start: no clash
    out = tmp_path / "gen"
    units = [f"loki-engine@{p}.service" for p in ("a", "b", "c", "example")]
    assert generate(str(config), str(out)) == units
    # none has started: a, first by name, holds the port; b is the one reported
    assert capsys.readouterr().err.splitlines() == [
        f"lokid-generator: preset b: {b}: port 9000 on 127.0.0.1 belongs to preset a ({a}), "
        "first by name (no preset has started on it since boot): set another port in this "
        "preset",
    ]
    # b runs on it (its runtime plan): a, written beside it, is the one reported
    write_runtime_plan(str(run), RuntimePlan("b", ("/e",), {}, "127.0.0.1", 9000,
                                             Mark("f", "/e", 1)))
    assert generate(str(config), str(out)) == units
    assert capsys.readouterr().err.splitlines() == [
        f"lokid-generator: preset a: {a}: port 9000 on 127.0.0.1 belongs to preset b ({b}), "
        "the last to start on it: set another port in this preset",
    ]


def test_the_daemon_may_reach_the_addresses_presets_bind_to(tmp_path: Path, engine: str,
                                                           models: Any) -> None:
    """lokid.service allows loopback only; a preset on a LAN address adds that address (and
    only it) to the daemon's IPAddressAllow=; wildcards need nothing, names are reported."""
    from lokid.unit.generator import DAEMON_DROPIN, engine_addresses, generate

    assert engine_addresses({"a": "127.0.0.1", "b": "0.0.0.0", "c": "::", "d": "::1",
                             "e": "localhost"}) == ([], {})
    allow, unreachable = engine_addresses({"lan": "192.0.2.7", "v6": "2001:db8::5",
                                           "named": "gpu1.lan", "again": "192.0.2.7"})
    assert allow == ["192.0.2.7", "2001:db8::5"]
    assert list(unreachable) == ["named"] and "is a name" in unreachable["named"]

    config = write_config(tmp_path, engine, [models.dir])
    write_preset(config, "lan", f'model = "{Path(models.llama).name}"\nport = 8201\n'
                 'extra_args = ["--host", "192.0.2.7"]\n')
    write_preset(config, "local", f'model = "{Path(models.llama).name}"\nport = 8202\n')
    out = tmp_path / "gen"
    assert "lokid.service" in generate(str(config), str(out))
    text = (out / "lokid.service.d" / DAEMON_DROPIN).read_text()
    assert text.splitlines()[-2:] == ["[Service]", "IPAddressAllow=192.0.2.7"]
    (config / "presets" / "lan.toml").unlink()
    out2 = tmp_path / "gen2"
    assert "lokid.service" not in generate(str(config), str(out2))
    assert not (out2 / "lokid.service.d").exists()


def test_file_names_that_are_not_text_neither_stop_it_nor_forge_lines(tmp_path: Path) -> None:
    """A preset file named b"\\xff.toml" (not UTF-8) or "a\\nb.toml": the warning is one
    escaped line, written where the generator writes (the kernel log under systemd, which
    is opened as UTF-8: a lone surrogate failed the write, and every drop-in after it),
    and the good preset still gets its drop-in."""
    import os

    config = write_config(tmp_path, "/usr/bin/llama-server", [tmp_path])
    write_preset(config, "good", 'model = "/m/good.gguf"\n')
    presets = os.fsencode(config / "presets")
    for raw in (b"\xff.toml", b"a\nlokid: forged.toml"):
        with open(os.path.join(presets, raw), "w") as f:
            f.write('model = "/m/x.gguf"\n')
    out = tmp_path / "gen"
    r = subprocess.run([sys.executable, "-m", "lokid.cli", "--config-dir", str(config),
                        "generate", str(out)], capture_output=True, check=False)
    assert r.returncode == 0, r.stderr
    assert "Description=lokid engine good: good.gguf" in dropin(out, "good")
    lines = r.stderr.decode().splitlines()
    assert all(line.startswith("lokid-generator: ") for line in lines), lines
    assert any("\\udcff" in line for line in lines) and \
        any("a\\u000alokid: forged" in line for line in lines), lines


def test_a_presets_directory_that_cannot_be_listed_is_one_warning(tmp_path: Path) -> None:
    config = write_config(tmp_path, "/usr/bin/llama-server", [tmp_path])
    (config / "presets").rmdir()
    (config / "presets").write_text("not a directory\n")
    r = subprocess.run([sys.executable, "-m", "lokid.cli", "--config-dir", str(config),
                        "generate", str(tmp_path / "gen")], capture_output=True, text=True,
                       check=False)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.startswith("lokid-generator: ") and "cannot list the presets" in r.stderr


def gateway_config(tmp_path: Path, table: str) -> Path:
    config = write_config(tmp_path, "/usr/bin/llama-server", [tmp_path])
    with (config / "lokid.toml").open("a") as f:
        f.write(table)
    return config


def test_the_gateway_listens_where_lokid_toml_says_and_is_enabled(tmp_path: Path) -> None:
    config = gateway_config(tmp_path, '[gateway]\nlisten = ["127.0.0.1:8000", "[::1]:8001", '
                            '"10.1.2.3:8443"]\napi_keys_file = "/etc/loki/gateway.keys"\n')
    out = tmp_path / "gen"
    assert generate(str(config), str(out)) == ["loki-gateway.socket", "loki-gateway.service"]
    socket = (out / "loki-gateway.socket.d" / "50-lokid-gateway.conf").read_text()
    assert [line for line in socket.splitlines() if not line.startswith("#")] == [
        "[Socket]", "ListenStream=127.0.0.1:8000", "ListenStream=[::1]:8001",
        "ListenStream=10.1.2.3:8443"]
    service = (out / "loki-gateway.service.d" / "50-lokid-gateway.conf").read_text()
    assert [line for line in service.splitlines() if not line.startswith("#")] == [
        "[Service]", "LoadCredential=gateway-api-keys:/etc/loki/gateway.keys"]
    link = out / "sockets.target.wants" / "loki-gateway.socket"
    assert link.is_symlink() and link.readlink().name == "loki-gateway.socket"


def test_without_listen_the_gateway_is_off_and_keys_need_no_credential(tmp_path: Path) -> None:
    out = tmp_path / "gen"
    config = gateway_config(tmp_path, "")
    write_preset(config, "p", 'model = "m.gguf"\n')
    assert generate(str(config), str(out)) == ["loki-engine@p.service"]
    assert sorted(p.name for p in out.iterdir()) == ["loki-engine@p.service.d"]
    # loopback only, no keys: the socket's drop-in, no service drop-in
    out2 = tmp_path / "gen2"
    config = gateway_config(tmp_path / "two", '[gateway]\nlisten = ["127.0.0.1:8000"]\n')
    assert generate(str(config), str(out2)) == ["loki-gateway.socket"]
    assert not (out2 / "loki-gateway.service.d").exists()


def test_a_broken_presets_directory_leaves_the_gateway_on(tmp_path: Path) -> None:
    config = gateway_config(tmp_path, '[gateway]\nlisten = ["127.0.0.1:8000"]\n')
    (config / "presets").rmdir()
    (config / "presets").write_text("not a directory\n")
    out = tmp_path / "gen"
    assert generate(str(config), str(out)) == ["loki-gateway.socket"]
    assert (out / "sockets.target.wants" / "loki-gateway.socket").is_symlink()


def test_an_external_preset_gets_no_engine_unit_and_its_key_reaches_the_gateway(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """kind = "external": nothing runs here, so no loki-engine@ drop-in; its api_key_file
    (and a keyed engine's own, which the gateway sends that engine) becomes a credential
    of loki-gateway.service; a key file missing now is left out with a message (one
    LoadCredential= that cannot be read would fail the whole gateway); an external API
    at an address is allowed to the daemon's sandbox (its reachability check)."""
    keys = tmp_path / "keys"
    keys.mkdir()
    (keys / "remote.key").write_text("sk-upstream\n")
    (keys / "local.key").write_text("sk-engine\n")
    config = gateway_config(tmp_path, '[gateway]\nlisten = ["127.0.0.1:8000"]\n'
                            'api_keys_file = "/etc/loki/gateway.keys"\n')
    write_preset(config, "remote", 'kind = "external"\nurl = "http://10.9.8.7:9100/v1"\n'
                 f'api_key_file = "{keys}/remote.key"\n')
    write_preset(config, "named", 'kind = "external"\nurl = "https://api.example.org/v1"\n'
                 f'api_key_file = "{keys}/gone.key"\n')
    write_preset(config, "local", f'model = "m.gguf"\napi_key_file = "{keys}/local.key"\n')
    out = tmp_path / "gen"
    written = generate(str(config), str(out))
    assert "loki-engine@remote.service" not in written
    assert not (out / "loki-engine@remote.service.d").exists()
    assert not (out / "loki-engine@named.service.d").exists()
    assert "loki-engine@local.service" in written
    service = (out / "loki-gateway.service.d" / "50-lokid-gateway.conf").read_text()
    assert [line for line in service.splitlines() if not line.startswith("#")] == [
        "[Service]", "LoadCredential=gateway-api-keys:/etc/loki/gateway.keys",
        f"LoadCredential=preset-key.local:{keys}/local.key",
        f"LoadCredential=preset-key.remote:{keys}/remote.key"]
    err = capsys.readouterr().err
    assert f"preset named: {config}/presets/named.toml: api_key_file {keys}/gone.key does " \
           "not exist" in err
    daemon = (out / "lokid.service.d" / "50-lokid-engine-addresses.conf").read_text()
    assert "IPAddressAllow=10.9.8.7" in daemon
    # the preset's keys alone give the gateway its drop-in: no client keys needed
    out2 = tmp_path / "gen2"
    config2 = gateway_config(tmp_path / "two", '[gateway]\nlisten = ["127.0.0.1:8000"]\n')
    write_preset(config2, "remote", 'kind = "external"\nurl = "http://127.0.0.1:9/v1"\n'
                 f'api_key_file = "{keys}/remote.key"\n')
    assert generate(str(config2), str(out2)) == ["loki-gateway.socket", "loki-gateway.service"]
    assert f"LoadCredential=preset-key.remote:{keys}/remote.key" in (
        out2 / "loki-gateway.service.d" / "50-lokid-gateway.conf").read_text()
