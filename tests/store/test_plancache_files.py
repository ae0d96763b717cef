"""The planner's own files in the reuse key: an edited planner plans afresh."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

import lokid
from lokid.core.launch.attempt import Mark
from lokid.core.launch.runtimeplan import RuntimePlan
from lokid.store import plancache


def test_the_key_covers_every_module_that_plans() -> None:
    """After issue 21 moved gather.py and probe.py out of the store, the key still named
    them there (files that do not exist, so an edited planner kept an old plan). Issue 49
    grouped the core by topic: the key walks its sub-packages, the plan's own included."""
    files = plancache._planner_files()
    assert all(os.path.exists(f) for f in files), [f for f in files if not os.path.exists(f)]
    package = os.path.dirname(lokid.__file__)
    for module in ("planning/gather.py", "planning/endpoint.py", "host/probe.py",
                   "core/launch/plan.py", "core/launch/spec.py", "core/config/files.py",
                   "core/errors.py", "core/launch"):
        assert os.path.join(package, module) in files, module


def _plan(**kw: Any) -> RuntimePlan:
    fields: dict[str, Any] = {"argv": ("llama-server", "-m", "m.gguf"), **kw}
    return RuntimePlan(preset="p", env={}, host="127.0.0.1", port=8080,
                       mark=Mark("f", "e", 1), **fields)


def test_a_kept_plans_head_reads_without_json(tmp_path: Path) -> None:
    """The head (key, settled alone, socket, paths) is plain text: paths with a newline or
    bytes that are not UTF-8 come back as they were, and the key still matches."""
    run, files = str(tmp_path / "run"), tmp_path / "files"
    os.makedirs(run)
    files.mkdir()
    odd = [str(files / "a\nb"), os.fsdecode(bytes(files / "c") + b"\xff"), str(files)]
    for p in odd[:2]:
        Path(p).write_text("x")
    later = time.time_ns() + 10**10   # planned after the files' last change: kept
    plan = _plan(socket="/run/loki/p.sock")
    assert plancache.record(run, "p", odd, {}, plan, "", later)
    kept = plancache.kept(run, "p")
    assert kept is not None and kept.paths == odd and kept.socket == "/run/loki/p.sock"
    assert kept.settled_alone and plancache.unchanged(kept, "p", {})
    assert plancache.reusable(run, "p", {}) == (plan.to_json(), "")
    Path(odd[0]).write_text("changed")
    assert not plancache.unchanged(kept, "p", {})
    assert plancache.reusable(run, "p", {}) is None


@pytest.mark.parametrize(("plan", "verdict"), [
    (_plan(spec_mode="on"), ""), (_plan(auto=True), ""), (_plan(), "layers in RAM"),
    (_plan(gpu_choice=0), ""), (_plan(argv=("llama-server", "--rpc", "h:50052")), ""),
    (_plan(argv=("llama-server", "--rpc=h:50052")), ""),
])
def test_a_plan_with_anything_to_settle_at_start_is_not_settled_alone(
        tmp_path: Path, plan: RuntimePlan, verdict: str) -> None:
    assert plancache.record(str(tmp_path), "p", [], {}, plan, verdict, time.time_ns() + 10**10)
    kept = plancache.kept(str(tmp_path), "p")
    assert kept is not None and not kept.settled_alone


@pytest.mark.parametrize("text", ["", "lokid-reuse 2", "lokid-reuse 2\0k\0" "1\0",
                                  '{"format": 1, "key": "k", "paths": []}',
                                  "lokid-reuse 3\0k\0" "1\0\0{}"])
def test_a_damaged_or_foreign_record_is_none(tmp_path: Path, text: str) -> None:
    Path(tmp_path, "p.reuse").write_text(text)
    assert plancache.kept(str(tmp_path), "p") is None
    assert plancache.reusable(str(tmp_path), "p", {}) is None
