"""Judging lokid's benchmark against llama-bench: same settings, medians, spreads, verdict.

The helper of ``benchmarks/bench_vs_llama_bench.py``, kept apart so its rules are
tested (tests/bench/test_llamabench.py) without timing anything.

- The settings each side really ran: llama-server's from its own log (the
  ``llama_context:``, ``llama_kv_cache:`` and ``system_info:`` lines, printed at
  log verbosity 4), llama-bench's from its JSON row. Two runs with different
  flash attention, batch, micro-batch, KV types or threads measure different
  things, so any difference, or a setting the log does not show, means no verdict.
- A side's figure is the median of its rounds; its spread is
  ``(max - min) / median``. A spread wider than the tolerance means the machine
  changed under the rounds: the ratio of the medians says nothing then, so the
  verdict is "too noisy to judge", never "outside".
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

WITHIN, OUTSIDE, CANNOT_JUDGE = 0, 1, 2   # the benchmark's exit statuses

# llama-bench's JSON says flash_attn -1/0/1 for its -fa auto/off/on
_BENCH_FA = {-1: "auto", 0: "off", 1: "on"}
_SERVER_FA = {"enabled": "on", "disabled": "off", "auto": "auto"}


@dataclass(frozen=True)
class Settings:
    """What decides the speed of a run besides the model and the machine; None or ""
    where the source did not say."""

    flash_attn: str = ""          # on, off, auto (unresolved)
    n_batch: int | None = None
    n_ubatch: int | None = None
    type_k: str = ""
    type_v: str = ""
    n_threads: int | None = None
    n_threads_batch: int | None = None

    def bench_args(self) -> list[str]:
        """llama-bench's flags for these settings (it has one thread count for both)."""
        args: list[str] = []
        for flag, value in (("-fa", self.flash_attn), ("-b", self.n_batch),
                            ("-ub", self.n_ubatch), ("-ctk", self.type_k),
                            ("-ctv", self.type_v), ("-t", self.n_threads)):
            if value not in (None, ""):
                args += [flag, str(value)]
        return args


def _last(pattern: str, log: str) -> re.Match[str] | None:
    # The last match: the engine may build a context once to fit memory, then for real.
    found = list(re.finditer(pattern, log, re.MULTILINE))
    return found[-1] if found else None


def server_settings(log: str) -> Settings:
    """llama-server's effective settings from its log (verbosity 4 or more), e.g.::

        llama_context: n_batch               = 2048
        llama_context: n_ubatch              = 512
        llama_context: flash_attn            = auto
        llama_kv_cache: size =   72.00 MiB (...), K (f16):   36.00 MiB, V (f16):   36.00 MiB
        resolve_fused_ops: Flash Attention enabled
        system_info: n_threads = 2 (n_threads_batch = 2) / 2 | CPU : ...
    """
    def number(name: str) -> int | None:
        m = _last(rf"llama_context: {name}\s+= (\d+)\s*$", log)
        return int(m.group(1)) if m else None

    fa = ""
    m = _last(r"llama_context: flash_attn\s+= (\w+)", log)
    if m:
        fa = _SERVER_FA.get(m.group(1), m.group(1))
    if fa == "auto":   # resolved once the graph is reserved
        r = _last(r"Flash Attention (enabled|disabled)", log)
        fa = _SERVER_FA[r.group(1)] if r else fa
    kv = _last(r"llama_kv_cache: size = .*K \((\w+)\):.*V \((\w+)\):", log)
    threads = _last(r"system_info: n_threads = (\d+) \(n_threads_batch = (\d+)\)", log)
    return Settings(flash_attn=fa, n_batch=number("n_batch"), n_ubatch=number("n_ubatch"),
                    type_k=kv.group(1) if kv else "", type_v=kv.group(2) if kv else "",
                    n_threads=int(threads.group(1)) if threads else None,
                    n_threads_batch=int(threads.group(2)) if threads else None)


