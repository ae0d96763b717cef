"""lokid.core.bench.rules, the benchmark rules: depth, corpus cuts, reuse, hints, fingerprints."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lokid.core.bench import rules as benchrules
from lokid.core.bench.iosample import IOSample
from lokid.core.bench.rules import Depth, Draft, Result, Turn


def turn(new: int = 100, cached: int | None = None, expected: int = 0,
         draft: Draft | None = None) -> Turn:
    return Turn(new=new, prompt_ms=100.0, prompt_per_second=1000.0, predicted_n=10,
                predicted_ms=100.0, predicted_per_second=100.0, cached=cached,
                expected=expected, draft=draft)


@pytest.mark.parametrize("n_ctx,cpu,depth", [
    (16384, False, 16384 - 3 * (2048 + 256) - 256 - 1056 - 512),   # the turns decide
    (131072, False, 32768),                                        # the cap
    (131072, True, 16384),                                         # weights on CPU
    (65536, False, 32768),                                         # half the context
])
def test_depth(n_ctx: int, cpu: bool, depth: int) -> None:
    warm = benchrules.warm_tokens(512, n_ctx) + benchrules.WARM_GEN
    assert benchrules.depth_for(n_ctx, cpu, warm) == (depth, "")


@pytest.mark.parametrize("n_ctx", [0, 4096, 8192, 12000])
def test_a_context_too_small_skips_the_depth_phase_with_a_reason(n_ctx: int) -> None:
    d, why = benchrules.depth_for(n_ctx, False, 1056)
    assert d == 0 and why


def test_the_warm_up_never_takes_more_than_a_quarter_of_the_context() -> None:
    assert benchrules.warm_tokens(4096, 8192) == 2048
    assert benchrules.warm_tokens(512, 0) == 1024
    assert benchrules.warm_tokens(16, 100) == 64


@given(st.text(alphabet=st.sampled_from("ab\néß€ \n"), max_size=400),
       st.integers(min_value=1, max_value=80))
def test_cuts_cover_the_text_once_in_order(text: str, size: int) -> None:
    pieces, at = [], 0
    while True:
        piece, at = benchrules.cut(text, at, size)
        if not piece:
            break
        assert len(piece) <= size
        pieces.append(piece)
    assert "".join(pieces) == text


def test_a_cut_ends_at_a_line_end_when_one_is_in_its_second_half() -> None:
    text = "x" * 60 + "\n" + "y" * 100
    assert benchrules.cut(text, 0, 80) == (text[:61], 61)
    assert benchrules.cut("x" * 10 + "\n" + "y" * 100, 0, 80)[1] == 80  # too early: a hard cut
    assert benchrules.line_start("ab\ncd", 1) == 3 and benchrules.line_start("ab\ncd", 3) == 3
    assert benchrules.line_start("abcd", 2) == 4


def test_reuse_is_read_never_assumed() -> None:
    full = [turn(cached=1000, expected=1010), turn(cached=3000, expected=3000)]
    ratio, note = benchrules.reuse(full, hybrid=False)
    assert ratio == pytest.approx(4000 / 4010) and note == ""
    partial = [turn(cached=500, expected=1000)]
    assert benchrules.reuse(partial, hybrid=True) == (0.5, benchrules.reuse(partial, True)[1])
    assert "hybrid" in benchrules.reuse(partial, hybrid=True)[1]
    assert "template" in benchrules.reuse(partial, hybrid=False)[1]
    ratio, note = benchrules.reuse([turn(cached=None, expected=1000)], hybrid=False)
    assert ratio is None and "does not say" in note


def test_thrash_hint_says_which_memory_it_read() -> None:
    def io(read: int, memory: int | None, label: str = "engine RSS") -> IOSample:
        return IOSample(read, memory, label)

    assert benchrules.thrash_hint(io(5 << 30, 1 << 30), io(5 << 30, 1 << 30), 256) == ""
    assert benchrules.thrash_hint(io(0, 1 << 30), io(100 << 20, 1 << 30), 256) == ""
    hint = benchrules.thrash_hint(io(1 << 30, 2 << 30), io(5 << 30, 3 << 30), 512)
    assert hint == ("possible thrash: 2.0 GiB read from disk per 256 generated tokens "
                    "(engine RSS: 3.0 GiB): the model probably does not fit in RAM")
    unit = "memory of loki-engine@x.service (its cgroup, page cache included)"
    hint = benchrules.thrash_hint(io(0, 3 << 30, unit), io(4 << 30, None, unit), 512)
    assert f"tokens ({unit}: 3.0 GiB): the model" in hint
    # the memory unknown: the reads alone, nothing put in its place
    hint = benchrules.thrash_hint(io(0, None, unit), io(4 << 30, None, unit), 512)
    assert "GiB read from disk per 256 generated tokens: the model probably" in hint


@pytest.mark.parametrize("body,wanted,got", [
    ('{"error":"reasoning_effort \\"high\\" is not supported; use one of: low, medium"}',
     "high", "medium"),
    ("Invalid reasoning effort 'low'. Expected one of: medium, high", "low", "medium"),
    ("reasoning_effort is not supported by this template", "high", ""),
    ("model failed to load", "high", None),
])
def test_the_effort_level_a_refusal_names(body: str, wanted: str, got: str | None) -> None:
    assert benchrules.effort_from_refusal(body, wanted) == got


def test_kv_label() -> None:
    assert benchrules.kv_label(None, None) == ("f16", False)
    assert benchrules.kv_label("q8_0", "f16") == ("q8_0/f16", True)
    assert benchrules.kv_label("BF16", "bf16") == ("bf16", False)


def test_a_partial_result_is_shown_not_saved_and_its_hint_is_never_kept() -> None:
    r = Result(mode=benchrules.FULL, depth=Depth(ctx=16384, target=7648, partial="context full",
                                           hint="possible thrash: …", cold=turn()))
    assert not r.savable
    assert "  (partial: not saved)" in benchrules.report(r)
    assert r.to_json()["depth"]["hint"] == ""
    assert "content" not in r.to_json()["depth"]["cold"]
    assert Result(mode=benchrules.QUICK).savable


CHANGED = ("the preset's plan changed since its engine started (its command line differs "
           "now): restart it to keep a result")


def test_a_start_that_is_no_longer_the_presets_is_not_saved_and_says_why() -> None:
    argv, env = ["/e", "-m", "/m.gguf", "-c", "2048"], {"CUDA_VISIBLE_DEVICES": "0"}
    assert benchrules.start_differs(argv, env, tuple(argv), dict(env)) == ""
    assert benchrules.start_differs([*argv[:-1], "4096"], env, argv, env) == CHANGED
    assert "(its environment differs now)" in benchrules.start_differs(argv, {}, argv, env)
    assert "(its command line and environment differ now)" in benchrules.start_differs(
        argv[:-2], {}, argv, env)
    r = Result(mode=benchrules.QUICK)
    assert benchrules.not_saved_reason(r) == ""
    assert benchrules.not_saved_reason(r, CHANGED) == CHANGED
    assert benchrules.report(r, CHANGED)[-1] == f"  (not saved: {CHANGED})"
    assert "not saved" not in "\n".join(benchrules.report(r))
    partial = Result(mode=benchrules.FULL, depth=Depth(ctx=16384, target=7648,
                                                 partial="context full after 1 turn(s)"))
    assert benchrules.not_saved_reason(partial, CHANGED) == (
        f"{CHANGED}; the result is partial (context full after 1 turn(s)): only a complete "
        "one is kept")


def test_the_report_says_n_a_for_what_the_engine_did_not_say() -> None:
    r = Result(mode=benchrules.FULL, prompt_n=2000, prompt_ms=1000, prompt_per_second=2000,
               predicted_n=300, predicted_ms=3000, predicted_per_second=100,
               draft=Draft(200, 150), engine="b11434",
               depth=Depth(ctx=16384, target=7648, cold=turn(), reuse=None,
                           decode_per_second=50.0, cached_per_second=900.0))
    text = "\n".join(benchrules.report(r))
    assert "draft accepted 75 % (150/200)" in text
    assert "Cache reuse n/a" in text and "engine b11434" in text


def test_the_fingerprint_follows_configuration_gpus_and_protocol(
        monkeypatch: pytest.MonkeyPatch) -> None:
    a = benchrules.digest({"argv": ["-m", "a.gguf"]}, "0")
    assert a == benchrules.digest({"argv": ["-m", "a.gguf"]}, "0")
    assert a != benchrules.digest({"argv": ["-m", "b.gguf"]}, "0")
    assert a != benchrules.digest({"argv": ["-m", "a.gguf"]}, "0,1")
    monkeypatch.setattr(benchrules, "PROTOCOL", 3)
    assert a != benchrules.digest({"argv": ["-m", "a.gguf"]}, "0")


def test_a_result_survives_its_json_form() -> None:
    r = Result(mode=benchrules.FULL, prompt_n=2000, prompt_ms=1000.0, prompt_per_second=2000.0,
               predicted_n=300, predicted_ms=3000.0, predicted_per_second=100.0,
               draft=Draft(200, 150), engine="b11434", kv="q8_0/f16", kv_quantized=True,
               depth=Depth(ctx=16384, target=7648, cold=turn(), reuse=0.5,
                           turns=[turn(cached=900, expected=1000, draft=Draft(3, 2))],
                           reuse_note="partial reuse", draft=Draft(3, 2)))
    back = benchrules.result_from_json(r.to_json())
    assert back.to_json() == r.to_json()
    # over D-Bus an absent key stands for None
    data = r.to_json()
    del data["depth"]["reuse"], data["draft"]
    assert benchrules.result_from_json(data).depth.reuse is None  # type: ignore[union-attr]
