"""lokid.gateway.upstream: where the gateway reads a preset's key (systemd's credential
copy under loki-gateway.service, else the file), what a missing or empty one answers
(a 503 naming the preset, the path only in the log), and an external preset's target
URL and model."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from lokid.gateway.replies import GatewayError
from lokid.gateway.upstream import key_path, read_key


def test_under_the_unit_the_key_is_systemds_copy_else_the_file(tmp_path: Path) -> None:
    creds = tmp_path / "credentials"
    creds.mkdir()
    (creds / "preset-key.remote").write_text("# a comment\n\n  sk-copy  \nsk-second\n")
    env = {"LOKI_CREDENTIALS_DIR": str(creds)}
    assert key_path("remote", "/etc/loki/keys/r.key", env) == f"{creds}/preset-key.remote"
    assert read_key("remote", "/etc/loki/keys/r.key", env) == "sk-copy"
    (tmp_path / "r.key").write_text("sk-file\n")
    assert read_key("remote", str(tmp_path / "r.key"), {}) == "sk-file"


@pytest.mark.parametrize("content", [None, "", "# only a comment\n", "sk-\x01bad\n"])
def test_a_key_that_cannot_be_used_is_a_503_naming_the_preset(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, content: str | None) -> None:
    path = tmp_path / "r.key"
    if content is not None:
        path.write_text(content)
    with caplog.at_level(logging.WARNING, "lokid.gateway"), pytest.raises(GatewayError) as e:
        read_key("remote", str(path), {})
    assert e.value.status == 503 and "preset 'remote'" in e.value.message
    assert str(tmp_path) not in e.value.message        # the client is not told the path
    assert f"preset remote: cannot use its api_key_file {path}" in caplog.text
    assert "bad" not in caplog.text                    # nor is a key ever logged


def test_a_credential_not_loaded_yet_says_to_reload(tmp_path: Path,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, "lokid.gateway"), pytest.raises(GatewayError):
        read_key("remote", "/etc/loki/keys/r.key", {"LOKI_CREDENTIALS_DIR": str(tmp_path)})
    assert "systemctl daemon-reload" in caplog.text and "preset-key.remote" in caplog.text
