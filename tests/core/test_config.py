"""lokid.core.config: typed values from valid files; for bad ones, where and what is wrong."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from lokid.core import config as cfg
from lokid.core.errors import ConfigError, NotFoundError


def write(root: Path, rel: str, text: str) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_full_preset_parses_to_typed_values(tmp_path: Path) -> None:
    write(tmp_path, "presets/big.toml", """
model = "/models/m.gguf"
mmproj = "proj.gguf"
ctx = 0
gpus = [0, 2]
gpu_layers = 40
ubatch = 1024
port = 8090
extra_args = ["--jinja", "-fa", "on"]
env = { LLAMA_ARG_THREADS = 16, FOO = "bar" }
op_offload_min_batch = 128

[spec]
mode = "mtp+ngram"
draft = "mtp-m.gguf"
n_max = 4
sampling = "probabilistic"
""")
    p = cfg.load_preset(str(tmp_path), "big")
    assert p.model == "/models/m.gguf"
    assert p.mmproj == "proj.gguf"
    assert p.ctx == 0
    assert p.gpus == "0,2"
    assert p.gpu_layers == "40"
    assert p.ubatch == 1024
    assert p.port == 8090
    assert p.extra_args == ("--jinja", "-fa", "on")
    assert p.env == {"LLAMA_ARG_THREADS": "16", "FOO": "bar"}
    assert p.op_offload_min_batch == 128
    assert p.spec.mode == "mtp+ngram" and p.spec.draft == "mtp-m.gguf"
    assert p.spec.n_max == 4 and p.spec.sampling == "probabilistic"


def test_minimal_preset_gets_defaults(tmp_path: Path) -> None:
    write(tmp_path, "presets/small.toml", 'model = "m.gguf"\n')
    p = cfg.load_preset(str(tmp_path), "small")
    assert p.ctx == 32768
    assert p.gpus is None and p.gpu_layers is None and p.port is None
    assert p.extra_args == () and dict(p.env) == {}
    assert p.spec == cfg.SpecConfig()


def test_gpus_accepts_a_string_and_uuids(tmp_path: Path) -> None:
    write(tmp_path, "presets/a.toml", 'model = "m"\ngpus = "1, GPU-8f6a2c1e-aaaa"\n')
    assert cfg.load_preset(str(tmp_path), "a").gpus == "1,GPU-8f6a2c1e-aaaa"


def test_global_defaults_when_lokid_toml_is_absent(tmp_path: Path) -> None:
    g = cfg.load_global(str(tmp_path))
    assert (g.engine, g.model_dirs, g.host, g.port) == ("llama-server", (), "127.0.0.1", 8080)


def test_global_file_parses(tmp_path: Path) -> None:
    write(tmp_path, "lokid.toml", 'engine = "/opt/llama/llama-server"\n'
          'model_dirs = ["/a", "/b"]\nhost = "0.0.0.0"\nport = 9000\n')
    g = cfg.load_global(str(tmp_path))
    assert g.engine == "/opt/llama/llama-server"
    assert g.model_dirs == ("/a", "/b")
    assert (g.host, g.port) == ("0.0.0.0", 9000)


BAD_PRESETS = [
    ("missing_model", 'ctx = 4096\n', "missing required key 'model'", None),
    ("syntax", 'model = "m"\nctx = = 3\n', "TOML syntax error", 2),
    ("unknown_key", 'model = "m"\n\nctxx = 4096\n', "did you mean 'ctx'", 3),
    ("model_type", "model = 3\n", "model: must be a string, not an integer", 1),
    ("model_relative", 'model = "sub/m.gguf"\n', "relative path", 1),
    ("model_empty", 'model = ""\n', "must not be empty", 1),
    ("ctx_negative", 'model = "m"\nctx = -1\n', "ctx: -1 is out of range", 2),
    ("ctx_string", 'model = "m"\nctx = "4k"\n', "ctx: must be an integer", 2),
    ("ctx_bool", 'model = "m"\nctx = true\n', "not a boolean", 2),
    ("port_range", 'model = "m"\nport = 70000\n', "1 to 65535", 2),
    ("ubatch_zero", 'model = "m"\nubatch = 0\n', "ubatch: 0 is out of range", 2),
    ("gpu_layers_bad", 'model = "m"\ngpu_layers = "most"\n', "\"auto\" or \"all\"", 2),
    ("gpus_bad", 'model = "m"\ngpus = ["zero"]\n', "neither a GPU index nor", 2),
    ("gpus_empty", 'model = "m"\ngpus = []\n', "is empty", 2),
    ("gpus_and_env", 'model = "m"\ngpus = [0]\nenv = { CUDA_VISIBLE_DEVICES = "1" }\n',
     "keep only one", 2),
    ("extra_not_list", 'model = "m"\nextra_args = "--jinja"\n', "must be a list of strings", 2),
    ("extra_item_type", 'model = "m"\nextra_args = ["-c", 4096]\n', "item 1 must be a string", 2),
    ("extra_joined", 'model = "m"\nextra_args = ["-c 4096"]\n', "[\'-c\', \'4096\']", 2),
    ("env_not_table", 'model = "m"\nenv = ["A=1"]\n', "must be a table", 2),
    ("env_bad_name", 'model = "m"\nenv = { "1A" = "x" }\n', "not a valid environment variable", 2),
    ("env_bad_value", 'model = "m"\nenv = { A = [1] }\n', "A: must be a string or an integer", 2),
    ("offload_twice",
     'model = "m"\nop_offload_min_batch = 128\nenv = { GGML_OP_OFFLOAD_MIN_BATCH = "9" }\n',
     "keep only one", 2),
    ("offload_negative", 'model = "m"\nop_offload_min_batch = -5\n', "out of range", 2),
    ("spec_not_table", 'model = "m"\nspec = "auto"\n', "must be a table", 2),
    ("not_utf8", None, "not UTF-8", None),
]


@pytest.mark.parametrize("name,text,fragment,line", BAD_PRESETS, ids=[b[0] for b in BAD_PRESETS])
def test_bad_preset_reports_file_line_key_and_what_is_valid(
    tmp_path: Path, name: str, text: str | None, fragment: str, line: int | None
) -> None:
    path = tmp_path / "presets" / f"{name}.toml"
    path.parent.mkdir(parents=True)
    if text is None:
        path.write_bytes(b'model = "\xff\xfe"\n')
    else:
        path.write_text(text)
    with pytest.raises(ConfigError) as exc:
        cfg.load_preset(str(tmp_path), name)
    message = str(exc.value)
    assert fragment in message
    assert str(path) in message
    if line is not None:
        assert f"{path}:{line}:" in message
        assert exc.value.line == line


def test_spec_key_in_dotted_form_gets_its_line(tmp_path: Path) -> None:
    write(tmp_path, "presets/d.toml", 'model = "m"\n[spec]\nmode = "auto"\n')
    assert cfg._key_line((tmp_path / "presets/d.toml").read_text(), "mode", "spec") == 3


MODES = "valid values: off, auto, mtp, ngram, mtp+ngram"


@pytest.mark.parametrize("body,line,fragment", [
    # A typo used to start the engine without speculation, and exit 0.
    ('[spec]\nmode = "eagle"\n', 3, f"spec.mode: 'eagle' is not valid; {MODES}"),
    ('[spec]\nmode = "atuo"\n', 3, f"spec.mode: 'atuo' is not valid (did you mean 'auto'?); "
     f"{MODES}"),
    ('spec.mode = "turbo"\n', 2, f"spec.mode: 'turbo' is not valid; {MODES}"),
    ('[spec]\nmode = true\n', 3, "spec.mode: must be a string, one of: off, auto, mtp, ngram, "
     "mtp+ngram (not a boolean)"),
    ('[spec]\nmode = ""\n', 3, f"spec.mode: '' is not valid; {MODES}"),
    ('[spec]\nmode = "mtp"\nsampling = "random"\n', 4,
     "spec.sampling: 'random' is not valid; valid values: greedy, probabilistic"),
    ('[spec]\nsampling = 3\n', 3, "spec.sampling: must be a string, one of: greedy, "
     "probabilistic (not an integer)"),
    ('[spec]\nn_max = 900\n', 3, "spec.n_max: 900 is out of range (tokens drafted per step, "
     "1 to 64)"),
    ('[spec]\nn_max = "8"\n', 3, "spec.n_max: must be an integer"),
    ('[spec]\nnmax = 4\n', 3, "spec.nmax: unknown key (did you mean 'n_max'?); valid keys: "
     "mode, draft, n_max, sampling"),
    ('[spec]\ndraft = 3\n', 3, "spec.draft: must be a string, not an integer"),
    ('[spec]\ndraft = "heads/mtp.gguf"\n', 3, "spec.draft: 'heads/mtp.gguf' is a relative "
     "path"),
    ('[spec]\ndraft = " "\n', 3, "spec.draft: must not be empty"),
])
def test_bad_spec_values_name_file_line_key_and_the_valid_ones(
        tmp_path: Path, body: str, line: int, fragment: str) -> None:
    path = write(tmp_path, "presets/s.toml", 'model = "m"\n' + body)
    with pytest.raises(ConfigError) as exc:
        cfg.load_preset(str(tmp_path), "s")
    assert f"{path}:{line}: {fragment}" in str(exc.value), str(exc.value)


@pytest.mark.parametrize("raw,mode", [("AUTO", "auto"), (" auto ", "auto"),
                                      ("MTP + ngram", "mtp+ngram"), ("off", "off")])
def test_spec_mode_is_read_case_and_space_insensitively(tmp_path: Path, raw: str,
                                                        mode: str) -> None:
    write(tmp_path, "presets/s.toml", f'model = "m"\n[spec]\nmode = "{raw}"\n'
          'sampling = "Greedy"\n')
    spec = cfg.load_preset(str(tmp_path), "s").spec
    assert (spec.mode, spec.sampling) == (mode, "greedy")


def test_an_absent_spec_table_or_mode_means_off(tmp_path: Path) -> None:
    write(tmp_path, "presets/a.toml", 'model = "m"\n')
    write(tmp_path, "presets/b.toml", 'model = "m"\n[spec]\ndraft = "d.gguf"\n')
    assert cfg.load_preset(str(tmp_path), "a").spec == cfg.SpecConfig()
    b = cfg.load_preset(str(tmp_path), "b").spec
    assert (b.mode, b.draft, b.n_max, b.sampling) == ("off", "d.gguf", None, None)


BAD_GLOBALS = [
    ('engine = "bin/llama-server"\n', "use an absolute path"),
    ('engine = ""\n', "must not be empty"),
    ('model_dirs = ["models"]\n', "'models' is not an absolute path"),
    ('model_dirs = "/models"\n', "must be a list of strings"),
    ('port = 0\n', "1 to 65535"),
    ('engnie = "/x"\n', "did you mean 'engine'"),
]


@pytest.mark.parametrize("text,fragment", BAD_GLOBALS)
def test_bad_global_file(tmp_path: Path, text: str, fragment: str) -> None:
    path = write(tmp_path, "lokid.toml", text)
    with pytest.raises(ConfigError) as exc:
        cfg.load_global(str(tmp_path))
    assert fragment in str(exc.value)
    assert f"{path}:1:" in str(exc.value)


@pytest.mark.parametrize("name", ["a", "Qwen3-8B", "q.v_2-x", "9", "x" * 64])
def test_valid_preset_names(name: str) -> None:
    assert cfg.valid_preset_name(name)


@pytest.mark.parametrize("name", ["", "-a", ".hidden", "_x", "a/b", "a b", "x" * 65, "é", "a\n",
                                  "../etc"])
def test_invalid_preset_names_are_refused(tmp_path: Path, name: str) -> None:
    assert not cfg.valid_preset_name(name)
    with pytest.raises(ConfigError, match="invalid preset name"):
        cfg.load_preset(str(tmp_path), name)


def test_missing_preset_is_not_found(tmp_path: Path) -> None:
    with pytest.raises(NotFoundError, match="no preset 'nope'"):
        cfg.load_preset(str(tmp_path), "nope")


def test_a_broken_preset_never_hides_the_others(tmp_path: Path) -> None:
    write(tmp_path, "presets/good.toml", 'model = "m"\n')
    write(tmp_path, "presets/broken.toml", 'model = \n')
    write(tmp_path, "presets/also-good.toml", 'model = "n"\nctx = 4096\n')
    write(tmp_path, "presets/bad name.toml", 'model = "m"\n')
    write(tmp_path, "presets/README.md", "not a preset")
    good, bad = cfg.load_presets(str(tmp_path))
    assert sorted(good) == ["also-good", "good"]
    assert sorted(bad) == ["bad name", "broken"]
    assert "TOML syntax error" in str(bad["broken"])
    assert "invalid preset name" in str(bad["bad name"])
    assert str(tmp_path / "presets" / "bad name.toml") in str(bad["bad name"])


def test_resolve_file_looks_in_model_dirs_in_order(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    (b / "m.gguf").write_bytes(b"x")
    (a / "n.gguf").write_bytes(b"x")
    (b / "n.gguf").write_bytes(b"x")
    dirs = (str(a), str(b))
    assert cfg.resolve_file("m.gguf", dirs) == str(b / "m.gguf")
    assert cfg.resolve_file("m", dirs) == str(b / "m.gguf")
    assert cfg.resolve_file("n.gguf", dirs) == str(a / "n.gguf")
    assert cfg.resolve_file("missing", dirs) is None
    assert cfg.resolve_file(str(b / "m.gguf"), ()) == str(b / "m.gguf")
    assert cfg.resolve_file(str(b / "zz.gguf"), dirs) is None


def test_unreadable_file_is_a_config_error(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        # root reads anything; a directory in the file's place fails for everyone
        (tmp_path / "presets" / "x.toml").mkdir(parents=True)
    else:
        path = write(tmp_path, "presets/x.toml", 'model = "m"\n')
        path.chmod(0)
    with pytest.raises(ConfigError, match="cannot read"):
        cfg.load_preset(str(tmp_path), "x")


def test_the_chat_table_says_how_clients_use_the_preset(tmp_path: Path) -> None:
    write(tmp_path, "presets/c.toml", 'model = "m"\n[chat]\nreasoning_effort = "high"\n'
          'temperature = 0.6\ntop_p = 0.95\ntop_k = 20\n')
    p = cfg.load_preset(str(tmp_path), "c")
    assert p.chat.reasoning_effort == "high"
    assert p.chat.sampling() == {"temperature": 0.6, "top_p": 0.95, "top_k": 20}
    write(tmp_path, "presets/d.toml", 'model = "m"\n')
    assert cfg.load_preset(str(tmp_path), "d").chat.sampling() == {}


@pytest.mark.parametrize("body,line,fragment", [
    ('[chat]\nreasoning_effort = "max"\n', 3, "chat.reasoning_effort: 'max' is not a level: "
     "none, minimal, low, medium, high, xhigh"),
    ('[chat]\nreasoning_effort = "mediun"\n', 3, "chat.reasoning_effort: 'mediun' is not a "
     "level (did you mean 'medium'?): none, minimal, low, medium, high, xhigh"),
    ('[chat]\ntemperature = 9\n', 3, "chat.temperature: 9 is out of range (0 to 5)"),
    ('[chat]\ntop_p = "most"\n', 3, "chat.top_p: must be a number, not a string"),
    ('[chat]\ntop_kk = 3\n', 3, "chat.top_kk: unknown key (did you mean 'top_k'?)"),
    ('chat = 1\n', 2, "chat: must be a table ([chat]), not an integer"),
])
def test_bad_chat_settings_name_the_key_and_line(tmp_path: Path, body: str, line: int,
                                                  fragment: str) -> None:
    path = write(tmp_path, "presets/c.toml", 'model = "m"\n' + body)
    with pytest.raises(ConfigError) as exc:
        cfg.load_preset(str(tmp_path), "c")
    assert fragment in str(exc.value) and f"{path}:{line}:" in str(exc.value), str(exc.value)
