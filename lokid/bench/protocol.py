"""The benchmark protocol (version 2), run against an OpenAI-compatible llama-server over httpx.

Quick mode: a discarded warm-up, then the short line (prose completed with
code, ~2000 prompt tokens, ~300 generated, ``cache_prompt: false``, fixed
seed) on ``/v1/chat/completions``. Full mode adds the depth phase: a cold
prefill at depth D, then :data:`~lokid.core.bench.rules.TURNS` turns, each adding
~2048 never-seen tokens of code to the same conversation (user → assistant
→ user, ``cache_prompt: true``), reading the reuse from the response.

Every figure comes from the engine's own ``timings``: a non-200 answer or a
response without timings fails the phase; a missing counter stays None. A
request past its budget makes the depth phase partial. The rules (sizes,
depth, reuse, partial) are in :mod:`lokid.core.bench.rules`; this module only talks.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from ..core.bench import repeat as benchrepeat
from ..core.bench import rules as benchrules
from ..core.bench import slot as benchslot
from ..core.bench.iosample import IOSampler
from ..core.errors import BenchError, EngineBusyError, EngineHTTPError, RequestTimeout
from . import corpus

Progress = Callable[[str, int, int], None]

ASK_PROSE = ("\n\nContinue this text with more than a thousand words of new, varied prose "
             "mixing the languages and subjects above.")
ASK_FIRST = "Summarise in a few sentences what this source file does."
ASK_NEXT = "Write a short Python function inspired by this part, without explanation."


@dataclass
class Options:
    mode: str = benchrules.QUICK
    prompt: int = benchrules.DEFAULT_PROMPT
    predict: int = benchrules.DEFAULT_PREDICT
    repeat: int = 1          # measured runs after the one warm-up (lokid.core.bench.repeat)


@dataclass
class Setup:
    """What the benchmark takes from the preset and its plan."""

    ubatch: int = 512
    cpu_placed: bool = False
    hybrid: bool = False
    kv: str = "f16"
    kv_quantized: bool = False
    gpus: str = ""
    effort: str = ""                         # reasoning_effort the preset asks for
    sampling: dict[str, Any] = field(default_factory=dict)
    learn: Callable[[str, str], None] | None = None   # remembers an effort translation
    retried: bool = False
    slot: int | None = None                  # every request's id_slot (lokid.core.bench.slot)

    def payload(self, messages: list[dict[str, str]], max_tokens: int,
                cache: bool) -> dict[str, Any]:
        p: dict[str, Any] = {"model": "lokid-bench", "messages": messages,
                             "max_tokens": max_tokens, "stream": False, "temperature": 0.7,
                             "seed": benchrules.SEED, "cache_prompt": cache, **self.sampling}
        if self.effort:
            p["reasoning_effort"] = self.effort
        if self.slot is not None:
            p["id_slot"] = self.slot
        return p


class Engine:
    """The engine as the benchmark sees it."""

    def __init__(self, base_url: str, client: httpx.AsyncClient,
                 budget: float = benchrules.REQUEST_BUDGET):
        self.base = base_url.rstrip("/")
        self.client = client
        self.budget = budget

    async def request(self, method: str, path: str, body: Any = None,
                      timeout: float | None = None) -> Any:
        try:
            r = await self.client.request(method, self.base + path, json=body,
                                          timeout=timeout or self.budget)
        except httpx.TimeoutException:
            raise RequestTimeout(f"{method} {path}: no answer within "
                                 f"{timeout or self.budget:.0f} s") from None
        except httpx.HTTPError as e:
            raise BenchError(f"{method} {path}: {e}") from None
        if r.status_code != 200:
            raise EngineHTTPError(method, path, r.status_code, r.text)
        try:
            return r.json()
        except ValueError:
            raise BenchError(f"{method} {path}: the answer is not JSON") from None

    async def slot(self, total: int) -> benchslot.Choice:
        """The slot the benchmark runs in, from /slots (``total``: /props' count, for an
        engine that hides /slots). EngineBusyError when that slot is processing."""
        try:
            slots = benchslot.slots_of(await self.request("GET", "/slots", timeout=3))
        except BenchError:  # absent or disabled (501): the busy check cannot look
            slots = None
        choice = benchslot.choose(slots, total)
        if isinstance(choice, str):
            raise EngineBusyError(choice)
        return choice

    async def erase(self, slot: int) -> str:
        """Erase the benchmark's slot: "" when done, else what the report says."""
        try:
            await self.request("POST", f"/slots/{slot}?action=erase", timeout=10)
        except EngineHTTPError as e:
            return benchslot.erase_note(e.status, e.body)
        except BenchError as e:
            return f"its prompt stays there: erasing the slot failed ({e})"
        return ""

    async def props(self) -> tuple[int, str, int]:
        """(n_ctx, build_info, total_slots); 0, "" and 0 when the engine does not say."""
        try:
            p = await self.request("GET", "/props", timeout=5)
        except BenchError:
            return 0, "", 0
        if not isinstance(p, dict):
            return 0, "", 0
        defaults = p.get("default_generation_settings") or {}
        n_ctx = defaults.get("n_ctx") if isinstance(defaults, dict) else None
        if not isinstance(n_ctx, int) or n_ctx <= 0:
            n_ctx = p.get("n_ctx") if isinstance(p.get("n_ctx"), int) else 0
        build = p.get("build_info")
        total = p.get("total_slots")
        return (int(n_ctx or 0), str(build) if isinstance(build, str) else "",
                total if isinstance(total, int) and not isinstance(total, bool) else 0)

    async def bytes_per_token(self, sample: str) -> float:
        if not sample:
            return benchrules.FALLBACK_RATIO
        try:
            out = await self.request("POST", "/tokenize", {"content": sample}, timeout=30)
        except BenchError:
            return benchrules.FALLBACK_RATIO
        tokens = out.get("tokens") if isinstance(out, dict) else None
        if not tokens:
            return benchrules.FALLBACK_RATIO
        return len(sample) / len(tokens)

    async def chat(self, payload: dict[str, Any]) -> benchrules.Turn:
        data = await self.request("POST", "/v1/chat/completions", payload)
        return turn_of(data)


