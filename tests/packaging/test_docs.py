"""Man pages build without a warning and render; the bash completion completes."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support import REPO
from support.completion import COMPLETION, complete

ROOT = REPO
PAGES = sorted((ROOT / "packaging" / "man").glob("*.rst"))


@pytest.mark.parametrize("source", PAGES, ids=[p.stem for p in PAGES])
def test_man_page_builds_and_renders(source: Path, tmp_path: Path) -> None:
    page = tmp_path / source.stem
    rst2man = Path(sys.executable).parent / "rst2man"
    subprocess.run([str(rst2man), "--halt=warning", str(source), str(page)], check=True,
                   capture_output=True)
    name, section = source.stem.rsplit(".", 1)
    roff = page.read_text()
    assert f'.TH "{name}" "{section}"' in roff
    if shutil.which("man"):
        text = subprocess.run(["man", "-l", str(page)], capture_output=True, text=True,
                              env={"MANWIDTH": "100", "PATH": "/usr/bin:/bin"}).stdout
        assert "SYNOPSIS" in text and "SEE ALSO" in text


def test_every_lokid_command_has_its_man_entry() -> None:
    from lokid.cli import _parser

    text = (ROOT / "packaging" / "man" / "lokid.8.rst").read_text()
    sub = next(a for a in _parser()._actions if a.dest == "command")
    for command in sub.choices:  # type: ignore[union-attr]
        assert f"**{command}**" in text, command


def test_bash_completion(tmp_path: Path) -> None:
    (tmp_path / "presets").mkdir()
    for name in ("qwen", "tiny-llama.v1_a"):
        (tmp_path / "presets" / f"{name}.toml").write_text('model = "m"\n')
    assert subprocess.run(["bash", "-n", str(COMPLETION)]).returncode == 0
    assert complete("lokid p", tmp_path) == ["plan", "prestart"]
    assert complete("lokid plan ", tmp_path) == ["--json", "qwen", "tiny-llama.v1_a"]
    assert complete("lokid run t", tmp_path) == ["tiny-llama.v1_a"]
    assert complete("lokid daemon --bus s", tmp_path) == ["session", "system"]
    assert complete("lokictl s", tmp_path) == ["set", "show", "start", "stats", "status", "stop"]
    assert complete("lokictl t", tmp_path) == ["top"]
    assert complete("lokictl l", tmp_path) == ["logs"]
    assert complete("lokictl logs ", tmp_path) == ["--follow", "-n", "qwen", "tiny-llama.v1_a"]
    assert complete("lokictl top --", tmp_path) == ["--json", "--once"]
    assert complete("lokictl stats ", tmp_path) == ["--json", "--since", "qwen",
                                                    "tiny-llama.v1_a"]
    assert complete("lokictl show q", tmp_path) == ["qwen"]
    assert complete("lokictl restart ", tmp_path) == ["--timeout", "--wait", "qwen",
                                                      "tiny-llama.v1_a"]
    assert complete("lokictl c", tmp_path) == ["cat", "clear-failures"]
    assert complete("lokictl bench --f", tmp_path) == ["--full"]
    assert complete("lokid b", tmp_path) == ["bench"]
    assert complete("lokid daemon --runner l", tmp_path) == ["local"]
