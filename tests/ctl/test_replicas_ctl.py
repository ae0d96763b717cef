"""lokictl's view of a preset's replicas (issue 47): top's line per running replica below
its preset's, status's line per preset running several engines (the rows as the daemon's
Replicas property gives them, read through lokid.ctl.stats.row)."""

from __future__ import annotations

from typing import Any

from lokid.ctl import stats
from lokid.ctl.replicas import replica_lines


def replica(k: int, state: str, port: int, in_flight: int = 0) -> dict[str, Any]:
    return {"index": k, "instance": "r" if k == 1 else f"r:{k}",
            "unit": f"loki-engine@{'r' if k == 1 else f'r:{k}'}.service", "state": state,
            "status": "", "port": port, "url": f"http://127.0.0.1:{port}",
            "in_flight": in_flight}


ROWS = [replica(1, "ready", 8000), replica(2, "ready", 8001, 2), replica(3, "inactive", 8002)]


def test_top_shows_each_running_replica_below_its_preset() -> None:
    row = stats.row({"Name": "r", "State": "ready", "Model": "m.gguf", "Replicas": ROWS})
    assert [r["instance"] for r in row["replicas"]] == ["r:2", "r:3"]
    lines = stats.table([row]).splitlines()
    assert lines[1].startswith("r ")
    assert lines[2].split()[:3] == ["r:2", "ready", "http://127.0.0.1:8001"]
    assert lines[2].endswith("2 in flight")
    assert len(lines) == 3   # the inactive replica 3 has no line
    # a daemon without replicas: no Replicas property, no line
    assert stats.table([stats.row({"Name": "r", "State": "ready"})]).count("\n") == 1


def test_status_names_the_engines_of_a_preset_running_several() -> None:
    assert replica_lines({"r": ROWS}) == ["replicas of r: 1 ready :8000, 2 ready :8001"]
    assert replica_lines({}) == []


def test_a_preset_running_one_engine_has_no_replica_line() -> None:
    assert replica_lines({"r": [replica(1, "ready", 8000), replica(2, "inactive", 8001)]}) == []
