"""The benchmark's rules, pure: protocol version 2 of Loki's ``llm_bench``, without the I/O.

What :mod:`lokid.bench.protocol` sends and reads is decided here: the sizes of each
phase, how deep the full mode goes, how corpora are cut into never-repeating
pieces, how cache reuse and draft acceptance are read from the engine's
counters (never assumed), when a result is partial or measured a start
that is no longer the preset's (shown, not saved), the thrash hint, and the
fingerprint that ties a saved result to the configuration it measured.

Honesty rules carried from the seed: a missing counter stays ``None``
("n/a"), nothing is estimated in its place, and two protocol versions never
compare (the version is part of the fingerprint).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from ..config.files import EFFORT_LEVELS
from ..launch import flags
from .iosample import IOSample

if TYPE_CHECKING:
    from ..launch.plan import Plan, PlanInputs

PROTOCOL = 2
QUICK, FULL = "quick", "full"

TURNS = 3                # turns added to the conversation at depth
APPEND_TOKENS = 2048     # never-seen tokens per turn
GEN_TOKENS = 256         # generated per turn (EOS may stop it earlier)
DEPTH_MAX = 32768
DEPTH_CPU = 16384        # when weights sit on CPU (-ot, --n-cpu-moe …)
DEPTH_MIN = 4096         # below this, depth teaches nothing: the phase is skipped
MARGIN = 512             # template, questions, instructions
WARM_GEN = 32
SEED = 1234
REUSE_SLACK = 16         # tokens at the end of a prefix a template may legitimately rewrite
SAMPLE_BYTES = 160 << 10
FALLBACK_RATIO = 2.5     # bytes per token without /tokenize: low, so pieces come out short
THRASH_BYTES = 512 << 20  # read from disk per 256 generated tokens: "possible thrash"
REQUEST_BUDGET = 360.0   # seconds per request; past it the depth phase is partial
DEFAULT_PROMPT = 2000
DEFAULT_PREDICT = 300
MAX_TOKENS = 131072      # the most prompt or predicted tokens a caller may ask
# Quantized KV cache types: a measurement with them is a grey zone against lossless ones.
LOSSLESS_KV = frozenset({"f32", "f16", "bf16"})


@dataclass
class Draft:
    """Drafted and accepted tokens (MTP, n-gram, draft model), summed over requests."""

    n: int = 0
    accepted: int = 0

    @property
    def rate(self) -> float:
        return self.accepted / self.n if self.n else 0.0


@dataclass
class Turn:
    """One chat request: the engine's own timings. ``cached`` None: the engine does not say."""

    new: int                 # prompt tokens actually computed (prompt_n)
    prompt_ms: float
    prompt_per_second: float
    predicted_n: int
    predicted_ms: float
    predicted_per_second: float
    cached: int | None = None
    expected: int = 0        # the previous turn's whole prompt: what could be reused
    draft: Draft | None = None
    total: int = 0           # usage.prompt_tokens, 0 when unknown
    content: str = ""        # the answer (the next turn sends it back as the assistant)

    def prompt_total(self) -> int:
        return self.total or self.new + (self.cached or 0)


@dataclass
class Depth:
    ctx: int
    target: int
    skipped: str = ""
    cold: Turn | None = None
    turns: list[Turn] = field(default_factory=list)
    cached_per_second: float | None = None   # prefill of the new tokens, cache reused
    decode_per_second: float | None = None   # decode at depth
    reuse: float | None = None               # share of the previous prompt taken from cache
    reuse_note: str = ""
    draft: Draft | None = None
    partial: str = ""
    hint: str = ""                           # possible thrash: shown, never saved


@dataclass
class Result:
    mode: str
    prompt_n: int = 0
    prompt_ms: float = 0.0
    prompt_per_second: float = 0.0
    predicted_n: int = 0
    predicted_ms: float = 0.0
    predicted_per_second: float = 0.0
    elapsed: float = 0.0
    protocol: int = PROTOCOL
    draft: Draft | None = None
    kv: str = "f16"
    kv_quantized: bool = False
    engine: str = ""                         # the engine's build_info
    gpus: str = ""
    depth: Depth | None = None
    slot: int | None = None                  # the id_slot it ran in; None: the engine chose
    slots: int = 0                           # the engine's slots, 0 when it does not say
    slot_note: str = ""                      # the conversations' caches (lokid.core.bench.slot)
    shared: str = ""                         # another slot served a request: not kept
    repeat: int = 1                          # runs (lokid.core.bench.repeat); 1: the keys
    stats: dict[str, dict[str, float]] | None = None   # below are not written
    runs: list[dict[str, float]] | None = None

    @property
    def savable(self) -> bool:
        """Only a complete result is saved: a partial one is shown, never kept as the
        measurement of its preset."""
        return self.depth is None or not self.depth.partial

    def to_json(self, keep_hint: bool = False) -> dict[str, Any]:
        data = asdict(self)
        if self.repeat == 1:  # a single run reads as it always did
            for key in ("repeat", "stats", "runs"):
                data.pop(key)
        if data["depth"]:
            for t in [data["depth"]["cold"], *data["depth"]["turns"]]:
                if t:
                    t.pop("content", None)
            if not keep_hint:
                data["depth"]["hint"] = ""
        return data


