"""lokid.core.launch.runtimeplan: one typed value, its JSON form, and what a damaged file says."""

from __future__ import annotations

import json

import pytest

from lokid.core.launch.attempt import Mark
from lokid.core.launch.plan import Plan, SpecSummary
from lokid.core.launch.runtimeplan import SCHEMA, RuntimePlan

PLAN = Plan(preset="p", argv=("llama-server", "-m", "/m/a.gguf", "--port", "8080"),
            env={"CUDA_VISIBLE_DEVICES": "0"}, notes=("a note",),
            spec=SpecSummary("auto", ("draft-mtp",), True), host="127.0.0.1", port=8080)
MARK = Mark("fp", "/usr/bin/llama-server", 11434)


def test_of_a_plan_and_back_through_json() -> None:
    rp = RuntimePlan.of(PLAN, MARK, "inv-1")
    assert (rp.argv, rp.env, rp.host, rp.port) == (PLAN.argv, dict(PLAN.env), "127.0.0.1", 8080)
    assert (rp.spec_types, rp.auto, rp.mark, rp.invocation) == (("draft-mtp",), True, MARK,
                                                                "inv-1")
    assert RuntimePlan.from_json(json.loads(json.dumps(rp.to_json()))) == rp
    with pytest.raises(AttributeError):
        rp.port = 1  # type: ignore[misc]  # frozen


def test_the_json_is_lokid_plan_json_plus_the_start() -> None:
    data = RuntimePlan.of(PLAN, MARK, "inv-1").to_json()
    assert {k: data[k] for k in PLAN.to_json()} == PLAN.to_json()
    assert data["schema"] == SCHEMA and data["mark"]["build"] == 11434


def test_a_file_from_before_the_schema_key_is_read() -> None:
    """An engine started by the previous release: the same layout, no "schema"."""
    data = RuntimePlan.of(PLAN, MARK).to_json()
    del data["schema"]
    assert RuntimePlan.from_json(data).argv == PLAN.argv


@pytest.mark.parametrize(("change", "says"), [
    ({"schema": SCHEMA + 1}, "this lokid reads schema"),
    ({"port": "8080"}, "'port' is not a int"),
    ({"port": True}, "'port' is not a int"),
    ({"argv": ["a", 1]}, "'argv' holds a non-string"),
    ({"env": {"A": 1}}, "'env' holds a non-string"),
    ({"mark": {"fingerprint": "fp", "engine": "e"}}, "no 'build'"),
    ({"spec": None}, "'spec' is not a dict"),
])
def test_a_damaged_plan_is_a_value_error_saying_what(change: dict[str, object],
                                                     says: str) -> None:
    data = {**RuntimePlan.of(PLAN, MARK).to_json(), **change}
    with pytest.raises(ValueError, match=says):
        RuntimePlan.from_json(data)
    with pytest.raises(ValueError, match="not a JSON object"):
        RuntimePlan.from_json([data])


def test_a_chosen_start_keeps_its_choice_and_claim() -> None:
    from lokid.core.record import replace

    rp = replace(RuntimePlan.of(replace(PLAN, gpu_choice=0), MARK), claim={"GPU1": 5 << 30})
    data = json.loads(json.dumps(rp.to_json()))
    assert (data["gpu_choice"], data["claim"]) == (0, {"GPU1": 5 << 30})
    assert RuntimePlan.from_json(data) == rp
    # a plan written before the keys existed reads as no choice
    old = RuntimePlan.of(PLAN, MARK).to_json()
    assert "gpu_choice" not in old and "claim" not in old
    assert RuntimePlan.from_json(old).gpu_choice is None
    with pytest.raises(ValueError, match="'claim' holds a non-integer"):
        RuntimePlan.from_json({**data, "claim": {"GPU1": "5G"}})
