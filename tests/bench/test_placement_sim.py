"""benchmarks/placement_sim.py: what must hold whatever its figures.

lokid's rule (lokid.core.place.policy) never starts what does not fit and never cuts a
request on a short trace, and serves every request; the peers' out-of-memory starts are
counted where their rule overflows a GPU (crafted traces, one 80 GiB GPU); llama-swap's
swap group swaps at each change of model, and its matrix holds the requests behind an
eviction until the drain it waits for is over (benchmarks/placement_peers.py). No timing.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest
from support import REPO


@pytest.fixture(scope="module")
def sim() -> Iterator[ModuleType]:
    path = REPO / "benchmarks" / "placement_sim.py"
    spec = importlib.util.spec_from_file_location("placement_sim", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["placement_sim"] = module   # its dataclasses look their module up
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules["placement_sim"]


def two(sim: ModuleType, a_gib: float, b_gib: float) -> Any:
    """Presets a and b of these footprints (the simulator's Preset per name)."""
    return sim.presets_of((("a", a_gib), ("b", b_gib)))


def test_lokid_serves_every_request_without_an_oom_start_or_a_cut(sim: ModuleType) -> None:
    trace = sim.make_trace(500, 1, 1.5)
    assert len(trace) == 500
    r = sim.simulate("lokid", trace, 1)
    assert (r.oom_starts, r.failed, r.unserved) == (0, 0, 0)
    assert len(r.waits) == 500 and min(r.waits) >= 0
    assert r.cold_starts >= len({a.preset for a in trace})   # each preset loads once at least


def test_every_rule_accounts_for_every_request(sim: ModuleType) -> None:
    trace = sim.make_trace(500, 1, 1.5)
    for rule in sim.RULES:
        r = sim.simulate(rule, trace, 1)
        assert len(r.waits) + r.failed + r.unserved >= 500, rule
        assert r.unserved == 0, rule


def test_the_router_with_models_max_2_overflows_a_gpu_and_it_is_counted(
        sim: ModuleType) -> None:
    # two 70 GiB presets, one 80 GiB GPU: b is loaded beside a (the count allows two)
    trace = [sim.Arrival(0.0, "a", 2.0), sim.Arrival(40.0, "b", 2.0)]
    r = sim.simulate("router --models-max 2", trace, 1, two(sim, 70, 70), ("GPU0",))
    # each retry finds a still loaded (the count is not reached): b's client gives up
    assert (r.oom_starts, r.failed, r.cold_starts) == (sim.MAX_TRIES, 1, 1)
    lokid = sim.simulate("lokid", trace, 1, two(sim, 70, 70), ("GPU0",))
    assert (lokid.oom_starts, lokid.failed, lokid.cold_starts, len(lokid.waits)) == (0, 0, 2, 2)


def test_an_ollama_under_estimate_that_does_not_fit_is_an_oom_start(sim: ModuleType) -> None:
    host = sim.Host(two(sim, 40, 45), ("GPU0",))
    rule = sim.OllamaStyle(host, {"a": 1.0, "b": 0.8})   # 36 GiB believed, beside a's 40
    host.run([sim.Arrival(0.0, "a", 60.0), sim.Arrival(20.0, "b", 2.0)], rule)
    r = host.result("Ollama-style", 2)
    assert r.oom_starts >= 1
    assert len(r.waits) + r.failed == 2


def test_llama_swap_s_swap_group_swaps_on_each_change_of_model(sim: ModuleType) -> None:
    trace = [sim.Arrival(0.0, "a", 1.0), sim.Arrival(0.1, "b", 1.0),
             sim.Arrival(0.2, "a", 1.0)]
    r = sim.simulate("llama-swap groups", trace, 1, two(sim, 4, 4))
    assert (r.cold_starts, r.stops, r.oom_starts, len(r.waits)) == (3, 2, 0, 3)


def test_llama_swap_s_matrix_holds_every_request_behind_an_eviction(sim: ModuleType) -> None:
    # a and b never fit together; c fits beside either; all on one 80 GiB GPU
    presets = sim.presets_of((("a", 50), ("b", 50), ("c", 10)))
    trace = [sim.Arrival(0.0, "a", 100.0), sim.Arrival(1.0, "c", 1.0),
             sim.Arrival(30.0, "b", 1.0), sim.Arrival(40.0, "c", 1.0)]
    a_ends = presets["a"].load + 100.0
    for rule in ("llama-swap matrix", "llama-swap matrix (evicted)"):
        r = sim.simulate(rule, trace, 1, presets, ("GPU0",))
        assert (r.oom_starts, r.failed, len(r.waits)) == (0, 0, 4), rule
        # c is loaded and idle at 40 s, yet its second request waits behind b's eviction,
        # which waits for a's request to end (c's first one waited for its load only)
        assert min(r.waits) == presets["c"].load, rule
        assert sum(w >= a_ends - 40.0 for w in r.waits) == 2, rule   # b's and c's second
