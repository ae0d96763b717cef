"""benchmarks/noise.py: the verdict every benchmark prints, table-tested (no timing).

A verdict decided by one median flipped between identical runs (issue 47); these tests
hold the rules that replace it: met / not met / within noise from the rounds one by one,
and the rounds a verdict needs, checked against a count done the slow way.
"""

from __future__ import annotations

import importlib.util
import math
import statistics
import sys
from collections.abc import Iterator
from types import ModuleType

import pytest
from support import REPO


@pytest.fixture(scope="module")
def noise() -> Iterator[ModuleType]:
    spec = importlib.util.spec_from_file_location("noise", REPO / "benchmarks" / "noise.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["noise"] = module   # its dataclass looks its module up
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop("noise", None)


@pytest.mark.parametrize(("values", "goal", "at_most", "said"), [
    ([3.0, 7.0, 9.9], 10.0, True, "met"),
    ([3.0, 10.0], 10.0, True, "met"),                  # on the goal meets it
    ([11.0, 14.0], 10.0, True, "not met"),
    ([7.0, 12.0, 9.0], 10.0, True, "within noise"),    # cold start +10 ms, issue 47
    ([1.37, 1.09], 1.3, True, "within noise"),         # relay CPU x proxyd's, issue 47
    ([0.98, 0.99], 0.97, False, "met"),                # a share: at least the goal
    ([0.90, 0.96], 0.97, False, "not met"),
    ([0.90, 0.98], 0.97, False, "within noise"),
])
def test_verdict(noise: ModuleType, values: list[float], goal: float, at_most: bool,
                 said: str) -> None:
    assert noise.verdict(values, goal, at_most) == said
    assert noise.judge(values, goal, at_most).verdict == said


def test_no_rounds_no_verdict(noise: ModuleType) -> None:
    with pytest.raises(ValueError):
        noise.verdict([], 1.0)


def test_t_quantiles(noise: ModuleType) -> None:
    """The table's known values, and the expansion past it joins the table at 30 and
    falls towards the normal quantile."""
    assert noise.t975(1) == 12.706
    assert noise.t975(10) == 2.228
    assert noise.t975(30) == 2.042
    assert abs(noise.t975(31) - 2.040) < 0.001
    assert abs(noise.t975(60) - 2.000) < 0.001
    assert abs(noise.t975(120) - 1.980) < 0.001
    assert 1.96 < noise.t975(10_000) < 1.961
    with pytest.raises(ValueError):
        noise.t975(0)


def slow_needed(noise: ModuleType, values: list[float], goal: float) -> int | None:
    mean, s = statistics.fmean(values), statistics.stdev(values)
    for n in range(2, 20_000):
        if noise.t975(n - 1) * s / math.sqrt(n) < abs(mean - goal):
            return n
    return None


@pytest.mark.parametrize(("values", "goal"), [
    ([7.0, 12.0, 9.0, 8.0, 11.0], 10.0),
    ([7.0, 12.0, 9.0, 8.0, 11.0], 0.0),
    ([1.37, 1.09, 1.21], 1.3),
    ([0.5, 0.52, 0.49, 0.51], 1.0),
    ([9.9, 10.2, 9.8, 10.05, 10.1, 10.15], 10.0),   # ~80 rounds
])
def test_rounds_needed_matches_the_count(noise: ModuleType, values: list[float],
                                         goal: float) -> None:
    got = noise.rounds_needed(values, goal)
    assert got == slow_needed(noise, values, goal)
    assert got is not None
    # at that number the interval clears the goal, one round fewer it does not
    mean, s = statistics.fmean(values), statistics.stdev(values)
    assert noise.t975(got - 1) * s / math.sqrt(got) < abs(mean - goal)
    if got > 2:
        assert noise.t975(got - 2) * s / math.sqrt(got - 1) >= abs(mean - goal)


def test_rounds_needed_na(noise: ModuleType) -> None:
    assert noise.rounds_needed([5.0], 1.0) is None             # no spread to go by
    assert noise.rounds_needed([9.0, 11.0], 10.0) is None      # the mean on the goal
    assert noise.rounds_needed([4.0, 4.0, 4.0], 5.0) == 2      # no spread: any two rounds
    # a mean a hair off the goal in a wide spread: more rounds than any run makes
    assert noise.rounds_needed([0.0, 20.0, 10.0001], 10.0) is None


def test_rounds_needed_at_most_what_was_run_when_the_interval_clears(noise: ModuleType
                                                                     ) -> None:
    values = [0.5, 0.6, 0.55, 0.45, 0.52, 0.58, 0.47, 1.1]   # one round over the goal
    judged = noise.judge(values, 1.0)
    assert judged.verdict == "within noise"
    assert judged.half is not None and judged.mean + judged.half < 1.0
    assert judged.needed is not None and judged.needed <= len(values)


def test_text_says_everything(noise: ModuleType) -> None:
    line = noise.say([7.0, 12.0, 9.0], 10.0, True, "+.1f", "ms")
    assert line.startswith("goal <= +10.0 ms: within noise (2 of 3 rounds meet it: "
                           "+7.0 to +12.0 ms; mean +9.3, 95 % interval ")
    assert line.endswith(f"rounds to decide: {noise.rounds_needed([7.0, 12.0, 9.0], 10.0)})")
    one = noise.say([12.0], 10.0, True, ".0f")
    assert "interval" not in one and one.endswith("rounds to decide: n/a)")


def test_blocks(noise: ModuleType) -> None:
    assert noise.blocks(list(range(10)), 3) == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    with pytest.raises(ValueError):
        noise.blocks([1.0, 2.0], 3)
