"""lokid's Debian package, built and installed in real Debian containers
(tests/packaging/test_deb.py).

The package is built the way ``make deb`` builds it (``dpkg-buildpackage -us
-uc -b``) from a copy of the working tree, inside a Debian container of each
release it is for with that release's debhelper, dh-python, lintian and Python
libraries; then installed with apt into a fresh container of the same release
that holds only what every server has (systemd, dbus, apt) and the engine's
own shared libraries, so apt must resolve lokid's dependencies from Debian.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from .systemd_harness import REPO, Container

TARGET = "trixie"   # Debian 13, the current stable: what the package is for
SUITES = (TARGET, "bookworm")   # and Debian 12, which it keeps working on
PYTHON = {"trixie": "python3.13", "bookworm": "python3.11"}


def runtime_packages(suite: str) -> tuple[str, ...]:
    """What a GPU server has before lokid: the init system, the system bus, apt. And
    what llama-server b11434 (CPU build) links beyond its own libraries, curl to talk
    to it. Nothing of lokid's own dependencies: apt-get install must fetch them."""
    ssl = "libssl3t64" if suite == "trixie" else "libssl3"   # trixie's 64-bit time_t name
    return ("systemd", "systemd-sysv", "dbus", "procps", "iproute2", "curl",
            "libgomp1", ssl, "libstdc++6", "libgcc-s1")

# Virtual build dependencies and what provides them.
PROVIDERS = {"debhelper-compat": "debhelper", "dh-sequence-python3": "dh-python"}


def build_depends(control: Path = REPO / "debian" / "control") -> list[str]:
    """The source package's Build-Depends, one package each (first alternatives,
    virtual ones replaced by their provider), as mmdebstrap --include wants them."""
    text = control.read_text()
    m = re.search(r"^Build-Depends:(.*?)^(?=\S)", text, re.M | re.S)
    assert m, "debian/control has no Build-Depends"
    names = []
    for dep in m.group(1).split(","):
        first = dep.split("|")[0]
        name = re.sub(r"\(.*?\)|<.*?>|\[.*?\]", "", first).strip()
        if name:
            names.append(PROVIDERS.get(name, name))
    return names


def build_packages() -> tuple[str, ...]:
    """The build container: build-essential, the build dependencies and lintian, and a systemd
    to boot (the harness boots every container)."""
    return ("systemd", "systemd-sysv", "dbus", "build-essential", "lintian", *build_depends())


def copy_tree(dest: Path) -> Path:
    """The working tree as git sees it (tracked and new files, not ignored ones: no
    .venv, no .cache) copied to ``dest``/lokid: what a fresh clone would build."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                            "--exclude-standard"], cwd=REPO, check=True,
                           capture_output=True).stdout
    # Not the files deleted in the working tree (still in git's index).
    names = [f for f in files.split(b"\0") if f and os.path.lexists(REPO / os.fsdecode(f))]
    files = b"".join(name + b"\0" for name in names)
    src = dest / "lokid"
    src.mkdir(parents=True)
    pack = subprocess.Popen(["tar", "--null", "-T", "-", "-cf", "-"], cwd=REPO,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    unpack = subprocess.Popen(["tar", "-xf", "-"], cwd=src, stdin=pack.stdout)
    assert pack.stdin is not None and pack.stdout is not None
    pack.stdin.write(files)
    pack.stdin.close()
    pack.stdout.close()
    if unpack.wait() != 0 or pack.wait() != 0:
        raise RuntimeError("copying the working tree failed")
    return src


def tree_files(root: Path) -> list[str]:
    """Every file under ``root``, relative to it."""
    return [str(Path(d, f).relative_to(root)) for d, _, fs in os.walk(root) for f in fs]


def not_ignored(paths: list[str]) -> list[str]:
    """Those of ``paths`` (relative to the repository) its .gitignore does not cover."""
    if not paths:
        return []
    r = subprocess.run(["git", "check-ignore", "--no-index", "--stdin", "-z"], cwd=REPO,
                       input="\0".join(paths).encode() + b"\0", capture_output=True)
    ignored = set(os.fsdecode(p) for p in r.stdout.split(b"\0") if p)
    return [p for p in paths if p not in ignored]


@dataclass
class Build:
    """What :func:`build_in_container` made: ``rc`` is dpkg-buildpackage's status."""

    suite: str
    version: str
    rc: int
    log: str
    deb: Path                    # the release
    next_deb: Path | None        # the same tree as a later version (the upgrade), if asked
    lintian: str = ""
    lintian_rc: int = 0
    smoke: Path = Path()         # debian/tests/smoke of the tree that was built
    products: list[str] = field(default_factory=list)  # files the build added to the tree


def build_in_container(suite: str, work: Path, next_suffix: str = "") -> Build:
    """``dpkg-buildpackage -us -uc -b`` of a copy of the working tree in a container of
    ``suite``, then its lintian on the result; with ``next_suffix``, the same tree again
    as version <version><next_suffix> (for an upgrade). The .debs land in ``work``."""
    src = copy_tree(work)
    found = re.match(r"lokid \((.+?)\)", (src / "debian" / "changelog").read_text())
    if not found:
        raise RuntimeError("debian/changelog does not start with lokid (VERSION)")
    v = found.group(1)
    before = set(tree_files(src))
    with Container(suite=suite, packages=build_packages(), rw_binds={"/build": str(work)}) as ct:
        r = ct.run(["sh", "-c", "cd /build/lokid && dpkg-buildpackage -us -uc -b 2>&1"],
                   check=False, timeout=900)
        b = Build(suite, v, r.returncode, r.stdout, work / f"lokid_{v}_all.deb", None,
                  smoke=src / "debian" / "tests" / "smoke",
                  products=sorted(set(tree_files(src)) - before))
        if r.returncode != 0:
            return b
        arch = ct.run(["dpkg", "--print-architecture"]).stdout.strip()
        lint = ct.run(["lintian", "--fail-on", "error,warning", "--display-info",
                       f"/build/lokid_{v}_{arch}.changes"], check=False, timeout=600)
        b.lintian, b.lintian_rc = lint.stdout + lint.stderr, lint.returncode
        if next_suffix:
            # The changelog's first line names the version: the next build is that +suffix.
            ct.run(["sh", "-c", "cp -a /build/lokid /build/next && cd /build/next && "
                    f"sed -i '1s/({re.escape(v)})/({v}{next_suffix})/' debian/changelog && "
                    "dpkg-buildpackage -us -uc -b >/build/next.log 2>&1"], timeout=900)
            b.next_deb = work / f"lokid_{v}{next_suffix}_all.deb"
    return b


NEXT = "+ci1"   # the version suffix of the upgrade's build
_BUILT: dict[str, Build] = {}


def cached_build(suite: str, work: Path) -> Build:
    """:func:`build_in_container` of ``suite`` (with its :data:`NEXT` build), once per test
    session: the package tests and the fleet tests install the same build. ``work``: where
    the first caller's build lands."""
    if suite not in _BUILT:
        _BUILT[suite] = build_in_container(suite, work, NEXT)
    return _BUILT[suite]
