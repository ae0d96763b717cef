"""lokid.core.config.presetedit: an edit changes the lines it is about and nothing else, and
what it writes is what lokid.core.config.files reads back (editing is syntax; validation is
parse_preset_text's)."""

from __future__ import annotations

import difflib
import tomllib
from pathlib import Path

import pytest

from lokid.core.config import presetedit as pe
from lokid.core.config.files import MAX_FILE_BYTES, Preset, parse_preset_text
from lokid.core.errors import ConfigError

EXAMPLE = Path(__file__).parents[3] / "etc" / "presets" / "example.toml"
PATH = "/etc/loki/presets/p.toml"
SMALL = 'model = "m.gguf"  # the model\nctx = 4096\n\n[spec]\nmode = "off"\n'


def example() -> str:
    return EXAMPLE.read_text()


def changed(old: str, new: str) -> tuple[list[str], list[str]]:
    """The lines removed and the lines added from ``old`` to ``new``."""
    diff = list(difflib.unified_diff(old.splitlines(), new.splitlines(), lineterm="", n=0))
    body = [line for line in diff if not line.startswith(("---", "+++", "@@"))]
    return ([line[1:] for line in body if line.startswith("-")],
            [line[1:] for line in body if line.startswith("+")])


def parsed(text: str) -> Preset:
    return parse_preset_text("p", PATH, text)


# --- set_keys on the shipped, annotated preset -----------------------------------


def test_setting_ctx_changes_only_its_line() -> None:
    old = example()
    new = pe.set_keys(old, {"ctx": 8192})
    assert changed(old, new) == (["ctx = 32768"], ["ctx = 8192"])
    assert parsed(new).ctx == 8192


def test_setting_a_key_of_a_table_changes_only_its_line() -> None:
    old = example()
    new = pe.set_keys(old, {"spec.mode": "mtp"})
    assert changed(old, new) == (['mode = "off"'], ['mode = "mtp"'])
    assert parsed(new).spec.mode == "mtp"


def test_a_commented_out_key_gets_its_line_below_the_example() -> None:
    old = example()
    new = pe.set_keys(old, {"port": 8090})
    assert changed(old, new) == ([], ["port = 8090"])
    assert "#port = 8081\nport = 8090\n" in new
    assert parsed(new).port == 8090


def test_a_commented_out_key_of_a_table_goes_below_its_example_too() -> None:
    old = example()
    new = pe.set_keys(old, {"chat.temperature": 0.7})
    assert changed(old, new) == ([], ["temperature = 0.7"])
    assert "#temperature = 0.7\ntemperature = 0.7\n#top_p" in new
    assert parsed(new).chat.temperature == 0.7


def test_several_keys_at_once_and_a_list() -> None:
    old = example()
    new = pe.set_keys(old, {"ctx": 0, "extra_args": ["--jinja"], "gpus": [0, 1],
                            "spec.n_max": 4})
    removed, added = changed(old, new)
    assert removed == ["ctx = 32768", 'extra_args = ["--jinja", "-fa", "on"]']
    assert sorted(added) == sorted(["ctx = 0", 'extra_args = ["--jinja"]', "gpus = [0, 1]",
                                    "n_max = 4"])
    p = parsed(new)
    assert (p.ctx, p.extra_args, p.gpus, p.spec.n_max) == (0, ("--jinja",), "0,1", 4)


# --- set_keys: placement, kinds, tables ------------------------------------------


def test_a_key_keeps_its_place_and_its_trailing_comment() -> None:
    new = pe.set_keys(SMALL, {"model": "other.gguf"})
    assert new == SMALL.replace('"m.gguf"', '"other.gguf"')


def test_a_new_top_level_key_goes_before_the_tables() -> None:
    new = pe.set_keys(SMALL, {"ubatch": 512})
    assert changed(SMALL, new)[0] == []
    assert new.index("ubatch = 512") < new.index("[spec]")
    assert parsed(new).ubatch == 512


def test_a_missing_table_is_appended_as_a_section() -> None:
    new = pe.set_keys(SMALL, {"chat.temperature": 0.6})
    assert new.startswith(SMALL)
    assert new[len(SMALL):].strip() == "[chat]\ntemperature = 0.6"
    assert parsed(new).chat.temperature == 0.6


def test_an_env_key_creates_the_env_table() -> None:
    new = pe.set_keys(SMALL, {"env.LLAMA_ARG_THREADS": "16"})
    assert new.startswith(SMALL) and "[env]\nLLAMA_ARG_THREADS = \"16\"\n" in new
    assert parsed(new).env == {"LLAMA_ARG_THREADS": "16"}
    again = pe.set_keys(new, {"env.GGML_X": "1"})
    assert changed(new, again) == ([], ['GGML_X = "1"'])


