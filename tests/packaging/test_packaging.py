"""The packaging stays in step with the tree: one version, every system file shipped.

The Debian package itself is built, linted and installed in tests/packaging/test_deb.py;
this checks, in a blink, what would otherwise drift: a new unit or policy file
that debian/ forgets, a man page the build does not render, a version bumped
in one place only.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from support import REPO

import lokid

ROOT = REPO
DEBIAN = ROOT / "debian"
SYSTEM_FILES = sorted(p for d in ("units", "data", "etc") for p in (ROOT / d).rglob("*")
                      if p.is_file())


def shipped() -> set[Path]:
    """Files of the tree that debian/ installs: debian/lokid.install's sources and the
    files debian/'s symlinks (units, sysusers.d, tmpfiles.d) stand for."""
    found = set()
    for line in (DEBIAN / "lokid.install").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            found.add((ROOT / line.split()[0]).resolve())
    for link in DEBIAN.iterdir():
        if link.is_symlink():
            found.add(link.resolve())
    return found


def test_one_version_everywhere() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    changelog = re.match(r"lokid \(([^)]+)\)", (DEBIAN / "changelog").read_text())
    assert changelog, "debian/changelog must start with: lokid (VERSION) ..."
    assert project == lokid.__version__ == changelog.group(1)


def test_debian_symlinks_point_at_files_of_the_tree() -> None:
    links = [p for p in DEBIAN.iterdir() if p.is_symlink()]
    assert links
    for link in links:
        assert link.resolve().is_file(), f"{link.name} -> {link.readlink()} is dangling"
        assert link.resolve().is_relative_to(ROOT)


def test_every_system_file_is_shipped_and_documented_for_other_installs() -> None:
    readme = (ROOT / "packaging" / "README.md").read_text()
    assert SYSTEM_FILES
    for path in SYSTEM_FILES:
        rel = path.relative_to(ROOT).as_posix()
        assert path.resolve() in shipped(), f"{rel} is not installed by debian/"
        assert f"`{rel}`" in readme, f"{rel} is not in packaging/README.md"


def test_the_build_renders_every_man_page() -> None:
    rules = (DEBIAN / "rules").read_text()
    listed = re.search(r"^MAN_PAGES = (.*)$", rules, re.M)
    assert listed
    pages = {p.stem for p in (ROOT / "packaging" / "man").glob("*.rst")}
    assert set(listed.group(1).split()) == pages
    manpages = (DEBIAN / "lokid.manpages").read_text().split()
    assert {Path(m).name for m in manpages} == pages