def _num(d: Any, key: str) -> float | None:
    v = d.get(key) if isinstance(d, dict) else None
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def turn_of(data: Any) -> benchrules.Turn:
    """The measured turn of a chat response. No timings, no measurement (Loki's v1
    invented a split of the elapsed time; nothing is estimated here)."""
    t = data.get("timings") if isinstance(data, dict) else None
    need = [_num(t, k) for k in ("prompt_n", "prompt_ms", "predicted_n", "predicted_ms")]
    if t is None or any(v is None for v in need):
        raise BenchError("the engine returned no timings: nothing to measure or save")
    prompt_n, prompt_ms, predicted_n, predicted_ms = (v or 0.0 for v in need)

    def rate(n: float, ms: float, given: float | None) -> float:
        if given and given > 0:
            return given
        return n / (ms / 1000) if ms > 0 else 0.0

    cached = _num(t, "cache_n")
    if cached is None:
        details = (data.get("usage") or {}).get("prompt_tokens_details")
        cached = _num(details, "cached_tokens")
    draft = None
    dn, da = _num(t, "draft_n"), _num(t, "draft_n_accepted")
    if dn is not None and da is not None and dn > 0:
        draft = benchrules.Draft(int(dn), int(da))
    total = _num(data.get("usage"), "prompt_tokens") or 0
    content = ""
    choices = data.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        content = str((choices[0].get("message") or {}).get("content") or "")
    return benchrules.Turn(new=int(prompt_n), prompt_ms=prompt_ms,
                     prompt_per_second=rate(prompt_n, prompt_ms, _num(t, "prompt_per_second")),
                     predicted_n=int(predicted_n), predicted_ms=predicted_ms,
                     predicted_per_second=rate(predicted_n, predicted_ms,
                                               _num(t, "predicted_per_second")),
                     cached=None if cached is None else int(cached), draft=draft,
                     total=int(total), content=content)


