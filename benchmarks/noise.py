"""One verdict for every benchmark: per-round values against a goal, said with the noise.

Why: on the 2-CPU machine, identical runs flipped their verdicts (issue 47: a cold start
+10 ms "met" then "not met", relay CPU 1.37x then 1.09x proxyd's, added latency 1.03 then
1.00 ms) because each script compared one median with the goal. A verdict that a rerun
can reverse is no verdict. The rules, each against that failure:

- The verdict is taken from the rounds (or blocks) one by one, never from one summary:
  ``met`` when every round meets the goal, ``not met`` when none does, ``within noise``
  when some do and some do not (the rounds' spread straddles the goal). A median that
  lands on either side of the goal by chance can no longer decide it.
- Each verdict says how many rounds would decide it: the fewest rounds ``N`` for which
  the 95 % interval of the rounds' mean, ``mean +- t(0.975, N - 1) * s / sqrt(N)`` (``s``
  the rounds' standard deviation, Student's t), lies wholly on one side of the goal,
  supposing further rounds keep this run's mean and spread. ``n/a`` when it never will as
  far as these rounds tell: fewer than two rounds (no spread), the mean on the goal, or
  more than :data:`MOST` rounds. Where the interval already clears the goal with the
  rounds run, the figure is at most their number; a "within noise" verdict with such a
  figure means single rounds cross the goal while their mean does not.
- Values are compared as given: a difference (lokid - router, per round) against an
  additive goal, a ratio (lokid / proxyd, per round) against a ratio goal. Rounds are
  paired by the caller (both sides measured in the same round, in a random order), so
  that the load of a moment moves both sides of one value.

Pure Python (no SciPy on the machines that run these): t's quantile from a table up to
30 degrees of freedom, and Hill's Cornish-Fisher expansion past it (within 0.001 there).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

MET, NOT_MET, WITHIN_NOISE = "met", "not met", "within noise"
MOST = 100_000   # rounds past which "rounds needed" is said n/a: no run will do them

# Student's t, two-sided 95 % (the 0.975 quantile), degrees of freedom 1..30
T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
        2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
        2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)
Z975 = 1.959964


def t975(df: int) -> float:
    """Student's t 0.975 quantile for ``df`` >= 1 degrees of freedom."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, not {df}")
    if df <= len(T975):
        return T975[df - 1]
    z = Z975
    g = ((z ** 3 + z) / 4, (5 * z ** 5 + 16 * z ** 3 + 3 * z) / 96,
         (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / 384,
         (79 * z ** 9 + 776 * z ** 7 + 1482 * z ** 5 - 1920 * z ** 3 - 945 * z) / 92160)
    return z + sum(gi / float(df) ** (i + 1) for i, gi in enumerate(g))


@dataclass(frozen=True)
class Judged:
    """What the rounds say about one goal."""

    verdict: str                 # MET, NOT_MET or WITHIN_NOISE
    rounds: int
    meeting: int                 # rounds that meet the goal
    low: float                   # the rounds' smallest and largest values
    high: float
    mean: float
    half: float | None           # the mean's 95 % interval's half width; None under 2 rounds
    needed: int | None           # rounds for that interval to clear the goal; None: n/a

    def text(self, fmt: str = ".2f", unit: str = "", what: str = "rounds") -> str:
        """``within noise (4 of 7 rounds meet it: +3 to +15 ms; mean +8.2, 95 % interval
        +6.0 to +10.4; rounds to decide: 19)``; ``what`` names the rounds (``blocks``)."""
        u = f" {unit}" if unit else ""
        interval = "" if self.half is None else (
            f", 95 % interval {self.mean - self.half:{fmt}} to {self.mean + self.half:{fmt}}")
        return (f"{self.verdict} ({self.meeting} of {self.rounds} {what} meet it: "
                f"{self.low:{fmt}} to {self.high:{fmt}}{u}; mean {self.mean:{fmt}}{interval}; "
                f"{what} to decide: {'n/a' if self.needed is None else self.needed})")


def verdict(values: Sequence[float], goal: float, at_most: bool = True) -> str:
    """``met`` when every value meets the goal (``<= goal`` when ``at_most``, else
    ``>= goal``), ``not met`` when none does, ``within noise`` otherwise."""
    if not values:
        raise ValueError("a verdict needs at least one round")
    ok = [v <= goal if at_most else v >= goal for v in values]
    return MET if all(ok) else NOT_MET if not any(ok) else WITHIN_NOISE


def rounds_needed(values: Sequence[float], goal: float) -> int | None:
    """The fewest rounds (>= 2) whose mean's 95 % interval would clear ``goal``, with
    this sample's mean and standard deviation; None where no number will (module
    docstring)."""
    if len(values) < 2:
        return None
    mean, s = statistics.fmean(values), statistics.stdev(values)
    gap = abs(mean - goal)
    if gap == 0:
        return None
    if s == 0:
        return 2
    # t shrinks as N grows, so the condition is monotone in N: a doubling then a bisection
    lo, hi = 1, 2
    while t975(hi - 1) * s / math.sqrt(hi) >= gap:
        lo, hi = hi, hi * 2
        if lo > MOST:
            return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if t975(mid - 1) * s / math.sqrt(mid) < gap:
            hi = mid
        else:
            lo = mid
    return hi if hi <= MOST else None


def judge(values: Sequence[float], goal: float, at_most: bool = True) -> Judged:
    """The verdict, the rounds' range, the mean's 95 % interval and the rounds needed."""
    values = list(values)
    said = verdict(values, goal, at_most)
    n = len(values)
    half = None if n < 2 else t975(n - 1) * statistics.stdev(values) / math.sqrt(n)
    meeting = sum(v <= goal if at_most else v >= goal for v in values)
    return Judged(said, n, meeting, min(values), max(values), statistics.fmean(values), half,
                  rounds_needed(values, goal))


def say(values: Sequence[float], goal: float, at_most: bool = True, fmt: str = ".2f",
        unit: str = "", what: str = "rounds") -> str:
    """``goal <= +10 ms: within noise (...)``: the goal and :meth:`Judged.text`."""
    u = f" {unit}" if unit else ""
    return (f"goal {'<=' if at_most else '>='} {goal:{fmt}}{u}: "
            + judge(values, goal, at_most).text(fmt, unit, what))


def blocks(values: Sequence[float], count: int) -> list[list[float]]:
    """``values`` cut into ``count`` consecutive blocks of equal size (the rest left out):
    per-request figures made into per-block ones, so that a verdict on a percentile has
    rounds to count."""
    size = len(values) // count
    if size < 1:
        raise ValueError(f"{len(values)} values cannot make {count} blocks")
    return [list(values[i * size:(i + 1) * size]) for i in range(count)]
