"""The lower bounds of lokid's libraries (issue 45, "more generally"): the package runs on
the libraries Debian ships, so its bounds are the oldest Debian release's versions, said
the same way in pyproject.toml (pip's) and debian/control (apt's).

Before, pyproject said ``aiohttp>=3.8`` and debian/control named python3-aiohttp with no
version at all: a backport of lokid to a release with an older aiohttp would have
installed, and the gateway's rules tested only on 3.8.4 and later would have met an
aiohttp nobody ran them on. The versions are those of Debian 12 (bookworm)
(tests/support/lowerbounds.py; tests/packaging/test_deb_silent.py checks its archive
against them)."""

from __future__ import annotations

import re
import tomllib

from support import REPO
from support.lowerbounds import DEBIAN_12


def pyproject_bounds() -> dict[str, str]:
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    bounds = {}
    for dep in deps:
        m = re.fullmatch(r"([A-Za-z0-9_.-]+)\s*>=\s*([0-9.]+)", dep)
        assert m, f"pyproject.toml: {dep!r} is not NAME>=VERSION"
        bounds[m.group(1)] = m.group(2)
    return bounds


def control_depends(package: str = "lokid") -> dict[str, str]:
    """``package``'s Depends in debian/control: name -> its ``>=`` version ("" for none)."""
    text = (REPO / "debian" / "control").read_text()
    stanza = next(s for s in text.split("\n\n") if re.search(rf"^Package: {package}$", s, re.M))
    m = re.search(r"^Depends:(.*?)^(?=\S)", stanza + "\nEnd:", re.M | re.S)
    assert m, f"debian/control: {package} has no Depends"
    depends = {}
    for dep in m.group(1).split(","):
        first = dep.split("|")[0].strip()
        if not first:
            continue
        v = re.fullmatch(r"(\S+)\s*(?:\(>=\s*([^)\s]+)\))?", first)
        assert v, f"debian/control: cannot read {first!r}"
        depends[v.group(1)] = v.group(2) or ""
    return depends


def test_pyproject_asks_for_what_debian_12_ships() -> None:
    assert pyproject_bounds() == {name: version for name, (_, version) in DEBIAN_12.items()}


def test_debian_control_asks_for_the_same_versions() -> None:
    depends = control_depends()
    for package, version in DEBIAN_12.values():
        assert depends.get(package) == version, \
            f"debian/control: lokid should depend on {package} (>= {version}), not " \
            f"{depends.get(package)!r}"