def _turn_from(d: dict[str, Any] | None) -> Turn | None:
    if not d:
        return None
    d = dict(d)
    draft = d.pop("draft", None)
    known = {k: v for k, v in d.items() if k in Turn.__dataclass_fields__}
    return Turn(**known, draft=Draft(**draft) if draft else None)


def result_from_json(data: dict[str, Any]) -> Result:
    """The inverse of :meth:`Result.to_json` (what lokictl gets back over the bus, where an
    absent key stands for None)."""
    d = {k: v for k, v in data.items() if k in Result.__dataclass_fields__}
    draft = d.pop("draft", None)
    depth = d.pop("depth", None)
    r = Result(**d, draft=Draft(**draft) if draft else None)
    if depth:
        depth = dict(depth)
        cold = _turn_from(depth.pop("cold", None))
        turns = [t for t in (_turn_from(x) for x in depth.pop("turns", []) or []) if t]
        ddraft = depth.pop("draft", None)
        known = {k: v for k, v in depth.items() if k in Depth.__dataclass_fields__}
        r.depth = Depth(**known, cold=cold, turns=turns,
                        draft=Draft(**ddraft) if ddraft else None)
    return r


def add_draft(total: Draft | None, more: Draft | None) -> Draft | None:
    if more is None:
        return total
    total = total or Draft()
    total.n += more.n
    total.accepted += more.accepted
    return total


def kv_label(k: str | None, v: str | None) -> tuple[str, bool]:
    """("f16", False), ("q8_0/f16", True): the cache types and whether one is quantized."""
    k = (k or "f16").strip().lower() or "f16"
    v = (v or "f16").strip().lower() or "f16"
    label = k if k == v else f"{k}/{v}"
    return label, not {k, v} <= LOSSLESS_KV


