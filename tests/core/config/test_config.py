"""lokid.core.config.files: typed values from valid files; for bad ones, where and what is wrong."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from lokid.core.config import files as cfg
from lokid.core.config import tomlread, tomlscan
from lokid.core.config.presetname import valid_preset_name
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


def test_gpus_auto_and_gpu_count_let_lokid_choose(tmp_path: Path) -> None:
    write(tmp_path, "presets/a.toml", 'model = "m"\ngpus = "auto"\n')
    a = cfg.load_preset(str(tmp_path), "a")
    assert (a.gpus, a.gpu_choice) == (None, 0)
    write(tmp_path, "presets/b.toml", 'model = "m"\ngpu_count = 2\n')
    assert cfg.load_preset(str(tmp_path), "b").gpu_choice == 2
    assert cfg.load_preset(str(tmp_path), "b").gpus is None
    write(tmp_path, "presets/c.toml", 'model = "m"\ngpus = [0]\n')
    assert cfg.load_preset(str(tmp_path), "c").gpu_choice is None


@pytest.mark.parametrize(("text", "says"), [
    ('gpus = [0, 1]\ngpu_count = 2\n', "gpu_count: gpus is set too"),
    ('gpus = "auto"\ngpu_count = 1\n', "gpu_count: gpus is set too"),
    ('gpu_count = 0\n', "gpu_count: 0 is out of range (GPUs, 1 to 64)"),
    ('gpu_count = "2"\n', "gpu_count: must be an integer"),
    ('gpus = "auto"\n[env]\nCUDA_VISIBLE_DEVICES = "0"\n',
     "gpus: env.CUDA_VISIBLE_DEVICES is set too: lokid sets it at start"),
    ('gpus = "Auto"\n', "'Auto' is neither a GPU index"),
])
def test_a_gpu_choice_that_contradicts_itself_is_an_error(tmp_path: Path, text: str,
                                                          says: str) -> None:
    write(tmp_path, "presets/a.toml", 'model = "m"\n' + text)
    with pytest.raises(ConfigError, match=re.escape(says)):
        cfg.load_preset(str(tmp_path), "a")


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


def test_the_metrics_textfile_is_node_exporters_by_default_or_off_or_moved(
        tmp_path: Path) -> None:
    assert cfg.load_global(str(tmp_path)).metrics_textfile == \
        "/var/lib/prometheus/node-exporter/lokid.prom"
    write(tmp_path, "lokid.toml", 'port = 9000\n')
    assert cfg.load_global(str(tmp_path)).metrics_textfile == cfg.DEFAULT_METRICS_TEXTFILE
    write(tmp_path, "lokid.toml", 'metrics_textfile = ""\n')
    assert cfg.load_global(str(tmp_path)).metrics_textfile == ""
    write(tmp_path, "lokid.toml", 'metrics_textfile = "/srv/textfiles/gpu-host.prom"\n')
    assert cfg.load_global(str(tmp_path)).metrics_textfile == "/srv/textfiles/gpu-host.prom"


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
    assert tomlread.key_line((tmp_path / "presets/d.toml").read_text(), "mode", "spec") == 3


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
    ('metrics_textfile = "lokid.prom"\n', "an absolute path ending in .prom"),
    ('metrics_textfile = "/var/lib/prometheus/node-exporter/lokid.txt"\n',
     "node_exporter reads only *.prom files"),
    ('metrics_textfile = "/var/lib/prometheus/node-exporter/.prom"\n', "ending in .prom"),
    ('metrics_textfile = "/var/lib/prometheus/node-exporter/"\n', "ending in .prom"),
    ('metrics_textfile = false\n', "metrics_textfile: must be a string, not a boolean"),
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
    assert valid_preset_name(name)


@pytest.mark.parametrize("name", ["", "-a", ".hidden", "_x", "a/b", "a b", "x" * 65, "é", "a\n",
                                  "../etc"])
def test_invalid_preset_names_are_refused(tmp_path: Path, name: str) -> None:
    assert not valid_preset_name(name)
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


# --- one bad file harms only itself ----------------------------------------------------
# Each of these once stopped the daemon or hung it: a traceback out of tomllib, a
# TypeError from a wrong type, a NUL that D-Bus refuses, a read that never ends.

# Loading in a child with 1 GiB of address space and a time limit: should a file make
# the read block (a FIFO) or never end (/dev/zero) again, the test fails instead of
# hanging the run or filling the machine's memory.
GUARDED_LOAD = """
import json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
from lokid.core.config import files as cfg
from lokid.core.errors import ConfigError
if sys.argv[2] == "presets":
    good, bad = cfg.load_presets(sys.argv[1])
    print(json.dumps({"good": sorted(good), "bad": {k: str(v) for k, v in bad.items()}}))
