"""A preset's model named by a hub reference (issue 48, :mod:`lokid.core.model.pulled`): which
settings are references, and which manifests a preset believes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lokid.core.config.files import parse_preset_text, resolve_file
from lokid.core.errors import ConfigError
from lokid.core.model import pulled


@pytest.mark.parametrize(("value", "reference"), [
    ("org/repo:Q4_K_M", "org/repo:Q4_K_M"),
    ("org/repo", "org/repo"),
    ("org/repo/sub/m-Q8_0.gguf", "org/repo/sub/m-Q8_0.gguf"),
    ("m.gguf", None),                 # a bare name, found in model_dirs as always
    ("/srv/models/m.gguf", None),     # an absolute path
    ("sub/m.gguf", None),             # a relative path: refused as it always was
    ("org/../etc", None),             # nothing a pull could read
    ("", None),
])
def test_which_settings_are_references(value: str, reference: str | None) -> None:
    assert pulled.canonical(value) == reference


def test_a_preset_may_name_a_reference_and_nothing_else_relative() -> None:
    p = parse_preset_text("p", "/etc/loki/presets/p.toml", 'model = "org/repo:Q4_K_M"\n')
    assert p.model == "org/repo:Q4_K_M"
    for bad in ("sub/m.gguf", "org/../etc"):
        with pytest.raises(ConfigError, match="relative path"):
            parse_preset_text("p", "/etc/loki/presets/p.toml", f'model = "{bad}"\n')
    with pytest.raises(ConfigError, match="relative path"):   # only model: not mmproj
        parse_preset_text("p", "/x.toml", 'model = "m"\nmmproj = "org/repo:F16"\n')


def write(directory: Path, reference: str, data: dict[str, object]) -> None:
    path = Path(pulled.manifest_path(str(directory), reference))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


def test_a_manifest_is_believed_only_for_its_reference_safe_names_and_a_model_there(
        tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    ref = "org/repo:Q4_K_M"
    assert resolve_file(ref, (str(a), str(b))) is None
    write(b, ref, {"reference": ref, "model": "m-Q4_K_M.gguf", "mmproj": "mmproj-F16.gguf"})
    assert resolve_file(ref, (str(a), str(b))) is None          # its model is not there
    (b / "m-Q4_K_M.gguf").write_bytes(b"GGUF")
    assert resolve_file(ref, (str(a), str(b))) == str(b / "m-Q4_K_M.gguf")
    assert pulled.find(ref, (str(a), str(b))) == (
        str(b), pulled.Pulled(ref, "m-Q4_K_M.gguf", "mmproj-F16.gguf"))
    # written by someone else than a pull: never a path out of its directory
    for bad in ("../../etc/passwd", "/etc/passwd", ".hidden", "", 7):
        write(a, ref, {"reference": ref, "model": bad})
        assert pulled.read_manifest(str(a), ref) is None, bad
    (a / "x.gguf").write_bytes(b"GGUF")
    write(a, ref, {"reference": "org/other", "model": "x.gguf"})   # another's digest clash
    assert pulled.read_manifest(str(a), ref) is None
    write(a, ref, {"reference": ref, "model": "x.gguf", "mmproj": "../p.gguf"})
    assert pulled.read_manifest(str(a), ref) is None
    Path(pulled.manifest_path(str(a), ref)).write_text("{not json")
    assert pulled.read_manifest(str(a), ref) is None