def warm_tokens(ubatch: int, n_ctx: int) -> int:
    """Two ubatches, never more than a quarter of the context (a -ub 4096 preset on an
    8k context would otherwise send a prompt larger than the window), at least 64."""
    want = 2 * ubatch
    if n_ctx > 0:
        want = max(min(want, n_ctx // 4), 64)
    return want


def depth_for(n_ctx: int, cpu_placed: bool, warm: int) -> tuple[int, str]:
    """The depth of the full mode: half the context, capped, low enough for the turns
    to fit. (0, why) when the phase is skipped."""
    if n_ctx <= 0:
        return 0, "the engine's context size is unknown"
    d = min(n_ctx // 2, DEPTH_MAX)
    if cpu_placed:
        d = min(d, DEPTH_CPU)
    d = min(d, n_ctx - TURNS * (APPEND_TOKENS + GEN_TOKENS) - GEN_TOKENS - warm - MARGIN)
    if d < DEPTH_MIN:
        return 0, (f"a context of {n_ctx} tokens is too small for the depth phase "
                   f"(it needs {DEPTH_MIN} tokens of depth plus {TURNS} turns)")
    return d, ""


def cut(text: str, start: int, size: int) -> tuple[str, int]:
    """About ``size`` characters of ``text`` from ``start``, ended at a line end when one
    falls in the second half; ("", start) when the text is used up."""
    if start >= len(text) or size <= 0:
        return "", start
    end = start + size
    if end >= len(text):
        return text[start:], len(text)
    nl = text.rfind("\n", start, end)
    if nl - start > size // 2:
        end = nl + 1
    return text[start:end], end


def line_start(text: str, at: int) -> int:
    """The start of the line after ``at`` (``at`` itself when a line starts there)."""
    if at <= 0:
        return 0
    if at >= len(text):
        return len(text)
    if text[at - 1] == "\n":
        return at
    nl = text.find("\n", at)
    return nl + 1 if nl >= 0 else len(text)


def next_turn_fits(prev_total: int, n_ctx: int) -> bool:
    """Whether one more turn fits: the previous prompt, its answer, the new tokens
    (estimated generously), the generation and the margin."""
    return prev_total + 2 * GEN_TOKENS + APPEND_TOKENS * 5 // 4 + MARGIN <= n_ctx


def reuse(turns: list[Turn], hybrid: bool) -> tuple[float | None, str]:
    """The share of each previous prompt taken from cache, and what a shortfall means.

    An observation, never a failure: a hybrid model legitimately reuses up to its last
    checkpoint only, and a template that drops reasoning from the history rewrites the
    end of the prefix.
    """
    cached = expected = 0
    full = True
    for t in turns:
        if t.cached is None or t.expected <= 0:
            continue
        cached += min(t.cached, t.expected)
        expected += t.expected
        if t.cached < t.expected - REUSE_SLACK:
            full = False
    if expected == 0:
        return None, "the engine does not say how many tokens it reused from its cache"
    ratio = cached / expected
    if full:
        return ratio, ""
    if hybrid:
        return ratio, ("partial reuse: a hybrid model, whose cache is reused only up to "
                       "its checkpoints")
    return ratio, ("partial reuse: the chat template probably rewrites the end of the "
                   "history (reasoning removed from earlier answers)")


def thrash_hint(before: IOSample, after: IOSample, generated: int) -> str:
    """A hint (uncalibrated, never saved) that the model does not fit in RAM: the disk
    reads between two samples, per 256 generated tokens."""
    read_bytes = after.read_bytes - before.read_bytes
    if read_bytes <= 0 or generated <= 0:
        return ""
    per = read_bytes * 256 // generated
    if per <= THRASH_BYTES:
        return ""
    known = [m for m in (before.memory_bytes, after.memory_bytes) if m is not None]
    memory = f" ({after.memory}: {max(known) / 2**30:.1f} GiB)" if known else ""
    return (f"possible thrash: {per / 2**30:.1f} GiB read from disk per 256 generated "
            f"tokens{memory}: the model probably does not fit in RAM")


def effort_from_refusal(body: str, wanted: str) -> str | None:
    """The reasoning-effort level a template's refusal names, "" to retry without the
    field, or None when the body is not such a refusal.

    Templates list the levels they accept at the end of their message: the one closest
    below the wanted level is taken (else the closest above).
    """
    text = body.lower()
    if "effort" not in text:
        return None
    named = [lvl for lvl in EFFORT_LEVELS if _names(text, lvl)]
    named = [lvl for lvl in named if lvl != wanted.lower()]
    if not named:
        return ""
    rank = EFFORT_LEVELS.index(wanted.lower()) if wanted.lower() in EFFORT_LEVELS else 3
    below = [lvl for lvl in named if EFFORT_LEVELS.index(lvl) < rank]
    return below[-1] if below else named[0]


def _names(text: str, word: str) -> bool:
    return re.search(rf"(?<![a-z]){word}(?![a-z])", text) is not None


@dataclass(frozen=True)
class PlanFacts:
    """What the benchmark reads from the command line and environment it measures."""

    ubatch: int
    cpu_placed: bool
    kv: str
    kv_quantized: bool
    gpus: str


def plan_facts(argv: Sequence[str], env: Mapping[str, str], block_count: int = 0) -> PlanFacts:
    """Ubatch, weights placed on CPU (depth capped), KV cache types, GPUs: flags win over
    the ``LLAMA_ARG_*`` environment, as in the engine. Weights on CPU are the planner's
    answer (:func:`lokid.core.launch.flags.placement`), for the model's ``block_count``."""
    ub = flags.setting(argv, env, flags.UBATCH) or ""
    cpu = flags.placement(argv, env, block_count).on_cpu
    k = flags.setting(argv, env, flags.CACHE_TYPE_K)
    v = flags.setting(argv, env, flags.CACHE_TYPE_V)
    label, quantized = kv_label(k, v)
    return PlanFacts(ubatch=int(ub) if ub.strip().isdigit() and int(ub) > 0 else 512,
                     cpu_placed=bool(cpu), kv=label, kv_quantized=quantized,
                     gpus=env.get("CUDA_VISIBLE_DEVICES", ""))


def bench_fingerprint(plan: Plan, inputs: PlanInputs) -> str:
    """What a preset's saved result is kept under: its plan's configuration, the engine,
    and the ``[chat]`` settings the benchmark sent (sampling, reasoning effort)."""
    from ..launch.plan import config_fingerprint

    return digest({"plan": config_fingerprint(plan, inputs.model),
                   "engine": inputs.caps.path, "chat": asdict(inputs.preset.chat)},
                  plan.env.get("CUDA_VISIBLE_DEVICES", ""))


def start_differs(planned_argv: Sequence[str], planned_env: Mapping[str, str],
                  started_argv: Sequence[str], started_env: Mapping[str, str]) -> str:
    """Why a measurement of the running engine may not be kept under the preset's
    fingerprint now ("" when it may): the engine was started with another plan than the
    preset gives today (the file was edited, lokid.toml changed, a verdict cut its
    automatic speculation). It measured the old configuration, not the new one."""
    differ = [what for what, now, then in (
        ("command line", list(planned_argv), list(started_argv)),
        ("environment", dict(planned_env), dict(started_env))) if now != then]
    if not differ:
        return ""
    return (f"the preset's plan changed since its engine started (its {' and '.join(differ)} "
            f"{'differ' if len(differ) > 1 else 'differs'} now): restart it to keep a result")


def not_saved_reason(r: Result, changed: str = "") -> str:
    """Why a result is not kept, "" when it is: the start it measured is not the preset's
    (:func:`start_differs`), or it is partial."""
    reasons = [changed] if changed else []
    if r.shared:
        reasons.append(r.shared)
    if r.depth is not None and r.depth.partial:
        reasons.append(f"the result is partial ({r.depth.partial}): only a complete one "
                       "is kept")
    return "; ".join(reasons)


def digest(config: dict[str, Any], gpus: str) -> str:
    """The hash :func:`bench_fingerprint` keeps a result under: the configuration, the
    GPUs, the protocol. A preset whose model, GPUs or arguments changed, or a new
    protocol, no longer matches an old result."""
    blob = json.dumps({"config": config, "gpus": gpus, "protocol": PROTOCOL},
                      sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _draft_text(d: Draft | None) -> str:
    if d is None or d.n == 0:
        return ""
    return f"   draft accepted {d.rate * 100:.0f} % ({d.accepted}/{d.n})"


def _spread_text(r: Result, key: str, percent: bool = False) -> str:
    """A repeated figure's spread and range ("" for a single run)."""
    s = (r.stats or {}).get(key)
    if not s:
        return ""
    low, high = ((f"{s['low'] * 100:.0f}", f"{s['high'] * 100:.0f} %") if percent
                 else (f"{s['low']:.1f}", f"{s['high']:.1f}"))
    return f"   [median of {r.repeat}: spread {s['spread'] * 100:.1f} %, {low} to {high}]"


def report(r: Result, not_saved: str = "") -> list[str]:
    """The human report: prefill and decode, depth figures in full mode, the slot it ran
    in, KV, engine, and why it is not kept (``not_saved``, from :func:`not_saved_reason`).
    A repeated benchmark shows each figure's median, then its spread and range."""
    lines = [f"  Prefill    {r.prompt_per_second:7.1f} tok/s   ({r.prompt_n} tokens in "
             f"{r.prompt_ms / 1000:.2f} s){_spread_text(r, 'prompt_per_second')}",
             f"  Decode     {r.predicted_per_second:7.1f} tok/s   ({r.predicted_n} tokens in "
             f"{r.predicted_ms / 1000:.2f} s){_draft_text(r.draft)}"
             f"{_spread_text(r, 'predicted_per_second')}"]
    d = r.depth
    if d is not None:
        if d.skipped:
            lines.append(f"  Depth      skipped: {d.skipped}")
        elif d.cold is not None:
            cold = (r.stats or {}).get("depth_cold_per_second", {}).get(
                "median", d.cold.prompt_per_second)
            lines.append(f"  Prefill@D  {cold:7.1f} tok/s   ({d.cold.new} tokens, cold)"
                         f"{_spread_text(r, 'depth_cold_per_second')}")
            if d.cached_per_second is not None:
                lines.append(f"  Prefill+   {d.cached_per_second:7.1f} tok/s   "
                             "(new tokens, cache reused)"
                             f"{_spread_text(r, 'depth_cached_per_second')}")
            if d.decode_per_second is not None:
                lines.append(f"  Decode@D   {d.decode_per_second:7.1f} tok/s"
                             f"{_draft_text(d.draft)}"
                             f"{_spread_text(r, 'depth_decode_per_second')}")
            lines.append("  Cache reuse " + (f"{d.reuse * 100:.0f} %" if d.reuse is not None
                                             else "n/a")
                         + _spread_text(r, "depth_reuse", percent=True))
        lines += [f"  ! {s}" for s in (d.reuse_note, d.partial, d.hint) if s]
    if r.slot_note:
        lines.append(f"  Slot       {r.slot_note}")
    kv = r.kv + (" (quantized: a grey zone against lossless caches)" if r.kv_quantized else "")
    lines.append(f"  KV {kv} · engine {r.engine or 'n/a'} · total {r.elapsed:.2f} s")
    if not_saved:
        lines.append(f"  (not saved: {not_saved})")
    elif not r.savable:
        lines.append("  (partial: not saved)")
    return lines
