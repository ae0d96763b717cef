"""lokid.core.record: frozen records as ``@dataclass(frozen=True)`` makes them, without
the dataclasses module; and what a start imports before its engine is spawned."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lokid.core.launch.attempt import Mark
from lokid.core.launch.runtimeplan import RuntimePlan
from lokid.core.record import FrozenError, field, record, replace

ROOT = Path(__file__).resolve().parents[2]


@record
class Point:
    x: int
    y: int = 0
    tags: list[str] = field(default_factory=list)
    seen: int = field(default=0, compare=False)


@dataclasses.dataclass(frozen=True)
class Twin:
    x: int
    y: int = 0
    tags: list[str] = dataclasses.field(default_factory=list)
    seen: int = dataclasses.field(default=0, compare=False)


def test_a_record_is_built_compared_and_shown_as_a_frozen_dataclass_is() -> None:
    for make in (Point, Twin):
        a = make(1, y=2)
        assert (a.x, a.y, a.tags, a.seen) == (1, 2, [], 0)
        assert make(1, 2, seen=5) == make(1, 2, seen=9)   # compare=False
        assert make(1, 2) != make(1, 3)
        with pytest.raises(TypeError, match="unhashable"):   # a list among the fields
            hash(make(1))
        assert make(1).tags is not make(1).tags           # a factory per instance
    assert hash(Mark("f", "/e", 1)) == hash(Mark("f", "/e", 1))
    assert len({Mark("f", "/e", 1), Mark("f", "/e", 1), Mark("f", "/e", 2)}) == 2
    assert repr(Point(1, 2)) == "Point(x=1, y=2, tags=[], seen=0)"
    assert Point(1) != Twin(1) and Point(1) != (1, 0, [], 0)
    assert Point.__match_args__ == ("x", "y", "tags", "seen")   # type: ignore[attr-defined]
    match Point(4, 5):
        case Point(x, y):
            assert (x, y) == (4, 5)


def test_a_record_refuses_what_a_frozen_dataclass_refuses() -> None:
    p = Point(1)
    with pytest.raises(FrozenError):
        p.x = 2   # type: ignore[misc]
    with pytest.raises(AttributeError):
        del p.y   # type: ignore[misc]
    with pytest.raises(TypeError, match="missing 'x'"):
        Point()   # type: ignore[call-arg]
    with pytest.raises(TypeError, match="two values for 'x'"):
        Point(1, x=2)   # type: ignore[misc]
    with pytest.raises(TypeError, match="unexpected 'z'"):
        Point(1, z=3)   # type: ignore[call-arg]
    with pytest.raises(TypeError, match="takes 4 arguments"):
        Point(1, 2, [], 3, 4)   # type: ignore[call-arg]
    with pytest.raises(TypeError, match="without a default follows"):
        @record
        class Bad:
            a: int = 0
            b: int   # type: ignore[misc]


def test_replace_copies_a_record_with_changes_and_is_dataclasses_replace_otherwise() -> None:
    p = Point(1, 2, ["a"])
    q = replace(p, y=7)
    assert (q, p) == (Point(1, 7, ["a"]), Point(1, 2, ["a"]))
    with pytest.raises(TypeError, match="no field z"):
        replace(p, z=1)
    assert replace(Twin(1), y=3) == Twin(1, 3)
    mark = Mark("f", "/e", 1)
    rp = RuntimePlan("p", ("/e", "-m", "x"), {}, "127.0.0.1", 8080, mark)
    assert replace(rp, pid=4).pid == 4 and replace(rp, pid=4).mark is mark
    assert RuntimePlan.from_json(json.loads(json.dumps(rp.to_json()))) == rp


START_PATH = ("lokid.cli", "lokid.unit.steps", "lokid.unit.supervisor", "lokid.store.state",
              "lokid.store.plancache", "lokid.store.handoff", "lokid.core.launch.runtimeplan",
              "lokid.planning.endpoint", "lokid.core.launch.crashloop",
              "lokid.core.launch.portunit")


def test_a_start_spawns_its_engine_without_the_heavy_imports() -> None:
    """What ``lokid engine`` and ``lokid prestart`` import before the engine runs (the
    modules of their reuse and hand-over paths) leaves out the modules that cost most
    and are not needed there: each would be paid on every start (issue 31)."""
    code = (f"import sys\nfor m in {START_PATH!r}: __import__(m)\n"
            "print(' '.join(sorted(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env={**os.environ, "PYTHONPATH": str(ROOT)}).stdout
    loaded = set(out.split())
    assert "lokid.unit.steps" in loaded   # the premise: they were imported
    heavy = {"dataclasses", "inspect", "ast", "typing", "tomllib", "argparse", "asyncio",
             "lokid.core.fleet.rpc", "shlex", "encodings.idna"}
    assert not heavy & loaded, sorted(heavy & loaded)
