"""A repeated benchmark's one result (lokid.core.bench.repeat): medians, spreads, bounds,
and a single run left exactly as it was."""

from __future__ import annotations

from lokid.core.bench import repeat as benchrepeat
from lokid.core.bench import rules as benchrules
from lokid.core.bench.rules import Depth, Draft, Result, Turn


def run(prefill: float, decode: float, depth: Depth | None = None,
        draft: Draft | None = None) -> Result:
    return Result(mode="full" if depth else "quick", prompt_n=1000, prompt_ms=1e6 / prefill,
                  prompt_per_second=prefill, predicted_n=300, predicted_ms=3e5 / decode,
                  predicted_per_second=decode, engine="b11434", draft=draft, depth=depth,
                  slot=1, slots=2, slot_note="ran in slot 1 of 2")


def deep(cold: float, cached: float, decode: float, reuse: float, partial: str = "") -> Depth:
    return Depth(ctx=16384, target=7648, cold=Turn(7600, 1.0, cold, 0, 0.0, 0.0),
                 cached_per_second=cached, decode_per_second=decode, reuse=reuse,
                 partial=partial, draft=Draft(10, 5))


def test_repeat_bounds() -> None:
    assert benchrepeat.repeat_error(1) == "" and benchrepeat.repeat_error(20) == ""
    for bad in (0, 21, -1, True):
        assert benchrepeat.repeat_error(bad) == "repeat: 1 to 20 runs"


def test_one_run_is_the_run_itself_and_its_json_unchanged() -> None:
    r = run(100.0, 20.0)
    assert benchrepeat.combine([r]) is r
    data = r.to_json()
    assert not {"repeat", "stats", "runs"} & set(data)
    assert benchrules.report(r)[0] == "  Prefill      100.0 tok/s   (1000 tokens in 10.00 s)"


def test_three_runs_give_medians_spreads_and_each_run() -> None:
    runs = [run(16.7, 10.0, draft=Draft(100, 50)), run(161.0, 12.0, draft=Draft(100, 70)),
            run(150.0, 11.0)]
    r = benchrepeat.combine(runs)
    assert r.repeat == 3 and r.prompt_per_second == 150.0 and r.predicted_per_second == 11.0
    s = r.stats
    assert s is not None
    assert s["prompt_per_second"] == {"median": 150.0, "spread": (161.0 - 16.7) / 150.0,
                                      "low": 16.7, "high": 161.0}
    assert "draft_rate" not in s  # the third run drafted nothing: no median of two
    assert r.draft == Draft(200, 120) and r.slot == 1 and r.slot_note == "ran in slot 1 of 2"
    assert r.runs is not None and [x["prompt_per_second"] for x in r.runs] == [16.7, 161.0, 150.0]
    data = r.to_json()
    assert data["repeat"] == 3 and data["stats"]["predicted_per_second"]["median"] == 11.0
    back = benchrules.result_from_json(data)
    assert back.stats == s and back.runs == r.runs and back.repeat == 3
    lines = benchrules.report(r)
    assert lines[0] == ("  Prefill      150.0 tok/s   (1000 tokens in 6.67 s)   [median of 3: "
                        "spread 96.2 %, 16.7 to 161.0]")
    assert lines[1].endswith("[median of 3: spread 18.2 %, 10.0 to 12.0]")


def test_the_depth_figures_are_medians_and_a_partial_run_makes_it_partial() -> None:
    runs = [run(100, 20, deep(900, 300, 18, 0.99)), run(110, 21, deep(1000, 200, 19, 0.98)),
            run(120, 22, deep(800, 250, 17, 0.97))]
    r = benchrepeat.combine(runs)
    d = r.depth
    assert d is not None and not d.partial and r.savable
    assert (d.cached_per_second, d.decode_per_second, d.reuse) == (250, 18, 0.98)
    assert d.draft == Draft(30, 15)
    text = "\n".join(benchrules.report(r))
    assert "  Prefill@D    900.0 tok/s   (7600 tokens, cold)   [median of 3: spread 22.2 %" in text
    assert "  Cache reuse 98 %   [median of 3: spread 2.0 %, 97 to 99 %]" in text
    r = benchrepeat.combine([run(100, 20, deep(900, 300, 18, 0.99)),
                             run(110, 21, deep(1000, 200, 19, 0.98, "run 2/3: turn 2 "
                                                                   "interrupted after 1 s"))])
    assert r.depth is not None and r.depth.partial.startswith("run 2/3:") and not r.savable
    assert "the result is partial (run 2/3: turn 2" in benchrules.not_saved_reason(r)
