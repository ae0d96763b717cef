"""lokid.core.config.secrets and the secrets of a preset: masking, the preset keys, the plan.

No value of a secret is ever in a plan, a runtime plan, a log line or what a caller
without the edit right reads; the API key reaches the engine as a file
(``--api-key-file``), under systemd as a credential's copy.
"""

from __future__ import annotations

import pytest
from support.engine_data import B11434, ENGINE
from support.headers import MTP

from lokid.core.config import files as cfg
from lokid.core.config import secrets
from lokid.core.config.files import GlobalConfig, Preset
from lokid.core.config.secrets import command_line
from lokid.core.errors import ConfigError
from lokid.core.launch.attempt import Mark
from lokid.core.launch.plan import PlanInputs, build_plan, format_plan
from lokid.core.launch.runtimeplan import RuntimePlan

GLOBAL = GlobalConfig(engine=ENGINE, model_dirs=("/m",))
CREDS = "/run/credentials/loki-engine@p.service"


def plan_of(preset: Preset, **kw: object) -> object:
    base: dict[str, object] = dict(preset=preset, config=GLOBAL, model_path=MTP.path,
                                   model=MTP, caps=B11434)
    base.update(kw)
    return build_plan(PlanInputs(**base))  # type: ignore[arg-type]


def preset(**kw: object) -> Preset:
    base: dict[str, object] = dict(name="p", path="/etc/loki/presets/p.toml", model="m.gguf")
    base.update(kw)
    return Preset(**base)  # type: ignore[arg-type]


def parse(text: str) -> Preset:
    return cfg.parse_preset_text("p", "/etc/loki/presets/p.toml", 'model = "/m/m.gguf"\n' + text)


@pytest.mark.parametrize(("argv", "shown"), [
    (["llama-server", "--api-key", "sk-1", "--jinja"],
     ["llama-server", "--api-key", "***", "--jinja"]),
    (["--api-key=sk-1,sk-2"], ["--api-key=***"]),
    (["-hft", "hf_x", "--hf-token=hf_y"], ["-hft", "***", "--hf-token=***"]),
    (["--api-key-file", "/etc/k", "--ssl-key-file", "/etc/s"],
     ["--api-key-file", "/etc/k", "--ssl-key-file", "/etc/s"]),   # paths are shown
    (["--api-key"], ["--api-key"]),                                 # no value to hide
    (["--api-keys", "x"], ["--api-keys", "x"]),                     # another flag
])
def test_mask_argv_hides_the_values_of_secret_flags_in_both_spellings(
        argv: list[str], shown: list[str]) -> None:
    assert secrets.mask_argv(argv) == shown


def test_every_env_value_is_masked_for_a_caller_and_secret_names_in_a_log() -> None:
    env = {"CUDA_VISIBLE_DEVICES": "0", "HF_TOKEN": "hf_x", "OPENAI_API_KEY": "sk",
           "S3_SECRET": "s", "LLAMA_API_KEY": "k"}
    assert secrets.mask_env(env) == dict.fromkeys(env, "***")
    assert secrets.log_env(env) == {"CUDA_VISIBLE_DEVICES": "0", "HF_TOKEN": "***",
                                    "OPENAI_API_KEY": "***", "S3_SECRET": "***",
                                    "LLAMA_API_KEY": "***"}
    line = command_line(env, ["llama-server", "--api-key", "sk-live", "-c", "8"])
    assert "sk-live" not in line and "hf_x" not in line and "CUDA_VISIBLE_DEVICES=0" in line


def test_the_preset_keys_name_files_and_are_checked() -> None:
    p = parse('api_key_file = "/etc/loki/keys/p.key"\n[secrets]\nHF_TOKEN = "/etc/loki/t"\n')
    assert p.api_key_file == "/etc/loki/keys/p.key" and p.secrets == {"HF_TOKEN": "/etc/loki/t"}
    for text, message in (
            ('api_key_file = "keys/p.key"', "api_key_file: 'keys/p.key' is not an absolute"),
            ('api_key_file = "/etc/my keys/p"', "without spaces, quotes"),
            ('api_key_file = "/etc/k%i"', "'%'"),
            ('api_key_file = "/k"\nextra_args = ["--api-key", "x"]',
             "api_key_file: --api-key is set too"),
            ('api_key_file = "/k"\nextra_args = ["--api-key-file=/j"]',
             "api_key_file: --api-key-file is set too"),
            ('api_key_file = "/k"\n[env]\nLLAMA_API_KEY = "x"',
             "api_key_file: env.LLAMA_API_KEY is set too"),
            ('[secrets]\nHF_TOKEN = 12', "secrets.HF_TOKEN: must be the path of the file"),
            ('[secrets]\n"1X" = "/t"', "is not a valid environment variable name"),
            ('[env]\nHF_TOKEN = "x"\n[secrets]\nHF_TOKEN = "/t"',
             "secrets.HF_TOKEN: env.HF_TOKEN is set too"),
            ('secrets = "/t"', "secrets: must be a table")):
        with pytest.raises(ConfigError) as e:
            parse(text + "\n")
        assert message in str(e.value), (text, str(e.value))


