"""A repeated benchmark (``--repeat N``): one result from N runs, with their median and spread.

Why: one run is one moment of the machine. The same preset measured twice back
to back once gave 16.7 then 161 tok/s, and a single stored number cannot tell a
noisy moment from the preset's speed. So the warm-up runs once, the measured
phases N times, and each figure of the report comes back as its median over
the runs, with the spread ``(max - min) / median`` (the rule of
``benchmarks/bench_vs_llama_bench.py``) and its range.

What the combined result holds:

- the top-level figures (prefill and decode: tokens, milliseconds, tok/s) are
  the medians of the runs, so what reads a stored result (automatic
  speculation, ``LastBench``) reads the median without knowing about runs;
- ``stats``: per figure, ``median``, ``spread``, ``low``, ``high``; ``runs``: each
  run's figures, in order; ``repeat``: N;
- draft acceptance summed over the runs; the depth phase's figures (cold
  prefill, prefill with the cache reused, decode at depth, cache reuse) as
  medians, its requests (``cold``, ``turns``) the first run's;
- a run whose depth phase came back partial makes the whole result partial
  (that run's depth; the protocol stops there and names the run): never kept.

With N = 1 the result is the run itself, as before; none of the keys above appear.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from .rules import Depth, Result, add_draft

MAX_REPEAT = 20


def _median(values: Sequence[float]) -> float:
    # statistics only when a result is summed up: `lokid run` and the unit's steps read
    # MAX_REPEAT when their parser is built, and pay no import for it
    import statistics

    return float(statistics.median(values))

# The report's figures per run, by the key they carry in ``stats`` and ``runs``.
FIGURES: dict[str, Callable[[Result], float | None]] = {
    "prompt_per_second": lambda r: r.prompt_per_second,
    "predicted_per_second": lambda r: r.predicted_per_second,
    "draft_rate": lambda r: r.draft.rate if r.draft is not None and r.draft.n else None,
    "depth_cold_per_second": lambda r: (r.depth.cold.prompt_per_second
                                        if r.depth is not None and r.depth.cold else None),
    "depth_cached_per_second": lambda r: r.depth.cached_per_second if r.depth else None,
    "depth_decode_per_second": lambda r: r.depth.decode_per_second if r.depth else None,
    "depth_reuse": lambda r: r.depth.reuse if r.depth else None,
}


def repeat_error(n: int) -> str:
    """Why ``n`` is no repeat count ("" when it is one)."""
    if isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= MAX_REPEAT:
        return ""
    return f"repeat: 1 to {MAX_REPEAT} runs"


def spread(values: Sequence[float]) -> float:
    """(max - min) / median: 0.1 when the runs span a tenth of their median."""
    mid = _median(values)
    return (max(values) - min(values)) / mid if mid else 0.0


def stat(values: Sequence[float]) -> dict[str, float]:
    return {"median": float(_median(values)), "spread": spread(values),
            "low": float(min(values)), "high": float(max(values))}


def figures(r: Result) -> dict[str, float]:
    """One run's figures (those the engine gave)."""
    out = {}
    for key, read in FIGURES.items():
        v = read(r)
        if v is not None:
            out[key] = float(v)
    return out


def combine(runs: Sequence[Result]) -> Result:
    """One result from the runs of one benchmark (the first run's settings: mode, KV,
    engine, slot). The runs are not kept apart from their figures."""
    if len(runs) == 1:
        return runs[0]
    first = runs[0]
    per_run = [figures(r) for r in runs]
    stats = {key: stat([f[key] for f in per_run]) for key in FIGURES
             if all(key in f for f in per_run)}

    def median(values: Sequence[float]) -> float:
        return float(_median(values))

    out = Result(mode=first.mode, kv=first.kv, kv_quantized=first.kv_quantized,
                 engine=first.engine, gpus=first.gpus, slot=first.slot, slots=first.slots,
                 slot_note=first.slot_note, shared=first.shared, elapsed=first.elapsed,
                 repeat=len(runs), stats=stats, runs=per_run)
    out.prompt_n = round(median([r.prompt_n for r in runs]))
    out.prompt_ms = median([r.prompt_ms for r in runs])
    out.prompt_per_second = median([r.prompt_per_second for r in runs])
    out.predicted_n = round(median([r.predicted_n for r in runs]))
    out.predicted_ms = median([r.predicted_ms for r in runs])
    out.predicted_per_second = median([r.predicted_per_second for r in runs])
    for r in runs:
        out.draft = add_draft(out.draft, r.draft)
    out.depth = _depth(runs, stats)
    return out


def _depth(runs: Sequence[Result], stats: dict[str, dict[str, float]]) -> Depth | None:
    depths = [r.depth for r in runs]
    if any(d is None for d in depths):
        return None
    for d in depths:
        if d is not None and d.partial:
            return d
    first = depths[0]
    assert first is not None
    for key, attr in (("depth_cached_per_second", "cached_per_second"),
                      ("depth_decode_per_second", "decode_per_second"),
                      ("depth_reuse", "reuse")):
        if key in stats:
            setattr(first, attr, stats[key]["median"])
    drafts = [d.draft for d in depths if d is not None]
    first.draft = None
    for draft in drafts:
        first.draft = add_draft(first.draft, draft)
    first.hint = next((d.hint for d in depths if d is not None and d.hint), "")
    first.reuse_note = next((d.reuse_note for d in depths if d is not None and d.reuse_note), "")
    return first
