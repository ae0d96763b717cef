"""The benchmarks and the demo script load: every name they import from lokid exists.

They run outside the test suite (``make bench``, ``make demo``), so a renamed module
would otherwise break them unseen (the package layout move once did). Loading a
script runs its imports, not its main.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from support import REPO

SCRIPTS = sorted([*REPO.glob("benchmarks/*.py"), REPO / "scripts" / "demo.py"])


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_script_loads(path: Path) -> None:
    spec = importlib.util.spec_from_file_location(f"script_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert callable(getattr(module, "main", None)), f"{path.name} has no main()"
