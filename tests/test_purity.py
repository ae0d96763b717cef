"""The pure core never imports systemd, D-Bus, HTTP or process-spawning modules."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import lokid

CORE = ["argscan", "attempt", "benchcore", "caps", "config", "enginelog", "engines", "errors",
        "modelinfo", "names", "paths", "plan", "spec"]
FORBIDDEN = {"subprocess", "httpx", "dbus_fast", "dbus_next", "systemd", "sdnotify", "socket",
             "asyncio"}
PACKAGE = Path(lokid.__file__).parent


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.level and node.module:
            names.add("lokid." + node.module.split(".")[0])
    return names


@pytest.mark.parametrize("module", CORE)
def test_core_module_imports_nothing_impure(module: str) -> None:
    imports = imported_modules(PACKAGE / f"{module}.py")
    assert not imports & FORBIDDEN, imports & FORBIDDEN
    # and only other core modules of lokid
    own = {name.split(".", 1)[1] for name in imports if name.startswith("lokid.")}
    assert own <= set(CORE), own - set(CORE)
