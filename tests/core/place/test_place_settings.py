"""lokid.toml's [placement] table (lokid.core.place.settings): typed values, and an
error naming file, line, key and what is valid for every bad one."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from lokid.core.config import files as cfg
from lokid.core.errors import ConfigError
from lokid.core.place import settings
from lokid.core.place.settings import PlacementConfig, parse_size

GLOBAL_EXAMPLE = Path(__file__).parents[3] / "etc" / "lokid.toml"


def load(tmp_path: Path, text: str) -> PlacementConfig:
    (tmp_path / "lokid.toml").write_text(text)
    return cfg.load_global(str(tmp_path)).placement


def test_without_a_placement_table_placement_is_on_with_no_bound_of_its_own(
        tmp_path: Path) -> None:
    assert cfg.load_global(str(tmp_path)).placement == PlacementConfig()
    assert load(tmp_path, "[placement]\n") == PlacementConfig(
        enabled=True, host_memory=None, reserve={}, max_wait=600.0)


@pytest.mark.parametrize("value,expected", [
    (1024, 1024), ("512M", 512 * 2**20), ("48G", 48 * 2**30), ("1.5T", int(1.5 * 2**40)),
    ("8 GiB", 8 * 2**30), ("300MB", 300 * 2**20), ("0", 0), ("2k", 2048),
])
def test_a_size_reads_as_systemd_reads_memorymax(value: object, expected: int) -> None:
    assert parse_size(value) == expected


@pytest.mark.parametrize("value,fragment", [
    ("lots", "'lots' is not a size"), ("8 GB of RAM", "is not a size"), (-1, "out of range"),
    (True, "not a boolean"), ("2048T", "out of range"), ([1], "not a list"),
])
def test_a_bad_size_says_what_is_valid(value: object, fragment: str) -> None:
    with pytest.raises(ValueError, match=re.escape(fragment)):
        parse_size(value)


def test_the_placement_table_parses_to_typed_values(tmp_path: Path) -> None:
    got = load(tmp_path, '[placement]\nenabled = false\nhost_memory = "1.5G"\n'
               'reserve = { host = "512M", GPU1 = 1048576 }\nmax_wait = "2min"\n')
    assert got == PlacementConfig(enabled=False, host_memory=int(1.5 * 2**30),
                                  reserve={"host": 512 * 2**20, "GPU1": 2**20}, max_wait=120.0)


@pytest.mark.parametrize("body,line,fragment", [
    ('enabled = "yes"\n', 2, "placement.enabled: must be true or false, not a string"),
    ('host_memory = "much"\n', 2, "placement.host_memory: 'much' is not a size"),
    ('reserve = "4G"\n', 2, "placement.reserve: must be a table of sizes by device"),
    ('reserve = { gpu0 = "1G" }\n', 2, "placement.reserve: 'gpu0' is not a device: host, "
     "or GPU0, GPU1"),
    ('reserve = { host = "x" }\n', 2, "placement.reserve: host: 'x' is not a size"),
    ('max_wait = "0s"\n', 2, "placement.max_wait: '0s' is out of range (1s to 1h)"),
    ('max_wait = "2 weeks"\n', 2, "placement.max_wait: '2 weeks'"),
    ('priority = 1\n', 2, "placement.priority: unknown key"),
])
def test_every_bad_placement_value_names_file_line_key_and_what_is_valid(
        tmp_path: Path, body: str, line: int, fragment: str) -> None:
    with pytest.raises(ConfigError) as exc:
        load(tmp_path, "[placement]\n" + body)
    assert f"{tmp_path / 'lokid.toml'}:{line}: {fragment}" in str(exc.value), str(exc.value)


def test_the_annotated_lokid_toml_documents_every_placement_key() -> None:
    text = GLOBAL_EXAMPLE.read_text()
    for key in settings.PLACEMENT_KEYS:
        assert re.search(rf"^#{key} = ", text, re.M), key
    lines = [re.sub(rf"^#({'|'.join(settings.PLACEMENT_KEYS)}) = ", r"\1 = ", line)
             for line in text.splitlines()]
    from lokid.core.config.tomlread import Checker, parse_toml

    data = parse_toml("\n".join(lines) + "\n", str(GLOBAL_EXAMPLE))
    parsed_table = settings.parse_placement(
        Checker(str(GLOBAL_EXAMPLE), text, data["placement"], "placement"))
    assert parsed_table == PlacementConfig(enabled=True, host_memory=48 * 2**30,
                                           reserve={"host": 4 * 2**30, "GPU0": 2 * 2**30},
                                           max_wait=600.0)
