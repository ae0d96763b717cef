"""What a swap costs at the gateway before the preset swapped in was ever loaded
(lokid.gateway.groups.swap_cost): an estimate from the need the daemon announces in its
``Memory``, the rule's default only where that is unknown, and the measured load once
there is one."""

from __future__ import annotations

import pytest

from lokid.core.serve.swaps import DEFAULT_COST, PAUSE
from lokid.gateway.groups import swap_cost
from lokid.gateway.placer import need_of
from lokid.gateway.presets import Preset

MiB = 2**20


def test_a_small_preset_never_loaded_costs_its_estimate() -> None:
    cost, source = swap_cost(Preset("b", memory={"needs": {"host": 250 * MiB, "GPU0": 50 * MiB}}))
    assert cost == PAUSE and source == "not measured yet: estimated from its memory need, 300 MiB"


def test_a_need_on_chosen_gpus_counts_each_gpu() -> None:
    memory = {"needs": {"host": 0}, "per_gpu": 3 * 2**30, "gpu_count": 2}
    assert swap_cost(Preset("b", memory=memory))[0] == pytest.approx(3.0)


@pytest.mark.parametrize("memory", [{}, {"needs": {}}, {"needs": "?"}, {"needs": {"host": -1}}])
def test_an_unknown_need_costs_the_default(memory: dict[str, object]) -> None:
    assert swap_cost(Preset("b", memory=memory)) == (DEFAULT_COST, "not measured yet: the default")


def test_a_measured_load_wins() -> None:
    p = Preset("b", memory={"needs": {"host": 300 * MiB}})
    p.update({"Stats": {"load_seconds": 0.04}})
    assert swap_cost(p) == (0.04, "measured: its engine's last load")


def test_the_placer_weighs_an_unmeasured_load_as_a_groups_swap_does() -> None:
    """The placer's eviction rule (lokid.core.place.policy) reads a load's cost from the
    same figure: a small model never loaded is cheap to stop and start again, not 10 s."""
    p = Preset("b", memory={"needs": {"GPU0": 4 * 2**30}})
    need = need_of(p)
    assert need is not None and need.cost == pytest.approx(2.0) == swap_cost(p)[0]
    p.update({"Stats": {"load_seconds": 0.04}})
    need = need_of(p)
    assert need is not None and need.cost == 0.04