def test_the_api_key_reaches_the_engine_as_a_file_under_systemd_its_credential() -> None:
    p = preset(api_key_file="/etc/loki/keys/p.key", secrets={"HF_TOKEN": "/etc/loki/hf"},
               extra_args=("--jinja",))
    plan = plan_of(p, credentials_dir=CREDS)
    assert plan.argv[-3:] == ("--api-key-file", f"{CREDS}/api-key", "--jinja")
    assert [s.to_json() for s in plan.secrets] == [
        {"target": "--api-key-file", "source": "/etc/loki/keys/p.key",
         "credential": "api-key", "path": f"{CREDS}/api-key"},
        {"target": "HF_TOKEN", "source": "/etc/loki/hf", "credential": "env.HF_TOKEN",
         "path": f"{CREDS}/env.HF_TOKEN"}]
    assert "HF_TOKEN" not in plan.env   # read at start, into the engine's environment only
    assert plan.to_json()["secrets"] == [s.to_json() for s in plan.secrets]
    # without systemd the engine reads the file itself
    local = plan_of(p)
    assert local.argv[-3:-1] == ("--api-key-file", "/etc/loki/keys/p.key")
    text = format_plan(plan)
    assert "from /etc/loki/keys/p.key, loaded by systemd as credential api-key" in text
    assert "environment variable HF_TOKEN: from /etc/loki/hf" in text
    assert text.count("/etc/loki/hf") == 1   # its note is the section's line, not again
    assert any(n.startswith("secret: environment variable HF_TOKEN") for n in plan.notes)


def test_a_key_on_the_command_line_is_masked_in_the_plan_and_gets_a_note() -> None:
    p = preset(extra_args=("--api-key", "sk-live-123"), env={"HF_TOKEN": "hf_abc"})
    plan = plan_of(p)
    assert "sk-live-123" in plan.argv          # it is what runs: the note says where it shows
    notes = " ".join(plan.notes)
    assert "--api-key a value on the command line, which every local user sees in `ps`" \
        in notes and 'api_key_file = "/path"' in notes
    assert "env.HF_TOKEN looks like a secret" in notes and "[secrets]" in notes
    text = format_plan(plan)
    assert "sk-live-123" not in text and "--api-key '***'" in text


def test_a_world_readable_secret_file_is_noted() -> None:
    p = preset(api_key_file="/etc/loki/keys/p.key")
    plan = plan_of(p, loose_secrets={"/etc/loki/keys/p.key": 0o644})
    assert any("mode 0644: every local user may read it; `chmod 600 /etc/loki/keys/p.key`"
               in n for n in plan.notes), plan.notes


def test_the_runtime_plan_carries_where_secrets_are_read_never_values() -> None:
    p = preset(secrets={"HF_TOKEN": "/etc/loki/hf"})
    plan = plan_of(p, credentials_dir=CREDS)
    rp = RuntimePlan.of(plan, Mark("f", ENGINE, 11434))
    again = RuntimePlan.from_json(rp.to_json())
    assert again.secrets == plan.secrets and again == rp
    older = rp.to_json()
    del older["secrets"]   # written by a lokid from before secrets
    assert RuntimePlan.from_json(older).secrets == ()
    with pytest.raises(ValueError):
        RuntimePlan.from_json({**rp.to_json(), "secrets": [{"target": "X"}]})


def test_credential_ids_and_paths() -> None:
    assert secrets.credential_id("--api-key-file") == "api-key"
    assert secrets.credential_id("HF_TOKEN") == "env.HF_TOKEN"
    assert secrets.unit_credentials_dir("loki-engine@a.b.service") == \
        "/run/credentials/loki-engine@a.b.service"
    s = secrets.secret("HF_TOKEN", "/etc/t", None)
    assert s.path == "/etc/t" and s.is_env
    assert "read from /etc/t at start" in s.describe()
