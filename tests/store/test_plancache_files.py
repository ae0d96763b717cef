"""The planner's own files in the reuse key: an edited planner plans afresh."""

from __future__ import annotations

import os

import lokid
from lokid.store import plancache


def test_the_key_covers_every_module_that_plans() -> None:
    """After issue 21 moved gather.py and probe.py out of the store, the key still named
    them there (files that do not exist, so an edited planner kept an old plan)."""
    files = plancache._planner_files()
    assert all(os.path.exists(f) for f in files), [f for f in files if not os.path.exists(f)]
    package = os.path.dirname(lokid.__file__)
    for module in ("planning/gather.py", "planning/endpoint.py", "host/probe.py",
                   "core/plan.py", "core/spec.py"):
        assert os.path.join(package, module) in files, module