def test_dotted_and_inline_tables_are_edited_where_they_are() -> None:
    dotted = 'model = "m"\nspec.mode = "off"\n'
    assert pe.set_keys(dotted, {"spec.mode": "mtp"}) == 'model = "m"\nspec.mode = "mtp"\n'
    inline = 'model = "m"\nenv = { A = "1" }\n'
    assert tomllib.loads(pe.set_keys(inline, {"env.B": "2"}))["env"] == {"A": "1", "B": "2"}


def test_value_kinds_are_kept() -> None:
    new = pe.set_keys('model = "m"\n', {"b": True, "i": 1, "f": 0.5, "s": "1", "t": ("x",)})
    assert tomllib.loads(new) == {"model": "m", "b": True, "i": 1, "f": 0.5, "s": "1",
                                  "t": ["x"]}
    assert "b = true\n" in new


def test_a_string_with_quotes_and_control_characters_is_escaped() -> None:
    value = 'a "b" \\ c\nd'
    new = pe.set_keys('model = "m"\n', {"model": value})
    assert tomllib.loads(new)["model"] == value
    assert len(new.splitlines()) == 1


@pytest.mark.parametrize("key", ["spec.mode.x", "a b", "spec.", "", ".ctx", "spéc",
                                 "env.\"A\"", "ctx\n"])
def test_a_bad_key_name_is_refused(key: str) -> None:
    with pytest.raises(ConfigError, match="is not a preset key") as e:
        pe.set_keys(SMALL, {key: 1})
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="is not a preset key"):
        pe.unset_keys(SMALL, [key])


def test_a_table_cannot_be_set_as_a_whole() -> None:
    with pytest.raises(ConfigError, match=r"^spec: is a table: set its keys one by one"):
        pe.set_keys(SMALL, {"spec": "x"})
    with pytest.raises(ConfigError, match=r"^env: cannot set a table as a whole"):
        pe.set_keys(SMALL, {"env": {"A": "1"}})


def test_a_key_inside_a_non_table_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"^ctx\.x: ctx holds an integer, not a table"):
        pe.set_keys(SMALL, {"ctx.x": 1})
    with pytest.raises(ConfigError, match=r"^a\.b: a holds a list, not a table"):
        pe.set_keys('model = "m"\n[[a]]\nx = 1\n', {"a.b": 1})


@pytest.mark.parametrize("value", [None, {1, 2}, [1.5], [True], [["x"]], 2**63, b"x"])
def test_a_value_a_preset_cannot_hold_is_refused(value: object) -> None:
    with pytest.raises(ConfigError, match=r"^ctx: cannot be set to"):
        pe.set_keys(SMALL, {"ctx": value})


def test_a_long_refused_value_is_shown_short() -> None:
    with pytest.raises(ConfigError) as e:
        pe.set_keys(SMALL, {"extra_args": [0.5] * 10_000})
    assert len(str(e.value)) < 250


def test_a_text_that_is_not_toml_is_refused() -> None:
    with pytest.raises(ConfigError, match="TOML syntax error"):
        pe.set_keys('model = "m"\nctx = 1\nctx = 2\n', {"port": 1})
    with pytest.raises(ConfigError, match="nested more than 16 levels deep"):
        pe.set_keys("a = " + "[" * 100 + "]" * 100 + "\n", {"port": 1})
    with pytest.raises(ConfigError, match="too large"):
        pe.set_keys("#" * (MAX_FILE_BYTES + 1), {"port": 1})


def test_editing_is_syntax_validation_is_the_parser() -> None:
    new = pe.set_keys(example(), {"spec.mode": "eagle"})
    assert changed(example(), new) == (['mode = "off"'], ['mode = "eagle"'])
    with pytest.raises(ConfigError, match=r"spec\.mode: 'eagle' is not valid.*valid values: "
                                          r"off, auto, mtp, ngram, mtp\+ngram"):
        parsed(new)
    with pytest.raises(ConfigError, match=r"ctx: must be an integer"):
        parsed(pe.set_keys(SMALL, {"ctx": "big"}))
    with pytest.raises(ConfigError, match="unknown key"):
        parsed(pe.set_keys(SMALL, {"chat.temprature": 0.5}))


# --- unset_keys -------------------------------------------------------------------