else:
    try:
        print(json.dumps({"global": repr(cfg.load_global(sys.argv[1]))}))
    except ConfigError as e:
        print(json.dumps({"error": str(e)}))
"""


def load_in_child(config_dir: Path, what: str) -> dict[str, Any]:
    r = subprocess.run([sys.executable, "-c", GUARDED_LOAD, str(config_dir), what],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-3000:]
    out: dict[str, Any] = json.loads(r.stdout)
    return out


def load_presets_in_child(config_dir: Path) -> tuple[list[str], dict[str, str]]:
    out = load_in_child(config_dir, "presets")
    return out["good"], out["bad"]


def raises_config_error(tmp_path: Path, name: str) -> ConfigError:
    with pytest.raises(ConfigError) as exc:
        cfg.load_preset(str(tmp_path), name)
    return exc.value


def assert_printable(message: str) -> None:
    assert not any(ord(ch) < 0x20 or 0x7F <= ord(ch) <= 0x9F for ch in message), repr(message)


def test_nesting_a_thousand_deep_is_an_error_of_the_file(tmp_path: Path) -> None:
    # tomllib recursed into RecursionError: a traceback, and no daemon
    deep = "[" * 1000 + "]" * 1000
    path = write(tmp_path, "presets/deep.toml", f'model = "m"\n\nextra_args = {deep}\n')
    e = raises_config_error(tmp_path, "deep")
    assert str(e).startswith(f"{path}:3: nested more than 16 levels deep")
    assert e.line == 3


def test_nesting_is_counted_outside_strings_and_comments_only(tmp_path: Path) -> None:
    write(tmp_path, "presets/ok.toml", 'model = "m"  # [[[[[[[[[[[[[[[[[[[[{{{{\n'
          'extra_args = ["[[[[[[[[[[[[[[[[[[[[", \'{{{{{{{{{{{{{{{{{{{{\', [ "x" ] ]\n'
          .replace('[ "x" ] ]', '"]]]]"]'))
    assert cfg.load_preset(str(tmp_path), "ok").extra_args == ("[" * 20, "{" * 20, "]]]]")
    # 16 levels parse; the 17th is refused
    assert tomlscan.check_text("a = " + "[" * 16 + "]" * 16, "p") == []
    with pytest.raises(ConfigError, match="more than 16 levels"):
        tomlscan.check_text("a = " + "[" * 17 + "]" * 17, "p")


@pytest.mark.parametrize("other", ["op_offload_min_batch = 1", "gpus = [0]"])
def test_env_is_checked_as_a_table_before_it_is_looked_into(tmp_path: Path, other: str) -> None:
    # "X" in 5 raised TypeError: argument of type 'int' is not iterable
    path = write(tmp_path, "presets/e.toml", f'model = "m"\nenv = 5\n{other}\n')
    e = raises_config_error(tmp_path, "e")
    assert str(e) == f'{path}:2: env: must be a table of NAME = "value", not an integer'


@pytest.mark.parametrize("body,line,where", [
    ('"\\u0000" = 1\n', 2, "key 2"),
    ('[spec]\nmode = "auto"\n"\\u0000" = 1\n', 4, "[spec]: key 2"),
    ('spec.mode = "auto"\nspec."x\\u0000" = 1\n', 3, "[spec]: key 2"),
    ('"a\\nlokid: forged error" = 1\n', 2, "key 2"),
    ('[env]\n"A\\u007f" = "1"\n', 3, "[env]: key 1"),
    ('[chat]\n"\\u0085" = 1\n', 3, "[chat]: key 1"),
])
def test_a_key_with_a_control_character_is_named_by_its_position(
        tmp_path: Path, body: str, line: int, where: str) -> None:
    # the raw key reached the error: D-Bus refuses a NUL (the daemon fell over) and a
    # newline forged a second line of the error
    path = write(tmp_path, "presets/k.toml", 'model = "m"\n' + body)
    e = raises_config_error(tmp_path, "k")
    message = str(e)
    assert message.startswith(f"{path}:{line}: {where} contains a control character (U+"), message
    assert "forged" not in message
    assert_printable(message)


@pytest.mark.parametrize("body,fragment", [
    ('extra_args = ["--jinja", "--x", "a\\nlokid: forged"]\n',
     "extra_args: item 2 contains a control character (U+000A)"),
    ('extra_args = ["--x", "\\u0085"]\n', "extra_args: item 1 contains a control character "
     "(U+0085)"),
    ('env = { A = "1\\r2" }\n', "env.A: contains a control character (U+000D)"),
    ('[chat]\nreasoning_effort = "hi\\u001b[2J"\n',
     "chat.reasoning_effort: contains a control character (U+001B)"),
])
def test_a_string_value_with_a_control_character_is_refused(
        tmp_path: Path, body: str, fragment: str) -> None:
    path = write(tmp_path, "presets/v.toml", 'model = "m"\n' + body)
    message = str(raises_config_error(tmp_path, "v"))
    assert message.startswith(f"{path}:"), message
    assert fragment in message
    assert "forged" not in message
    assert_printable(message)


def test_an_unknown_key_is_shown_escaped(tmp_path: Path) -> None:
    # U+202E (right-to-left override) is printable to a terminal's eye, and not a
    # control character: shown as an escape, it cannot reorder the error's text
    write(tmp_path, "presets/u.toml", 'model = "m"\n"ctx\u202e" = 1\n')
    message = str(raises_config_error(tmp_path, "u"))
    assert '"ctx\\u202e": unknown key' in message
    assert "\u202e" not in message


def test_keys_are_bounded_in_number_and_length(tmp_path: Path) -> None:
    write(tmp_path, "presets/n.toml", 'model = "m"\n[env]\n' +
          "".join(f"V{i} = 1\n" for i in range(300)))
    assert "more than 256 keys" in str(raises_config_error(tmp_path, "n"))
    write(tmp_path, "presets/l.toml", f'model = "m"\n[spec]\n{"k" * 129} = 1\n')
    assert str(raises_config_error(tmp_path, "l")).endswith(
        "[spec]: key 1 is 129 characters long, more than 128")


def test_a_long_dotted_key_is_refused_before_tomllib_reads_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # tomllib checks every prefix of a dotted key: 32 KB of a.a.a… took 11 s
    path = write(tmp_path, "presets/d.toml", 'model = "m"\n' + "a." * 16000 + "a = 1\n")
    header = write(tmp_path, "presets/h.toml", 'model = "m"\n[' + ".".join("t" * 9) + "]\n")

    def not_reached(text: str) -> object:
        raise AssertionError("tomllib read a file the lexer should have refused")

    monkeypatch.setattr(tomlread.tomllib, "loads", not_reached)
    e = raises_config_error(tmp_path, "d")
    assert str(e) == f"{path}:2: a dotted key of more than 8 parts (such as spec.mode, which has 2)"
    assert str(raises_config_error(tmp_path, "h")).startswith(f"{header}:2: a dotted key")


def test_eight_parts_and_dots_in_strings_and_values_are_fine(tmp_path: Path) -> None:
    write(tmp_path, "presets/k.toml", 'model = "m"\na.b.c.d.e.f.g.h = 1\n')
    assert "a: unknown key" in str(raises_config_error(tmp_path, "k"))
    write(tmp_path, "presets/s.toml", 'model = "a.b.c.d.e.f.g.h.i.j.gguf"  # x.x.x.x.x.x.x.x.x\n'
          'env."A" = "1.2.3.4.5.6.7.8.9.10"\n[chat]\ntemperature = 1.5e-1\n'
          'top_p = 0.95\nmin_p = 5e-2\n')
    p = cfg.load_preset(str(tmp_path), "s")
    assert p.model == "a.b.c.d.e.f.g.h.i.j.gguf" and p.env == {"A": "1.2.3.4.5.6.7.8.9.10"}
    assert (p.chat.temperature, p.chat.top_p, p.chat.min_p) == (0.15, 0.95, 0.05)


def test_a_fifo_or_a_device_is_refused_without_reading_it(tmp_path: Path) -> None:
    presets = tmp_path / "presets"
    presets.mkdir()
    os.mkfifo(presets / "fifo.toml")   # open() blocked forever
    os.symlink("/dev/zero", presets / "zero.toml")   # read() grew to GiBs, then MemoryError
    (presets / "dir.toml").mkdir()
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(presets / "sock.toml"))
        good, bad = load_presets_in_child(tmp_path)
    assert good == []
    assert bad == {
        "fifo": f"{presets}/fifo.toml: cannot read: is a FIFO, not a regular file",
        "zero": f"{presets}/zero.toml: cannot read: is a character device, not a regular file",
        "dir": f"{presets}/dir.toml: cannot read: is a directory, not a regular file",
        "sock": f"{presets}/sock.toml: cannot read: is a socket, not a regular file",
    }


def test_a_file_over_64_kib_is_refused(tmp_path: Path) -> None:
    head = 'model = "m"\n'
    write(tmp_path, "presets/full.toml", head + "#" * (65536 - len(head) - 1) + "\n")
    assert cfg.load_preset(str(tmp_path), "full").model == "m"
    path = write(tmp_path, "presets/over.toml", head + "#" * (65536 - len(head)) + "\n")
    assert str(raises_config_error(tmp_path, "over")) == (
        f"{path}: too large: 65537 bytes, the limit is 65536 bytes (a preset is a few KB)")


def test_every_bad_file_beside_a_good_one_is_reported_alone(tmp_path: Path) -> None:
    presets = tmp_path / "presets"
    write(tmp_path, "presets/good.toml", 'model = "m"\nenv = { A = "1" }\ngpus = [0]\n')
    write(tmp_path, "presets/deep.toml", 'model = "m"\nextra_args = ' + "[" * 1000 + "]" * 1000)
    write(tmp_path, "presets/env.toml", 'model = "m"\nenv = 5\nop_offload_min_batch = 1\n')
    write(tmp_path, "presets/nul.toml", 'model = "m"\n[spec]\n"\\u0000" = 1\n')
    write(tmp_path, "presets/forge.toml", 'model = "m"\n"a\\nlokid: forged error" = 1\n')
    write(tmp_path, "presets/dotted.toml", 'model = "m"\n' + "a." * 16000 + "a = 1\n")
    os.mkfifo(presets / "fifo.toml")
    os.symlink("/dev/zero", presets / "zero.toml")
    good, bad = load_presets_in_child(tmp_path)
    assert good == ["good"]
    expected = {
        "deep": ":2: nested more than 16 levels deep",
        "env": ":2: env: must be a table",
        "nul": ":3: [spec]: key 1 contains a control character (U+0000)",
        "forge": ":2: key 2 contains a control character (U+000A)",
        "dotted": ":2: a dotted key of more than 8 parts",
        "fifo": ": cannot read: is a FIFO, not a regular file",
        "zero": ": cannot read: is a character device, not a regular file",
    }
    assert sorted(bad) == sorted(expected)
    for name, fragment in expected.items():
        assert bad[name].startswith(f"{presets}/{name}.toml{fragment}"), bad[name]
        assert_printable(bad[name])


def test_any_exception_in_one_preset_is_that_presets_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # only ConfigError was caught: anything else stopped the daemon's start
    write(tmp_path, "presets/a.toml", 'model = "m"\n')
    write(tmp_path, "presets/buggy.toml", 'model = "m"\n')
    write(tmp_path, "presets/z.toml", 'model = "m"\n')
    parse = cfg.parse_preset

    def bug_in_one(name: str, path: str) -> cfg.Preset:
        if name == "buggy":
            raise TypeError("argument of type 'int' is not iterable\nsecond line")
        return parse(name, path)

    monkeypatch.setattr(cfg, "parse_preset", bug_in_one)
    good, bad = cfg.load_presets(str(tmp_path))
    assert sorted(good) == ["a", "z"]
    assert str(bad["buggy"]) == (f"{tmp_path}/presets/buggy.toml: cannot be read: internal error "
                                 "(TypeError: argument of type 'int' is not iterable)")


def test_a_file_name_with_a_newline_cannot_forge_an_error_line(tmp_path: Path) -> None:
    write(tmp_path, "presets/a\nlokid: forged.toml", 'model = "m"\n')
    _, bad = cfg.load_presets(str(tmp_path))
    message = str(bad["a\nlokid: forged"])
    assert "invalid preset name" in message
    assert_printable(message)
    assert "presets/a\\u000alokid: forged.toml" in message


def test_lokid_toml_is_read_within_the_same_bounds(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "lokid.toml")
    assert load_in_child(tmp_path, "global") == {
        "error": f"{tmp_path}/lokid.toml: cannot read: is a FIFO, not a regular file"}
    os.unlink(tmp_path / "lokid.toml")
    write(tmp_path, "lokid.toml", 'model_dirs = ["/m", "/n\\u0000"]\n')
    with pytest.raises(ConfigError, match=r"model_dirs: item 1 contains a control character "
                       r"\(U\+0000\)"):
        cfg.load_global(str(tmp_path))


# LIT3 stands for three single quotes, which cannot sit in this literal
VALID_TOML = r'''# a comment with [[brackets]] and {braces} and a.b.c.d.e.f.g.h.i.j
title = "TOML [[not a table]] {not} a.b.c.d.e.f.g.h.i.j" # trailing [comment
pi = 3.14159
neg = -1.5e-3
big = 1_000.000_1
inf_ = inf
when = 1979-05-27T07:32:00.999999-07:00
local = 1979-05-27T07:32:00.5
day = 1979-05-27
at = 07:32:00.25
lit = 'C:\path\[x].{y}.z.z.z.z.z.z.z.z.z'
quoted = "say \"[[[[\" \\ and \u00e9 ]]]] a.b.c.d.e.f.g.h.i.j"
ml = """
[[[[[[[[[[[[[[[[[[[[ a.b.c.d.e.f.g.h.i.j.k
  \"""still inside\""" {{{{{{{{{{{{{{{{{{
"""
ml_end = """ends with quotes"""""
ml_lit = LIT3
{{{{{{{{{{{{{{{{{{{{ '' x.x.x.x.x.x.x.x.x.x
LIT3
ml_lit_end = LIT3two moreLIT3''
"quoted.key.with.many.dots.in.it.a.b.c" = 1
a."b.c.d.e.f.g.h.i.j.k".c = 2
inline = { x = 1.5, y = [1.0, 2.5, [3.5, { z = "]]]]" }]], "k.k" = { w = 1979-05-27 } }
arr = [
  1.5, # [[[[[[[[[[[[[[[[[[[[[[
  2.5,
]

[table."with.dots"]
v = [ [ [ 1 ] ] ]

[[fruits.list]]
name = "apple"

[[fruits.list]]
name = "banana [ripe]"
'''.replace("LIT3", "'" * 3)


def test_the_lexer_passes_valid_toml_and_finds_its_string_tokens() -> None:
    # it must not count what sits in strings and comments, nor refuse floats, dates,
    # inline tables or arrays of tables. (The walk after tomllib then refuses the
    # newlines inside the multi-line strings: no preset value holds one.)
    data = tomllib.loads(VALID_TOML)
    assert data["ml"].count("[") == 20 and data["ml_end"] == 'ends with quotes""'
    assert data["ml_lit_end"] == "two more''"
    suspects = tomlscan.check_text(VALID_TOML, "p")
    # the string tokens holding a backslash or a newline, each read whole
    tokens = [tomllib.loads("x = " + VALID_TOML[a:b])["x"] for a, b in suspects]
    assert tokens == [data["lit"], data["quoted"], data["ml"], data["ml_lit"]]


def test_a_valid_preset_with_multi_line_strings_and_comments_loads(tmp_path: Path) -> None:
    write(tmp_path, "presets/ml.toml", '''# [[[[[[[[[[[[[[[[[[[[ model.x.y.z.a.b.c.d.e
model = """\\
    m[1].{2}.a.b.c.d.e.f.g.h.gguf"""
extra_args = [
  \'\'\'--chat-template-kwargs\'\'\',  # {{{{{{{{{{{{{{{{{{{{{{{{
  \'{"enable_thinking": [false, [[[[[[[[[[[[[[[[[[[[ ]}\',
]
[spec] # [[[[[[[[[[[[[[[[[[[[
mode = "auto"
''')
    p = cfg.load_preset(str(tmp_path), "ml")
    assert p.model == "m[1].{2}.a.b.c.d.e.f.g.h.gguf"
    assert p.extra_args == ("--chat-template-kwargs",
                            '{"enable_thinking": [false, [[[[[[[[[[[[[[[[[[[[ ]}')
    assert p.spec.mode == "auto"



def test_cpu_fallback_is_run_or_fail(tmp_path: Path) -> None:
    """Issue 44, item 3: what a start whose GPU engine runs on the CPU does."""
    from lokid.core.config.files import parse_preset_text

    assert parse_preset_text("p", "p.toml", 'model = "/m.gguf"\n').cpu_fallback == "run"
    text = 'model = "/m.gguf"\ncpu_fallback = "fail"\n'
    assert parse_preset_text("p", "p.toml", text).cpu_fallback == "fail"
    with pytest.raises(ConfigError) as e:
        parse_preset_text("p", "p.toml", 'model = "/m.gguf"\ncpu_fallback = "stop"\n')
    assert "cpu_fallback" in str(e.value) and "valid values: run, fail" in str(e.value)
