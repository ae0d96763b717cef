"""A preset's aliases (lokid.core.config.aliases): what the key may hold, who keeps a name two
presets claim, and the edit that would make a clash."""

from __future__ import annotations

import pytest

from lokid.core.config.aliases import MAX_ALIASES, check_unique, resolve
from lokid.core.config.files import parse_preset_text
from lokid.core.errors import ConfigError


def aliases_of(text: str, name: str = "qwen") -> tuple[str, ...]:
    return parse_preset_text(name, "/etc/loki/presets/qwen.toml",
                             'model = "/m.gguf"\n' + text).aliases


def test_aliases_are_read_as_written() -> None:
    assert aliases_of("") == ()
    assert aliases_of('aliases = ["gpt-4o-mini", "qwen3.5"]\n') == ("gpt-4o-mini", "qwen3.5")
    assert aliases_of("aliases = []\n") == ()
    external = parse_preset_text("api", "api.toml", 'kind = "external"\nurl = '
                                 '"http://127.0.0.1:9/v1"\naliases = ["gpt-4o"]\n')
    assert external.aliases == ("gpt-4o",) and external.external is not None


@pytest.mark.parametrize(("text", "said"), [
    ('aliases = "gpt-4o-mini"\n', "must be a list of names"),
    ("aliases = [1]\n", "each alias must be a string, not"),
    ('aliases = ["a b"]\n', "'a b' is not a valid name"),
    ('aliases = ["-x"]\n', "'-x' is not a valid name"),
    ('aliases = ["http://x"]\n', "is not a valid name"),
    (f'aliases = ["{"x" * 65}"]\n', "is not a valid name"),
    ('aliases = ["qwen"]\n', "'qwen' is the preset's own name"),
    ('aliases = ["a", "a"]\n', "'a' is listed twice"),
    ("aliases = [" + ", ".join(f'"a{i}"' for i in range(MAX_ALIASES + 1)) + "]\n",
     f"at most {MAX_ALIASES}"),
])
def test_a_bad_alias_is_an_error_naming_the_file_and_key(text: str, said: str) -> None:
    with pytest.raises(ConfigError) as e:
        aliases_of(text)
    assert said in str(e.value)
    assert str(e.value).startswith("/etc/loki/presets/qwen.toml:2: aliases: "), str(e.value)


def test_a_name_wins_over_an_alias_and_the_first_by_name_keeps_a_shared_one() -> None:
    kept, lost = resolve({"b": ("gpt", "fast"), "a": ("gpt",), "c": ("a", "mine"), "d": ()})
    assert kept == {"a": ("gpt",), "b": ("fast",), "c": ("mine",), "d": ()}
    assert list(lost) == ["b", "c"]
    (why_b,) = lost["b"]
    assert "'gpt'" in why_b and "'a'" in why_b and "'b'" in why_b and "first by name" in why_b
    (why_c,) = lost["c"]
    assert "'a'" in why_c and "name of preset 'a'" in why_c
    # the same files, the same answer, whatever order they are given in
    assert resolve({"d": (), "a": ("gpt",), "c": ("a", "mine"), "b": ("gpt", "fast")})[0] == kept


def test_an_edit_that_would_make_a_clash_is_refused_naming_both() -> None:
    others = {"a": ("gpt",), "b": ("fast",)}
    check_unique("b", ("fast", "new"), others)   # its own aliases: no clash
    check_unique("c", ("other",), others)
    with pytest.raises(ConfigError) as e:
        check_unique("c", ("x", "gpt"), others, "/etc/loki/presets/c.toml")
    assert str(e.value) == ("/etc/loki/presets/c.toml: aliases: alias 'gpt' of preset 'c' "
                            "is an alias of preset 'a' already: each name routes to one preset")
    with pytest.raises(ConfigError, match="alias 'a' of preset 'c' is the name of preset 'a'"):
        check_unique("c", ("a",), others)
    with pytest.raises(ConfigError, match="the name of preset 'gpt' is an alias of preset 'a'"):
        check_unique("gpt", (), others)