def test_unsetting_a_key_removes_only_its_line() -> None:
    old = example()
    new = pe.unset_keys(old, ["ctx", "extra_args"])
    assert changed(old, new) == (["ctx = 32768", 'extra_args = ["--jinja", "-fa", "on"]'], [])
    assert parsed(new).extra_args == ()


def test_the_last_key_of_a_commented_table_leaves_its_header_and_comments() -> None:
    old = example()
    new = pe.unset_keys(old, ["spec.mode"])
    assert changed(old, new) == (['mode = "off"'], [])
    assert "[spec]\n# Speculative decoding" in new
    assert parsed(new).spec.mode == "off"
    commented = 'model = "m.gguf"\n[chat]  # sampling for every client\ntop_k = 20\n'
    assert pe.unset_keys(commented, ["chat.top_k"]) == \
        'model = "m.gguf"\n[chat]  # sampling for every client\n'


def test_a_table_the_unset_leaves_empty_goes_with_its_header() -> None:
    """Today's main left ``[spec]`` alone in the file."""
    assert pe.unset_keys(SMALL, ["spec.mode"]) == 'model = "m.gguf"  # the model\nctx = 4096\n\n'
    two = 'model = "m"\n[env]\nA = "1"\nB = "2"\n[chat]\ntop_k = 20\n'
    assert pe.unset_keys(two, ["env.A"]) == 'model = "m"\n[env]\nB = "2"\n[chat]\ntop_k = 20\n'
    assert pe.unset_keys(two, ["env.A", "env.B"]) == 'model = "m"\n[chat]\ntop_k = 20\n'
    assert pe.unset_keys('model = "m"\nenv = {A = "1"}\nctx = 1\n', ["env.A"]) == \
        'model = "m"\nctx = 1\n'


def test_unsetting_a_key_not_set_lists_those_set() -> None:
    with pytest.raises(ConfigError) as e:
        pe.unset_keys(SMALL, ["spec.n_max"])
    assert str(e.value) == "no key 'spec.n_max' in this preset; set: model, ctx, spec.mode"
    with pytest.raises(ConfigError, match="no key 'chat.top_k'"):
        pe.unset_keys(SMALL, ["chat.top_k"])
    with pytest.raises(ConfigError, match="no key 'ctx.x'"):
        pe.unset_keys(SMALL, ["ctx.x"])
    with pytest.raises(ConfigError, match="no key 'ctx'"):   # the second time
        pe.unset_keys(SMALL, ["ctx", "ctx"])


def test_model_cannot_be_unset() -> None:
    with pytest.raises(ConfigError, match="^model is required"):
        pe.unset_keys(SMALL, ["model"])


def test_a_table_cannot_be_unset_as_a_whole() -> None:
    with pytest.raises(ConfigError, match=r"^spec: is a table: unset its keys one by one "
                                          r"\(set: spec\.mode\)"):
        pe.unset_keys(SMALL, ["spec"])


# --- new_text ---------------------------------------------------------------------


def test_a_new_preset_holds_its_values_model_first_then_tables() -> None:
    text = pe.new_text({"spec.mode": "mtp", "ctx": 8192, "model": "Qwen3-8B-Q4_K_M.gguf",
                        "chat.temperature": 0.7, "extra_args": ["--jinja"]})
    lines = text.splitlines()
    assert lines[0] == "# Created by lokictl new (lokid)."
    assert lines[1] == 'model = "Qwen3-8B-Q4_K_M.gguf"'
    assert text.index("ctx = 8192") < text.index("[spec]") < text.index("[chat]")
    p = parsed(text)
    assert (p.model, p.ctx, p.extra_args, p.spec.mode, p.chat.temperature) == (
        "Qwen3-8B-Q4_K_M.gguf", 8192, ("--jinja",), "mtp", 0.7)


def test_a_new_preset_needs_a_model_and_valid_keys() -> None:
    with pytest.raises(ConfigError, match="^model is required"):
        pe.new_text({"ctx": 1})
    with pytest.raises(ConfigError, match="is not a preset key"):
        pe.new_text({"model": "m", "a.b.c": 1})
    assert parsed(pe.new_text({"model": "m"})).model == "m"


# --- parse_value, etag ------------------------------------------------------------


