"""The benchmarks and the demo script load: every name they import from lokid exists.

They run outside the test suite (``make bench``, ``make demo``), so a renamed module
would otherwise break them unseen (the package layout move once did). Loading a
script runs its imports, not its main. A module other benchmarks import (``noise``,
``routerkit``: shared code, no script) must load but needs no ``main()``.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest
from support import REPO

SCRIPTS = sorted([*REPO.glob("benchmarks/*.py"), REPO / "scripts" / "demo.py"])


def _imported(stem: str) -> bool:
    """Whether another benchmark imports module ``stem`` (then it is a library)."""
    pattern = re.compile(rf"^\s*(from {stem} import|import {stem}\b)", re.M)
    return any(pattern.search(p.read_text()) for p in REPO.glob("benchmarks/*.py")
               if p.stem != stem)


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_script_loads(path: Path) -> None:
    spec = importlib.util.spec_from_file_location(f"script_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # registered while it runs, as an import does: a dataclass looks its module up there
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    assert callable(getattr(module, "main", None)) or _imported(path.stem), \
        f"{path.name} has no main() and no benchmark imports it"
