"""``lokid check``: the config checked by lokid's own rules and planner, nothing started
(what the Ansible collection runs on a candidate before it replaces the real file)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support.enginekit import write_config, write_preset

pytestmark = pytest.mark.engine


def check(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "lokid.cli", "--config-dir", str(config),
                           "check", *args], capture_output=True, text=True, timeout=120)


def test_check_plans_each_preset_and_names_what_is_wrong(tmp_path: Path, engine: str,
                                                          models: Any) -> None:
    assert Path(models.llama).name == "llama.gguf"
    config = write_config(tmp_path, engine, [models.dir])
    write_preset(config, "good", 'model = "llama.gguf"\nctx = 2048\nport = 18555\n')
    write_preset(config, "api", 'kind = "external"\nurl = "http://10.0.0.9:9000/v1"\n')
    (config / "rpc").mkdir()
    (config / "rpc" / "w.toml").write_text('listen = "127.0.0.1:50052"\n')
    r = check(config)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.splitlines()[0] == "lokid.toml: ok"
    assert "preset good: ok: " in r.stdout and " -c 2048 " in r.stdout
    assert "preset api: ok (an external API at http://10.0.0.9:9000/v1)" in r.stdout
    assert "rpc worker w: ok: " in r.stdout and "--host 127.0.0.1 --port 50052" in r.stdout
    # a model missing, a key misspelt: each named, the others still ok, exit 2
    write_preset(config, "gone", 'model = "nope.gguf"\n')
    write_preset(config, "typo", 'model = "llama.gguf"\nctxx = 4096\n')
    r = check(config)
    assert r.returncode == 2
    assert "preset gone: " in r.stdout and "nope.gguf" in r.stdout
    assert "preset typo: " in r.stdout and "did you mean 'ctx'" in r.stdout
    assert "preset good: ok" in r.stdout and "Traceback" not in r.stderr
    # one named: the others are not asked
    r = check(config, "--preset", "good")
    assert r.returncode == 0 and "gone" not in r.stdout and "rpc worker" not in r.stdout
    r = check(config, "--rpc", "w")
    assert r.returncode == 0 and "preset" not in r.stdout


def test_check_refuses_two_presets_on_one_port_as_their_starts_would(
        tmp_path: Path, engine: str, models: Any) -> None:
    """Each alone plans fine; together the second by name could never start (its start
    refuses the port the first holds), and check said ok to both (issue 49's guide)."""
    config = write_config(tmp_path, engine, [models.dir])
    on_demand = '\n[serve]\non_demand = true\n'
    write_preset(config, "alpha", 'model = "llama.gguf"\n' + on_demand)
    write_preset(config, "beta", 'model = "llama.gguf"\n' + on_demand)
    r = check(config)
    assert r.returncode == 2, r.stdout
    assert "preset alpha: ok: " in r.stdout
    assert "preset beta: " in r.stdout and "belongs to preset alpha" in r.stdout, r.stdout
    write_preset(config, "beta", 'model = "llama.gguf"\nport = 18556\n' + on_demand)
    r = check(config)
    assert r.returncode == 0, r.stdout


def test_a_model_not_pulled_yet_is_ok_and_said(tmp_path: Path, engine: str,
                                               models: Any) -> None:
    """A preset naming a hub reference is served by the daemon (its start pulls the model
    first): check says so and passes, or the Ansible collection would refuse to deploy it.
    Its port is checked all the same, by where it will listen."""
    config = write_config(tmp_path, engine, [models.dir])
    write_preset(config, "ref", 'model = "org/repo:Q4_K_M"\nport = 18557\n')
    r = check(config)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "preset ref: ok: org/repo:Q4_K_M is not pulled yet: a start pulls it into " \
        f"{models.dir} first" in r.stdout, r.stdout
    write_preset(config, "other", 'model = "llama.gguf"\nport = 18557\n')
    r = check(config)
    assert r.returncode == 2 and "preset ref: " in r.stdout
    assert "belongs to preset other" in r.stdout, r.stdout


def test_an_example_preset_is_said_and_fails_nothing(tmp_path: Path, engine: str,
                                                     models: Any) -> None:
    """The package's example.toml (``example = true``, its model missing by design) made
    ``lokid check`` exit 2 on every fresh install (the guide walked under systemd, issue
    49). It is said to be an example, and holds no port: a real preset on the port it
    would take is ok, even with its model present."""
    assert Path(models.llama).name == "llama.gguf"
    config = write_config(tmp_path, engine, [models.dir])
    write_preset(config, "example", 'example = true\nmodel = "absent.gguf"\nport = 18558\n')
    write_preset(config, "real", 'model = "llama.gguf"\nport = 18558\n')
    r = check(config)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "preset example: an example (example = true), never started: remove that line " \
        "to serve it" in r.stdout, r.stdout
    assert "preset real: ok: " in r.stdout, r.stdout
    write_preset(config, "example", 'example = true\nmodel = "llama.gguf"\nport = 18558\n')
    r = check(config)
    assert r.returncode == 0 and "preset real: ok: " in r.stdout, r.stdout
    # the mark removed: a preset as any other, and the port is refused again
    write_preset(config, "example", 'model = "llama.gguf"\nport = 18558\n')
    r = check(config)
    assert r.returncode == 2 and "belongs to preset" in r.stdout, r.stdout