@pytest.mark.parametrize(("text", "value"), [
    ("4096", 4096),
    ("0.7", 0.7),
    ("true", True),
    ("false", False),
    ('["--jinja", "-fa", "on"]', ["--jinja", "-fa", "on"]),
    ("[0, 1]", [0, 1]),
    ('"123"', "123"),
    ("'x y'", "x y"),
    ("mtp", "mtp"),
    ("mtp+ngram", "mtp+ngram"),
    ("Qwen3-8B-Q4_K_M.gguf", "Qwen3-8B-Q4_K_M.gguf"),
    ("/models/a b.gguf", "/models/a b.gguf"),
    ("GPU-8f6a", "GPU-8f6a"),
    ("", ""),
    ("1\nctx = 2", "1\nctx = 2"),    # not one value
    ("{ A = 1 }", "{ A = 1 }"),      # a table is no value of one key
    ("2024-01-01", "2024-01-01"),    # nor is a date
    ("[1.5]", "[1.5]"),
])
def test_parse_value(text: str, value: object) -> None:
    got = pe.parse_value(text)
    assert got == value and type(got) is type(value)


def test_etag_names_the_bytes() -> None:
    raw = example().encode()
    assert pe.etag(raw) == pe.etag(bytes(raw))
    assert pe.etag(raw).startswith("sha256:") and len(pe.etag(raw)) == len("sha256:") + 32
    assert pe.etag(raw) != pe.etag(raw[:-1] + b"x")
    assert pe.etag(None) == ""
    assert pe.etag(b"") != ""



# --- parse_preset_text: a candidate text gets a file's bounds ---------------------


def test_parse_preset_text_bounds_a_text_as_a_file() -> None:
    big = 'model = "m"\n' + "#" * MAX_FILE_BYTES + "\n"
    with pytest.raises(ConfigError) as e:
        parsed(big)
    assert str(e.value) == (f"{PATH}: too large: {len(big)} bytes, the limit is "
                            f"{MAX_FILE_BYTES} bytes (a preset is a few KB)")
    with pytest.raises(ConfigError, match=r"not UTF-8 text \(character 10\)"):
        parsed('model = "m\udc80"\n')
    with pytest.raises(ConfigError, match=rf"^{PATH}:2: TOML syntax error"):
        parsed('model = "m"\nctx = \n')
    p = parsed(SMALL)
    assert (p.name, p.path, p.model, p.ctx) == ("p", PATH, "m.gguf", 4096)


# --- the size of one edit, and its cost --------------------------------------------


def test_an_edit_larger_than_a_preset_file_is_refused_before_any_work() -> None:
    from lokid.core.config.tomlscan import MAX_KEY_LENGTH, MAX_KEYS
    from lokid.core.errors import InvalidArgsError

    pe.check_edit([f"env.V{i}" for i in range(MAX_KEYS)], ["x"] * MAX_KEYS)
    with pytest.raises(InvalidArgsError) as e:
        pe.check_edit([f"env.V{i}" for i in range(10_000)])
    assert str(e.value) == "10000 keys in one edit: at most 256, as many as a preset file " \
        "may hold"
    with pytest.raises(InvalidArgsError, match=f"at most {MAX_KEY_LENGTH}"):
        pe.check_edit(["env." + "K" * 200])
    with pytest.raises(InvalidArgsError, match=f"at most {MAX_FILE_BYTES}, the size of a "):
        pe.check_edit(["env.BIG"], ["x" * MAX_FILE_BYTES])
    with pytest.raises(InvalidArgsError, match="bytes of keys and values"):
        pe.check_edit(["extra_args"], [["--a"] * 20_000])


def test_an_edit_of_many_keys_parses_and_writes_the_text_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Linear in the keys: today's main parsed and wrote the whole text again per key
    (240 parses for 240 keys; 10,000 keys took minutes). benchmarks/edit_keys.py shows
    the growth by size."""
    import tomlkit

    parses: list[int] = []
    real = tomlkit.parse

    def counting(text: str) -> object:
        parses.append(len(text))
        return real(text)

    monkeypatch.setattr(pe.tomlkit, "parse", counting)
    values = {f"env.V{i}": f"value {i}" for i in range(240)}
    new = pe.set_keys(SMALL, values)
    assert len(parses) == 1
    assert parsed(new).env["V239"] == "value 239"
    parses.clear()
    pe.unset_keys(new, list(values)[:200])
    assert len(parses) == 1


def test_a_cancelled_edit_stops_between_keys() -> None:
    from lokid.core.errors import BusyError

    asked: list[int] = []

    def cancelled() -> bool:
        asked.append(1)
        return len(asked) > 3

    with pytest.raises(BusyError, match="lokid is stopping"):
        pe.set_keys(SMALL, {f"env.V{i}": "x" for i in range(100)}, cancelled)
    assert len(asked) == 4
