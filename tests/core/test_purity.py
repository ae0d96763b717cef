"""The pure core is the package ``lokid/core`` itself: no I/O edge, nothing above it.

Every module found under ``lokid/core/``, its topics' sub-packages included (issue 49
grouped it by topic), is checked (no list to keep in step), and
every import form counts: ``import x``, ``from x import y``, relative imports
(``from . import x``, ``from ..planning import y``, resolved against the
module's package), imports inside functions or ``if TYPE_CHECKING:``, and
dynamic ones (``importlib.import_module``, ``__import__``), which the core
may not use at all since no reader can see what they load. The checker is
proved on planted modules: each forbidden form must be caught.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import lokid.core

CORE = Path(lokid.core.__file__).parent
CORE_PACKAGE = "lokid.core"
# Edges of the outside world the core never touches: process spawning, sockets and
# HTTP, the bus, systemd, the event loop, and dynamic imports (unreadable by this test).
FORBIDDEN = {"subprocess", "socket", "ssl", "http", "urllib", "httpx", "requests",
             "dbus_fast", "dbus_next", "dbus", "systemd", "sdnotify", "asyncio",
             "multiprocessing", "ctypes", "importlib"}


def imports_of(source: str, module: str) -> set[str]:
    """Every module ``source`` (the text of ``module``, dotted) may import, absolute."""
    package = module.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base_parts = parts[:len(parts) - (node.level - 1)] if node.level > 1 else parts
                base = ".".join(base_parts)
                stem = f"{base}.{node.module}" if node.module else base
            else:
                stem = node.module or ""
            found.add(stem)
            # `from pkg import name` may import the submodule pkg.name
            found.update(f"{stem}.{alias.name}" for alias in node.names if alias.name != "*")
        elif isinstance(node, ast.Call):
            fn = node.func
            name = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", "")
            if name in ("import_module", "__import__"):
                found.add("importlib")   # a dynamic import: forbidden whatever it loads
    return found


def violations(source: str, module: str) -> set[str]:
    bad = set()
    for name in imports_of(source, module):
        top = name.split(".")[0]
        if top in FORBIDDEN:
            bad.add(name)
        elif top == "lokid" and not (name == CORE_PACKAGE or name.startswith(CORE_PACKAGE + ".")):
            bad.add(name)   # the core imports nothing of lokid above it
    return bad


def core_modules() -> list[str]:
    """Every module under the core, recursively, dotted below it (``launch.plan``); a
    sub-package by its own name (``launch``)."""
    found = []
    for p in CORE.rglob("*.py"):
        parts = p.relative_to(CORE).with_suffix("").parts
        if parts == ("__init__",):
            continue
        found.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return sorted(found)


def core_path(module: str) -> Path:
    path = CORE.joinpath(*module.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def test_the_core_is_the_package_and_holds_the_rules() -> None:
    # A guard against checking an empty or moved package: the pure modules are here, in
    # the topics too (a check of the top directory alone would see none of them).
    assert {"config.files", "launch.plan", "launch.spec", "launch.flags", "errors",
            "launch.runtimeplan", "bench.rules", "telemetry.enginelog", "launch.attempt",
            "model.modelinfo", "launch.caps", "names", "place.need", "fleet.route",
            "serve.tables", "launch"} <= set(core_modules())


@pytest.mark.parametrize("module", core_modules())
def test_core_module_imports_nothing_impure(module: str) -> None:
    path = core_path(module)
    # a package's relative imports start from the package itself
    name = f"{CORE_PACKAGE}.{module}" + (".__init__" if path.name == "__init__.py" else "")
    assert violations(path.read_text(), name) == set()


PLANTED = [
    ("import subprocess", "subprocess"),
    ("import os, socket", "socket"),
    ("from urllib.request import urlopen", "urllib.request"),
    ("import http.client", "http.client"),
    ("from dbus_fast.aio import MessageBus", "dbus_fast.aio"),
    ("from systemd import journal", "systemd"),
    ("def f():\n    import asyncio\n", "asyncio"),
    ("TYPE_CHECKING = False\nif TYPE_CHECKING:\n    import httpx\n", "httpx"),
    ("from .. import unit", "lokid.unit"),
    ("from ..unit.supervisor import supervise", "lokid.unit.supervisor"),
    ("from ..dbus import daemon", "lokid.dbus"),
    ("from lokid.bench.protocol import run", "lokid.bench.protocol"),
    ("from lokid import cli", "lokid.cli"),
    ("import lokid.store.state", "lokid.store.state"),
    ("import importlib\nimportlib.import_module('subprocess')", "importlib"),
    ("__import__('socket')", "importlib"),
]


@pytest.mark.parametrize(("source", "caught"), PLANTED)
def test_a_planted_forbidden_import_is_caught(source: str, caught: str) -> None:
    assert caught in violations(source, f"{CORE_PACKAGE}.planted")


def test_the_core_own_relative_imports_are_allowed() -> None:
    source = "from . import flags\nfrom .plan import Plan\nfrom .. core import names\n"
    assert violations(source, f"{CORE_PACKAGE}.planted") == set()


def test_a_planted_module_fails_the_real_check(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """End to end: a module planted in a copy of the package makes the check fail."""
    copy = tmp_path / "core"
    shutil.copytree(CORE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "planted.py").write_text('"""planted"""\nfrom ..planning import gather\n')
    # one level down, ``...planning`` is what climbs out of the core
    (copy / "launch" / "planted.py").write_text('"""planted"""\nfrom ...planning import x\n')
    monkeypatch.setattr(sys.modules[__name__], "CORE", copy)
    assert {"planted", "launch.planted"} <= set(core_modules())
    for planted in ("planted", "launch.planted"):
        with pytest.raises(AssertionError):
            test_core_module_imports_nothing_impure(planted)
    test_core_module_imports_nothing_impure("launch.plan")   # the real one passes


def test_importing_the_whole_core_loads_no_edge() -> None:
    """What actually loads, transitively (the standard library included), in a fresh
    interpreter: no module of the edges and nothing of lokid outside the core."""
    code = ("import sys\n"
            + "".join(f"import lokid.core.{m}\n" for m in core_modules())
            + "print('\\n'.join(sorted(sys.modules)))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True).stdout.split()
    edges = {m for m in loaded if m.split(".")[0] in FORBIDDEN - {"importlib"}}
    above = {m for m in loaded if m.startswith("lokid.") and not m.startswith("lokid.core")}
    assert not edges and not above, (edges, above)


# The layers, lowest first: a module may import its own layer and the ones before it,
# never one after. Each package's docstring says who runs it and what it may import, in
# this order: core, host, store, planning, unit, runners, watch, bench, dbus, and on top
# the two commands and release 0.1.0's old module names (lokid/engine/).
LAYERS = ["lokid.core", "lokid.host", "lokid.store", "lokid.planning", "lokid.unit",
          "lokid.runners", "lokid.watch", "lokid.bench", "lokid.dbus",
          "lokid.cli|lokid.ctl|lokid.engine|lokid.gateway"]
PACKAGE = CORE.parent


def layer_of(module: str) -> int:
    if module == "lokid.__main__":
        return len(LAYERS)   # python -m lokid: the lokid command, on top of everything
    for i, layer in enumerate(LAYERS):
        if any(module == name or module.startswith(name + ".") for name in layer.split("|")):
            return i
    return -1   # lokid itself (its __init__ holds the version)


def all_modules() -> list[str]:
    return sorted(".".join(("lokid", *p.relative_to(PACKAGE).with_suffix("").parts))
                  for p in PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("module", all_modules())
def test_imports_point_downward(module: str) -> None:
    here = layer_of(module)
    path = PACKAGE.joinpath(*module.split(".")[1:]).with_suffix(".py")
    upward = {name for name in imports_of(path.read_text(), module)
              if name.startswith("lokid.") and layer_of(name) > here}
    assert upward == set()


def test_an_upward_import_is_caught() -> None:
    source = "from ..dbus.daemon import Daemon\n"
    assert layer_of("lokid.dbus.daemon") > layer_of("lokid.planning.gather")
    assert any(layer_of(n) > layer_of("lokid.planning.gather")
               for n in imports_of(source, "lokid.planning.gather") if n.startswith("lokid."))
