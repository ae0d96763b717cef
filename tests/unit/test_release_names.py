"""Release 0.1.0's module names still resolve (lokid/engine/), to the modules that moved.

A 0.1.0 engine step loading a model while apt installs this release imports some of its
modules only after the engine is spawned: in the callbacks of its supervisor (the engine
answered, or refused its command line) and in what they call. Which ones is read here
from that release's own lokid/engine/unit.py (tests/data/release-0.1.0/unit_py.txt), so
the list of old names cannot drift from what the old code really imports.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

OLD_UNIT = Path(__file__).resolve().parent.parent / "data" / "release-0.1.0" / "unit_py.txt"
MOVED = {"state": "lokid.store.state", "exits": "lokid.store.exits",
         "plancache": "lokid.store.plancache", "argcheck": "lokid.unit.argcheck"}


def imported_after_spawn() -> dict[str, set[str]]:
    """Old module -> the names taken from it, by the callbacks inside 0.1.0's engine()
    (on_ready, refused: those run once the engine is spawned) and the module-level
    functions they call."""
    tree = ast.parse(OLD_UNIT.read_text())
    functions = {f.name: f for f in tree.body if isinstance(f, ast.FunctionDef)}
    engine = functions["engine"]
    callbacks = [f for f in ast.walk(engine) if isinstance(f, ast.FunctionDef)
                 and f.name in ("on_ready", "refused")]
    todo, seen = list(callbacks), set()
    found: dict[str, set[str]] = {}
    while todo:
        fn = todo.pop()
        for node in ast.walk(fn):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                if node.module:
                    found.setdefault(node.module, set()).update(a.name for a in node.names)
                else:
                    for a in node.names:
                        found.setdefault(a.name, set())
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                callee = functions.get(node.func.id)
                if callee is not None and callee.name not in seen:
                    seen.add(callee.name)
                    todo.append(callee)
            elif (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                  and node.value.id in ("exits", "plancache")):
                found.setdefault(node.value.id, set()).add(node.attr)
    return found


def test_the_old_names_are_exactly_what_0_1_0_imports_after_spawning() -> None:
    assert set(imported_after_spawn()) == set(MOVED)


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_name_is_the_moved_module_with_what_0_1_0_takes_from_it(old: str) -> None:
    module = importlib.import_module(f"lokid.engine.{old}")
    assert module is importlib.import_module(MOVED[old])
    for name in imported_after_spawn()[old]:
        assert hasattr(module, name), f"0.1.0 takes {name} from lokid.engine.{old}"
