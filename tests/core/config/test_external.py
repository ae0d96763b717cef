"""lokid.core.config.external: a preset of kind = "external" as lokid.core.config.files
reads it: its typed values and defaults, every bad value located (file, line, key), an
engine key in it (or an external key in an engine preset) refused by name, what `lokid
plan` notes of it, and its creation and edit through lokid.core.config.presetedit."""

from __future__ import annotations

from pathlib import Path

import pytest

from lokid.core.config import external as ext
from lokid.core.config import files as cfg
from lokid.core.config import presetedit as pe
from lokid.core.errors import ConfigError

HEAD = 'kind = "external"\nurl = "http://127.0.0.1:9100/v1"\n'


def load(tmp_path: Path, text: str, name: str = "remote") -> cfg.Preset:
    path = tmp_path / "presets" / f"{name}.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return cfg.load_preset(str(tmp_path), name)


def refused(tmp_path: Path, text: str) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, text)
    return info.value


def test_an_external_preset_has_its_url_and_the_upstream_model_defaults_to_its_name(
        tmp_path: Path) -> None:
    p = load(tmp_path, 'kind = "external"\nurl = "https://api.example.org/v1/"\n')
    assert p.external == ext.External(url="https://api.example.org/v1",  # no trailing /
                                      upstream_model="remote", api_key_file=None)
    assert p.model == ""
    p = load(tmp_path, HEAD + 'upstream_model = "qwen3-32b"\napi_key_file = "/etc/k"\n')
    assert p.external == ext.External("http://127.0.0.1:9100/v1", "qwen3-32b", "/etc/k")


def test_an_engine_preset_is_kind_engine_by_default_or_when_said(tmp_path: Path) -> None:
    assert load(tmp_path, 'model = "m"\n').external is None
    assert load(tmp_path, 'kind = "engine"\nmodel = "m"\n').external is None


@pytest.mark.parametrize(("text", "line", "key", "words"), [
    ('kind = "remote"\n', 1, "kind", '"external"'),
    ('kind = "external"\n', None, "url", "missing"),
    ('kind = "external"\n\nurl = "ftp://h/v1"\n', 3, "url", "http:// or https://"),
    ('kind = "external"\nurl = "http:///v1"\n', 2, "url", "with a host"),
    ('kind = "external"\nurl = "http://h/v1?x=1"\n', 2, "url", "query"),
    ('kind = "external"\nurl = "http://h:99999/v1"\n', 2, "url", "1 to 65535"),
    ('kind = "external"\nurl = "http://h /v1"\n', 2, "url", "no spaces"),
    ('kind = "external"\nurl = 5\n', 2, "url", "must be a string"),
    (HEAD + 'upstream_model = ""\n', 3, "upstream_model", "1 to 256"),
    (HEAD + 'upstream_model = 3\n', 3, "upstream_model", "must be a string"),
    (HEAD + 'api_key_file = "keys/k"\n', 3, "api_key_file", "not an absolute path"),
    (HEAD + 'ctx = 4096\n', 3, "ctx", "nothing runs here"),
    (HEAD + 'model = "m.gguf"\n', 3, "model", "nothing runs here"),
    (HEAD + '[serve]\non_demand = true\n', 4, "serve.on_demand", "nothing runs here"),
    (HEAD + 'gpus = [0]\n', 3, "gpus", "nothing runs here"),
    ('model = "m"\nurl = "http://h/v1"\n', 2, "url", 'only for kind = "external"'),
    ('model = "m"\nupstream_model = "x"\n', 2, "upstream_model", 'only for kind = "external"'),
])
def test_every_bad_value_is_located(tmp_path: Path, text: str, line: int | None, key: str,
                                    words: str) -> None:
    e = refused(tmp_path, text)
    assert (e.path, e.line, e.key) == (str(tmp_path / "presets" / "remote.toml"), line, key)
    assert words in e.reason


def test_a_password_in_the_url_is_refused_without_showing_it(tmp_path: Path) -> None:
    e = refused(tmp_path, 'kind = "external"\nurl = "http://me:hunter2@h/v1"\n')
    assert e.key == "url" and "api_key_file" in e.reason
    assert "hunter2" not in str(e)


def test_a_broken_external_preset_does_not_hide_the_others(tmp_path: Path) -> None:
    (tmp_path / "presets").mkdir()
    (tmp_path / "presets" / "bad.toml").write_text('kind = "external"\nctx = 1\n')
    (tmp_path / "presets" / "good.toml").write_text(HEAD)
    good, bad = cfg.load_presets(str(tmp_path))
    assert list(good) == ["good"] and good["good"].external is not None
    assert list(bad) == ["bad"] and bad["bad"].key == "ctx"


def test_the_plan_notes_say_nothing_runs_here_and_never_show_a_key(tmp_path: Path) -> None:
    p = load(tmp_path, HEAD + 'api_key_file = "/etc/loki/keys/remote.key"\n')
    assert p.external is not None
    notes = ext.external_notes("remote", p.external)
    assert notes[0].startswith("external API at http://127.0.0.1:9100/v1: nothing runs here")
    assert any("/etc/loki/keys/remote.key" in n and "preset-key.remote" in n for n in notes)
    assert "nothing runs here" in ext.nothing_runs("remote", p.external)


def test_a_new_external_preset_needs_a_url_not_a_model(tmp_path: Path) -> None:
    text = pe.new_text({"url": "http://127.0.0.1:9100/v1", "kind": "external"})
    assert text.splitlines()[1] == 'kind = "external"'   # first after the comment
    assert cfg.parse_preset_text("remote", "/p/remote.toml", text).external is not None
    with pytest.raises(ConfigError, match="url is required"):
        pe.new_text({"kind": "external"})
    with pytest.raises(ConfigError, match="model is required"):
        pe.new_text({"ctx": 1})


def test_its_keys_are_set_and_unset_like_any_other(tmp_path: Path) -> None:
    text = pe.set_keys(HEAD, {"upstream_model": "big", "url": "http://10.0.0.2:8000/v1"})
    p = cfg.parse_preset_text("remote", "/p/remote.toml", text)
    assert p.external == ext.External("http://10.0.0.2:8000/v1", "big")
    p = cfg.parse_preset_text("remote", "/p/remote.toml", pe.unset_keys(text, ["upstream_model"]))
    assert p.external is not None and p.external.upstream_model == "remote"


def test_the_addresses_and_the_model_list() -> None:
    assert ext.ip_host("http://10.0.0.7:8000/v1") == "10.0.0.7"
    assert ext.ip_host("http://[::1]:8000/v1") == "::1"
    assert ext.ip_host("https://api.example.org/v1") is None
    assert ext.models_url("http://h/v1") == "http://h/v1/models"
    assert ext.key_credential("remote") == "preset-key.remote"
