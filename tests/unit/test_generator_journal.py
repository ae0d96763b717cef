"""lokid.unit.generator: the engines' journal filter, written only for a systemd that knows it.

``LogFilterPatterns=`` (lokid.core.telemetry.journalfilter, issue 45, item 9) exists from
systemd 253 on; systemd 252 (Debian 12) logs "Unknown key" for each line at every load of
every engine instance. The generator learns the running version from ``systemctl --version``
(lokid.unit.systemdversion) and writes the engine template's drop-in for 253 and later
only, nothing when the version cannot be learnt. Here the drop-in is compared whole with a
golden file for 257, and ``lokid generate`` runs with a stand-in ``systemctl`` on PATH (a
real executable printing what Debian 12's and 13's print, or failing): the boundary the
generator reads. Under the real systemd of each release: tests/unit/test_logfilter_*systemd.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support import DATA
from support.enginekit import write_config, write_preset

from lokid.core.telemetry.journalfilter import DROPIN_NAME, PATTERNS, filter_dropin, systemd_version
from lokid.unit.generator import journal_dropin

# systemctl --version's first two lines on Debian 12 (measured on this Debian 12 host) and
# Debian 13 (the trixie container of tests/unit/test_logfilter_systemd.py).
BOOKWORM = ("systemd 252 (252.39-1~deb12u2)\n"
            "+PAM +AUDIT +SELINUX +APPARMOR +IMA +SMACK +SECCOMP +GCRYPT -GNUTLS +OPENSSL\n")
TRIXIE = ("systemd 257 (257.13-1~deb13u1)\n"
          "+PAM +AUDIT +SELINUX +APPARMOR +IMA +IPE +SMACK +SECCOMP +GCRYPT -GNUTLS +OPENSSL\n")


def template_dropin(out: Path) -> Path:
    return out / "loki-engine@.service.d" / DROPIN_NAME


@pytest.mark.parametrize(("text", "version"), [
    (BOOKWORM, 252), (TRIXIE, 257), ("  systemd 253 (253.1)\n", 253),
    ("", None), ("systemd\n", None), ("Systemd 257\n", None), ("systemd two (2)\n", None),
    ("not systemd 257\nsystemd 257\n", None)])
def test_the_version_is_systemctls_first_line(text: str, version: int | None) -> None:
    assert systemd_version(text) == version


def test_systemd_257_gets_the_filter_252_and_unknown_get_nothing(tmp_path: Path) -> None:
    out = tmp_path / "257"
    assert journal_dropin(str(out), 257)
    assert template_dropin(out).read_text() == (DATA / "generated" /
                                                "engine-journal-257.conf").read_text()
    assert journal_dropin(str(tmp_path / "253"), 253)   # the first that knows the key
    for version in (252, None):
        out = tmp_path / str(version)
        assert not journal_dropin(str(out), version)
        assert not out.exists()


def test_the_filter_is_deny_patterns_a_unit_file_reads_verbatim() -> None:
    lines = [line for line in filter_dropin(257).splitlines()
             if line.startswith("LogFilterPatterns=")]
    assert lines == [f"LogFilterPatterns=~{p}" for p in PATTERNS] and len(lines) == 7
    for line in lines:
        # no escape, quote or specifier; no blank a unit file's parser would strip
        assert not set(line) & set("\\\"'%") and line == line.strip(), line


def stand_in_systemctl(bindir: Path, script: str) -> None:
    bindir.mkdir()
    path = bindir / "systemctl"
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(0o755)


@pytest.mark.parametrize(("script", "filtered"), [
    (f"printf '%s' '{BOOKWORM}'\n", False),
    (f"printf '%s' '{TRIXIE}'\n", True),
    # a systemctl that fails, or says no version: unknown, nothing written
    (f"printf '%s' '{TRIXIE}'\nexit 1\n", False),
    ("echo 'something else'\n", False),
    (None, False)])   # none on PATH
def test_lokid_generate_asks_systemctl(tmp_path: Path, script: str | None,
                                       filtered: bool) -> None:
    config = write_config(tmp_path, "/usr/bin/llama-server", [tmp_path])
    write_preset(config, "p", 'model = "m.gguf"\n')
    bindir = tmp_path / "bin"
    if script is not None:
        stand_in_systemctl(bindir, script)
    # Python's own directory only besides: the host's systemctl must not answer
    path = f"{bindir}:{os.path.dirname(sys.executable)}"
    dirs = [tmp_path / d for d in ("normal", "early", "late")]
    r = subprocess.run([sys.executable, "-m", "lokid.cli", "--config-dir", str(config),
                        "generate", *map(str, dirs)], capture_output=True, text=True,
                       env=dict(os.environ, PATH=path))
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert (dirs[0] / "loki-engine@p.service.d" / "50-lokid-preset.conf").is_file()
    assert template_dropin(dirs[0]).is_file() == filtered
    if filtered:
        assert template_dropin(dirs[0]).read_text() == filter_dropin(257)