async def ask(engine: Engine, setup: Setup, messages: list[dict[str, str]], max_tokens: int,
              cache: bool) -> benchrules.Turn:
    """One chat request; a template refusing the preset's reasoning effort is retried
    once with the level it names (or without the field), and the translation learned."""
    try:
        return await engine.chat(setup.payload(messages, max_tokens, cache))
    except EngineHTTPError as e:
        if setup.retried or not setup.effort:
            raise
        fixed = benchrules.effort_from_refusal(e.body, setup.effort)
        if fixed is None:
            raise
        setup.retried = True
        if setup.learn is not None:
            setup.learn(setup.effort, fixed)
        setup.effort = fixed
    return await engine.chat(setup.payload(messages, max_tokens, cache))


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


async def run(engine: Engine, opts: Options, setup: Setup, *, prose: str = corpus.PROSE,
              code: str | None = None, progress: Progress | None = None,
              io_sampler: IOSampler | None = None) -> benchrules.Result:
    """The whole protocol: the slot chosen (and checked idle), one warm-up, then the
    measured phases ``opts.repeat`` times (:func:`lokid.core.bench.repeat.combine`), the
    slot erased at the end, failure included. BenchError when a phase fails (nothing
    to save); a depth phase cut by its budget, the context or the corpus comes back
    partial, and says so."""
    code = corpus.code() if code is None else code
    prompt_tokens = opts.prompt if opts.prompt > 0 else benchrules.DEFAULT_PROMPT
    predict = opts.predict if opts.predict > 0 else benchrules.DEFAULT_PREDICT
    full = opts.mode == benchrules.FULL
    repeat = max(opts.repeat, 1)
    t0 = time.monotonic()
    n_ctx, build, total = await engine.props()
    choice = await engine.slot(total)
    setup.slot = choice.slot
    steps = 1 + repeat * (1 + (1 + benchrules.TURNS if full else 0))
    step = 0
    suffix = ""

    def next_phase(name: str) -> None:
        nonlocal step
        step += 1
        if progress is not None:
            progress(name + suffix, step, steps)

    runs: list[benchrules.Result] = []
    try:
        code_ratio = await engine.bytes_per_token(
            benchrules.cut(code, 0, benchrules.SAMPLE_BYTES)[0])
        prose_ratio = await engine.bytes_per_token(prose)

        # 1. Warm-up, discarded: first allocations, graphs, the model's pages. Taken
        # from the end of the code, far from what the depth phase reads.
        next_phase("warm-up")
        warm_tok = benchrules.warm_tokens(setup.ubatch, n_ctx)
        warm_start = benchrules.line_start(code, len(code) - int(warm_tok * code_ratio))
        warm_text, _ = benchrules.cut(code, warm_start, len(code))
        try:
            await ask(engine, setup, [user(warm_text + "\n\n" + ASK_FIRST)],
                      benchrules.WARM_GEN, False)
        except BenchError as e:
            raise BenchError(f"warm-up: {e}") from None

        # 2. The short line: prose, completed with never-seen code up to the size asked
        # (the same text each run: cache_prompt false computes it all again).
        text = prose
        if int(prompt_tokens * prose_ratio) < len(text):
            text, _ = benchrules.cut(text, 0, int(prompt_tokens * prose_ratio))
        else:
            rest = prompt_tokens - int(len(text) / prose_ratio)
            if rest > 0:
                chunk, _ = benchrules.cut(code, benchrules.line_start(code, len(code) // 2),
                                          int(rest * code_ratio))
                text += "\n\n" + chunk
        for k in range(1, repeat + 1):
            suffix = f", run {k}/{repeat}" if repeat > 1 else ""
            result = benchrules.Result(mode=benchrules.FULL if full else benchrules.QUICK,
                                       kv=setup.kv, kv_quantized=setup.kv_quantized,
                                       engine=build, gpus=setup.gpus, slot=choice.slot,
                                       slots=choice.count, slot_note=choice.note,
                                       shared=choice.shared)
            next_phase(f"short line ({prompt_tokens} + {predict} tokens)")
            try:
                quick = await ask(engine, setup, [user(text.strip() + ASK_PROSE)], predict,
                                  False)
            except BenchError as e:
                raise BenchError(f"short line: {e}") from None
            result.prompt_n, result.prompt_ms = quick.new, quick.prompt_ms
            result.prompt_per_second = quick.prompt_per_second
            result.predicted_n, result.predicted_ms = quick.predicted_n, quick.predicted_ms
            result.predicted_per_second = quick.predicted_per_second
            result.draft = quick.draft
            if full:
                target, why = benchrules.depth_for(n_ctx, setup.cpu_placed,
                                                   warm_tok + benchrules.WARM_GEN)
                result.depth = benchrules.Depth(ctx=n_ctx, target=target, skipped=why)
                if not why:
                    await _depth(engine, setup, code, code_ratio, result.depth, next_phase,
                                 io_sampler)
            runs.append(result)
            if result.depth is not None and result.depth.partial:
                if repeat > 1:  # nothing partial is kept: the runs left would be lost time
                    result.depth.partial = f"run {k}/{repeat}: {result.depth.partial}"
                break
    finally:
        # The benchmark's prompt would otherwise stay in its slot, and where the engine
        # keeps a RAM prompt cache, be saved there beside the conversations' ones.
        erased = await engine.erase(choice.slot) if choice.slot is not None else None
    result = benchrepeat.combine(runs)
    if erased is not None:
        result.slot_note += "; erased after" if not erased else "; " + erased
    result.elapsed = time.monotonic() - t0
    return result


async def _depth(engine: Engine, setup: Setup, code: str, ratio: float, depth: benchrules.Depth,
                 next_phase: Callable[[str], None], io_sampler: IOSampler | None) -> None:
    next_phase(f"cold prefill at depth ({depth.target} tokens)")
    prefix, offset = benchrules.cut(code, 0, int(depth.target * ratio))
    messages = [user("Here is a source file of lokid:\n\n```python\n" + prefix + "\n```\n\n"
                     + ASK_FIRST)]
    try:
        cold = await ask(engine, setup, messages, benchrules.GEN_TOKENS, False)
    except RequestTimeout:
        depth.partial = f"cold prefill interrupted after {engine.budget:.0f} s"
        return
    except BenchError as e:
        raise BenchError(f"cold prefill: {e}") from None
    depth.cold = cold
    prev, answer = cold.prompt_total(), cold.content
    # Disk reads are counted over the turns only: the cold prefill legitimately reads
    # the model's pages.
    io0 = await io_sampler() if io_sampler else None
    new = generated = 0
    prompt_ms = gen_ms = 0.0
    for r in range(1, benchrules.TURNS + 1):
        if not benchrules.next_turn_fits(prev, depth.ctx):
            depth.partial = f"context full after {r - 1} turn(s)"
            break
        chunk, next_offset = benchrules.cut(code, offset, int(benchrules.APPEND_TOKENS * ratio))
        if not chunk:
            depth.partial = f"code corpus used up after {r - 1} turn(s)"
            break
        offset = next_offset
        next_phase(f"turn {r}/{benchrules.TURNS} at depth")
        messages = [*messages, {"role": "assistant", "content": answer},
                    user("The file goes on:\n\n```python\n" + chunk + "\n```\n\n" + ASK_NEXT)]
        try:
            turn = await ask(engine, setup, messages, benchrules.GEN_TOKENS, True)
        except RequestTimeout:
            depth.partial = f"turn {r} interrupted after {engine.budget:.0f} s"
            break
        except BenchError as e:
            raise BenchError(f"turn {r} at depth: {e}") from None
        turn.expected = prev
        depth.turns.append(turn)
        depth.draft = benchrules.add_draft(depth.draft, turn.draft)
        new += turn.new
        prompt_ms += turn.prompt_ms
        generated += turn.predicted_n
        gen_ms += turn.predicted_ms
        prev, answer = turn.prompt_total(), turn.content
    if prompt_ms > 0:
        depth.cached_per_second = new / (prompt_ms / 1000)
    if gen_ms > 0:
        depth.decode_per_second = generated / (gen_ms / 1000)
    depth.reuse, depth.reuse_note = benchrules.reuse(depth.turns, setup.hybrid)
    io1 = await io_sampler() if io0 is not None and io_sampler else None
    if io0 is not None and io1 is not None:
        depth.hint = benchrules.thrash_hint(io0, io1, generated)