def bench_settings(row: Mapping[str, Any]) -> Settings:
    """llama-bench's settings from one row of its ``-o json`` output."""
    threads = row.get("n_threads")
    return Settings(flash_attn=_BENCH_FA.get(row.get("flash_attn", -2), ""),
                    n_batch=row.get("n_batch"), n_ubatch=row.get("n_ubatch"),
                    type_k=row.get("type_k", ""), type_v=row.get("type_v", ""),
                    n_threads=threads, n_threads_batch=threads)


def differences(lokid: Settings, bench: Settings) -> list[str]:
    """One line per setting that differs or that a side did not report."""
    out = []
    for f in fields(Settings):
        a, b = getattr(lokid, f.name), getattr(bench, f.name)
        if a in (None, "") or b in (None, ""):
            out.append(f"{f.name}: lokid {_show(a)}, llama-bench {_show(b)} "
                       "(not reported: the engine's log needs verbosity 4)")
        elif a != b:
            out.append(f"{f.name}: lokid {a}, llama-bench {b}")
    return out


def settings_table(lokid: Settings, benches: Sequence[Settings]) -> list[str]:
    """Both sides' settings, one line each; llama-bench's as its runs reported them."""
    lines = [f"  {'setting':<16}{'lokid (engine log)':<22}llama-bench (JSON)"]
    for f in fields(Settings):
        seen = sorted({_show(getattr(b, f.name)) for b in benches})
        lines.append(f"  {f.name:<16}{_show(getattr(lokid, f.name)):<22}{'/'.join(seen)}")
    return lines


def _show(value: object) -> str:
    return "?" if value in (None, "") else str(value)


def spread(samples: Sequence[float]) -> float:
    """(max - min) / median: 0.1 when the rounds span a tenth of their median."""
    mid = statistics.median(samples)
    return (max(samples) - min(samples)) / mid if mid > 0 else float("inf")


@dataclass(frozen=True)
class Figure:
    """One figure (prefill or decode) of both sides, a sample per round, in tok/s."""

    name: str
    lokid: Sequence[float]
    bench: Sequence[float]

    def ratio(self) -> float:
        """lokid's median over llama-bench's."""
        return statistics.median(self.lokid) / statistics.median(self.bench)

    def line(self) -> str:
        def side(xs: Sequence[float]) -> str:
            rounds = " ".join(f"{x:.1f}" for x in xs)
            return f"{statistics.median(xs):8.1f} tok/s (rounds {rounds}; spread {spread(xs):.1%})"
        return (f"{self.name:<8} lokid {side(self.lokid)}\n{'':<8} llama-bench "
                f"{side(self.bench)}\n{'':<8} ratio of the medians {self.ratio():.2f}")


def verdict(figures: Sequence[Figure], differ: Sequence[str],
            tolerance: float) -> tuple[list[str], int]:
    """The verdict's lines and the exit status: CANNOT_JUDGE when the settings differ, a
    side has a single round (no spread to know the machine by) or a spread wider than
    ``tolerance``; else WITHIN or OUTSIDE by the ratios."""
    if differ:
        return (["cannot judge: the two sides did not run the same settings:",
                 *(f"  {d}" for d in differ)], CANNOT_JUDGE)
    if any(min(len(f.lokid), len(f.bench)) < 2 for f in figures):
        return (["cannot judge: one round shows no spread (--rounds 2 or more)"],
                CANNOT_JUDGE)
    noisy = [f"  {f.name} of {who}: spread {spread(xs):.1%} > {tolerance:.0%}"
             for f in figures for who, xs in (("lokid", f.lokid), ("llama-bench", f.bench))
             if spread(xs) > tolerance]
    if noisy:
        return (["too noisy to judge: the machine's load changed under the rounds; "
                 "no verdict", *noisy], CANNOT_JUDGE)
    ok = all(abs(f.ratio() - 1) <= tolerance for f in figures)
    ratios = ", ".join(f"{f.name} {f.ratio():.2f}" for f in figures)
    return ([f"{'within' if ok else 'outside'} {tolerance:.0%} of llama-bench ({ratios})"],
            WITHIN if ok else OUTSIDE)
