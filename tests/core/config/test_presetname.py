"""The preset name rule, checked without ``re`` (a unit step reads the name first): the
same names as the pattern it replaced, ``[A-Za-z0-9][A-Za-z0-9_.-]{0,63}`` in full."""

from __future__ import annotations

import random
import re

import pytest

from lokid.core.config.presetname import check_preset_name, valid_preset_name
from lokid.core.errors import ConfigError

PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
EDGES = ["", "a", "a" * 64, "a" * 65, "-a", ".a", "_a", "a-", "a.b_c-d", "9", "a\n", "\na",
         "a b", "é", "a/b", "..", "a\0", "١", "Ａ", "ß", "a\u200b", "\udcff"]


@pytest.mark.parametrize("name", EDGES)
def test_the_edges_read_as_the_pattern_read_them(name: str) -> None:
    assert valid_preset_name(name) == (PATTERN.fullmatch(name) is not None)


def test_random_names_read_as_the_pattern_read_them() -> None:
    rng = random.Random(31)
    alphabet = "aZ09_.-/ \n\x00é١"
    for _ in range(20000):
        name = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 70)))
        assert valid_preset_name(name) == (PATTERN.fullmatch(name) is not None), repr(name)


def test_a_bad_name_is_a_config_error_that_names_it() -> None:
    with pytest.raises(ConfigError, match="'../x'"):
        check_preset_name("../x")
