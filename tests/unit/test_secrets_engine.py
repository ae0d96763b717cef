"""A preset's secrets on their way to the real engine: the generator's credentials, the
files read at start, the plan's checks, and ``lokid run`` with an API key and a token.

The engine (the real llama-server b11434) must then refuse a request without the key
and answer one with it; the token must be in its environment and in no command line,
log line or runtime plan.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.enginekit import free_port, write_config, write_preset

from lokid.core.config.secrets import Secret
from lokid.core.errors import ConfigError
from lokid.host.credentials import secret_env
from lokid.planning.gather import gather, make_plan
from lokid.unit.generator import generate

KEY = "sk-lokid-test-8f3a91c2"
TOKEN = "hf_lokidtesttoken0123"


def test_the_generator_loads_each_secret_as_a_credential_and_no_value(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.mkdir()
    (keys / "p.key").write_text(KEY + "\n")
    (keys / "hf").write_text(TOKEN)
    config = write_config(tmp_path, "/usr/bin/llama-server", [tmp_path])
    write_preset(config, "p", f'model = "m.gguf"\napi_key_file = "{keys}/p.key"\n'
                 f'[secrets]\nHF_TOKEN = "{keys}/hf"\nS3_SECRET = "{keys}/hf"\n')
    out = tmp_path / "gen"
    assert generate(str(config), str(out)) == ["loki-engine@p.service"]
    text = (out / "loki-engine@p.service.d" / "50-lokid-preset.conf").read_text()
    assert f"LoadCredential=api-key:{keys}/p.key\n" in text
    assert f"LoadCredential=env.HF_TOKEN:{keys}/hf\n" in text
    assert f"LoadCredential=env.S3_SECRET:{keys}/hf\n" in text
    assert KEY not in text and TOKEN not in text and "Environment=" not in text


def test_secret_env_reads_each_variables_file_and_says_which_one_failed(
        tmp_path: Path) -> None:
    (tmp_path / "t").write_text(TOKEN + "\r\n")
    (tmp_path / "nul").write_bytes(b"a\0b")
    ok = Secret("HF_TOKEN", "/etc/hf", "env.HF_TOKEN", str(tmp_path / "t"))
    key = Secret("--api-key-file", "/etc/k", "api-key", str(tmp_path / "absent"))
    assert secret_env([ok, key]) == {"HF_TOKEN": TOKEN}   # the key file is the engine's
    gone = Secret("X_TOKEN", "/etc/x", "env.X_TOKEN", str(tmp_path / "absent"))
    with pytest.raises(ConfigError) as e:
        secret_env([gone])
    assert str(e.value).startswith(f"secret X_TOKEN: cannot read {tmp_path}/absent: No such")
    assert "systemctl daemon-reload" in str(e.value)   # a credential's copy that is missing
    with pytest.raises(ConfigError, match="holds a NUL byte"):
        secret_env([Secret("N", str(tmp_path / "nul"), "env.N", str(tmp_path / "nul"))])


def test_the_plan_checks_the_files_and_in_the_unit_the_credentials(
        tmp_path: Path, engine: str, models: Any) -> None:
    Path(models.llama)  # written
    config = write_config(tmp_path, engine, [models.dir])
    key = tmp_path / "p.key"
    write_preset(config, "p", f'model = "llama.gguf"\napi_key_file = "{key}"\n')
    with pytest.raises(ConfigError, match=rf"api_key_file: {key}: No such file"):
        gather(str(config), "p", {})
    key.write_text(KEY)
    key.chmod(0o644)
    plan = make_plan(str(config), "p", {})
    assert plan.argv[plan.argv.index("--api-key-file") + 1] == str(key)
    assert any("mode 0644: every local user may read it" in n for n in plan.notes)
    key.chmod(0o600)
    assert not any("every local user" in n for n in make_plan(str(config), "p", {}).notes)
    # planned for the unit from outside: systemd's directory of the unit's credentials
    unit = make_plan(str(config), "p", {"LOKI_ENGINE_USER": "no-such-user"}, for_unit=True)
    assert unit.argv[unit.argv.index("--api-key-file") + 1] == \
        "/run/credentials/loki-engine@p.service/api-key"
    # in the unit, before the generator gave it the credential: daemon-reload, not EACCES
    creds = tmp_path / "creds"
    creds.mkdir()
    with pytest.raises(ConfigError) as e:
        gather(str(config), "p", {"LOKI_CREDENTIALS_DIR": str(creds)})
    assert "the unit has no credential api-key" in str(e.value)
    assert "run `systemctl daemon-reload`" in str(e.value)
    (creds / "api-key").write_text(KEY)
    inside = make_plan(str(config), "p", {"CREDENTIALS_DIRECTORY": str(creds)})
    assert inside.argv[inside.argv.index("--api-key-file") + 1] == f"{creds}/api-key"


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


@pytest.mark.engine
def test_lokid_run_gives_the_engine_its_key_as_a_file_and_its_token_in_its_environment(
        tmp_path: Path, engine: str, models: Any) -> None:
    Path(models.llama)  # written
    config = write_config(tmp_path, engine, [models.dir])
    keys = tmp_path / "keys"
    keys.mkdir(mode=0o700)
    (keys / "p.key").write_text(KEY + "\n")
    (keys / "hf").write_text(TOKEN + "\n")
    for f in keys.iterdir():
        f.chmod(0o600)
    port = free_port()
    write_preset(config, "p", f'model = "llama.gguf"\nctx = 2048\nport = {port}\n'
                 f'api_key_file = "{keys}/p.key"\n[secrets]\nHF_TOKEN = "{keys}/hf"\n')
    runtime = tmp_path / "run"
    env = {**os.environ, "LOKI_CONFIG_DIR": str(config), "LOKI_STATE_DIR": str(tmp_path / "s"),
           "LOKI_RUNTIME_DIR": str(runtime)}
    plan = subprocess.run([sys.executable, "-m", "lokid.cli", "plan", "p"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert plan.returncode == 0, plan.stderr
    # lokid plan shows what the unit will run: systemd's copies, and where they come from
    assert (f"the API keys (--api-key-file): from {keys}/p.key, loaded by systemd as "
            "credential api-key (/run/credentials/loki-engine@p.service/api-key)") in plan.stdout
    assert f"environment variable HF_TOKEN: from {keys}/hf, loaded by systemd" in plan.stdout
    assert KEY not in plan.stdout and TOKEN not in plan.stdout
    proc = subprocess.Popen([sys.executable, "-m", "lokid.cli", "run", "p"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    ready = threading.Event()

    def pump() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)
            if line.startswith("lokid: ready at "):
                ready.set()

    threading.Thread(target=pump, daemon=True).start()
    try:
        assert ready.wait(60), "".join(lines)
        url = f"http://127.0.0.1:{port}"
        assert httpx.get(url + "/v1/models", timeout=30).status_code == 401
        auth = {"Authorization": f"Bearer {KEY}"}
        assert httpx.get(url + "/v1/models", headers=auth, timeout=30).status_code == 200
        (pid,) = _children(proc.pid)
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        assert f"{keys}/p.key".encode() in argv
        assert not any(KEY.encode() in a or TOKEN.encode() in a for a in argv)
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        assert f"HF_TOKEN={TOKEN}".encode() in environ
        # lokid's own requests (the benchmark) send the key the engine asks for
        bench = subprocess.run([sys.executable, "-m", "lokid.cli", "bench", "p", "--prompt",
                                "100", "--predict", "8", "--json"], env=env,
                               capture_output=True, text=True, timeout=300)
        assert bench.returncode == 0, bench.stderr
        assert KEY not in bench.stdout + bench.stderr
    finally:
        proc.terminate()
        proc.wait(60)
    time.sleep(0.1)
    text = "".join(lines)
    assert "lokid: starting " in text
    assert KEY not in text and TOKEN not in text


def test_a_user_planning_for_the_unit_need_not_reach_the_secret_files(
        tmp_path: Path, engine: str, models: Any, engine_user: Any, open_tree: Path) -> None:
    """systemd reads a unit's credentials as root: `lokid plan` by a member of group loki,
    who may read the preset but not /etc/loki/keys (0700 root), shows the plan; planned as
    that user for itself (no unit), the file it cannot read is the error it would be."""
    from support.enginekit import readable_config
    from support.users import run_as

    config = readable_config(open_tree, engine, models.llama)
    keys = open_tree / "keys"
    keys.mkdir(mode=0o700)
    (keys / "p.key").write_text(KEY)
    write_preset(config, "p", f'model = "llama.gguf"\napi_key_file = "{keys}/p.key"\n')
    (config / "presets" / "p.toml").chmod(0o644)

    def plan(for_unit: bool) -> str:
        try:
            p = make_plan(str(config), "p", {}, for_unit=for_unit)
        except ConfigError as e:
            return f"error: {e}"
        return " ".join(p.argv)

    unit = run_as(engine_user, lambda: plan(True))
    assert "--api-key-file /run/credentials/loki-engine@p.service/api-key" in unit, unit
    assert run_as(engine_user, lambda: plan(False)) == \
        f"error: {config}/presets/p.toml: api_key_file: {keys}/p.key: permission denied"
