"""lokid.core.telemetry.figures: requests → windows, speeds, percentiles, draft totals and load
figures; the same shape from a running start (StartStats) and a past window (summarize);
memory bounded to the 5-minute window however long the engine runs."""

from __future__ import annotations

import json

import pytest
from support import DATA

from lokid.core.telemetry.figures import KEYS, MAX_RECENT, WINDOW, StartStats, summarize
from lokid.core.telemetry.requestlog import EngineLog, Load, Request

NOW = 1_764_547_200.0


def req(at: float, prompt: int = 100, prompt_ms: float = 10.0, gen: int = 50,
        gen_ms: float = 100.0, accepted: int | None = None, generated: int | None = None,
        mean_len: float | None = None, slot: int = 0, task: int = 0) -> Request:
    return Request(slot, task, prompt, prompt_ms, gen, gen_ms, at, accepted, generated,
                   mean_len)


def stats_of(requests: list[Request], kind: str = "") -> StartStats:
    s = StartStats(NOW - 3600, kind)
    for r in requests:
        s.add(r)
    return s


def test_the_keys_are_exactly_these_and_json_able() -> None:
    s = stats_of([req(NOW - 1, accepted=3, generated=4, mean_len=2.5)], "mtp")
    load = Load({("CUDA0", "model"): 920.22}, [(4, 10)], NOW - 100, NOW - 90)
    for snap in (s.snapshot(NOW, load, 2), s.snapshot(NOW),
                 summarize([req(NOW - 1)], NOW - 10, NOW), summarize([], NOW - 10, NOW)):
        assert set(snap) == set(KEYS)
        assert json.loads(json.dumps(snap)) == snap
        for speed in ("prefill_tps", "decode_tps"):
            assert set(snap[speed]) == {"1m", "5m", "all", "p50", "p95"}


def test_nothing_yet() -> None:
    snap = StartStats(NOW).snapshot(NOW)
    assert snap == {
        "requests": 0, "requests_per_min": 0.0, "prompt_tokens": 0, "generated_tokens": 0,
        "prefill_tps": dict.fromkeys(("1m", "5m", "all", "p50", "p95")),
        "decode_tps": dict.fromkeys(("1m", "5m", "all", "p50", "p95")),
        "draft": None, "in_flight": 0, "load_seconds": None, "memory_mib": None,
        "offload": None, "on_cpu": None}


def test_windows_and_token_weighted_speeds() -> None:
    s = stats_of([
        req(NOW - 400, prompt=1000, prompt_ms=100.0, gen=100, gen_ms=1000.0),  # before 5 min
        req(NOW - 200, prompt=300, prompt_ms=100.0, gen=30, gen_ms=100.0),     # in 5 min
        req(NOW - 30, prompt=100, prompt_ms=50.0, gen=10, gen_ms=50.0),        # in 1 min
        req(NOW - 10, prompt=100, prompt_ms=150.0, gen=90, gen_ms=250.0),      # in 1 min
    ])
    snap = s.snapshot(NOW)
    assert snap["requests"] == 4
    assert snap["requests_per_min"] == 2.0
    assert (snap["prompt_tokens"], snap["generated_tokens"]) == (1500, 230)
    prefill, decode = snap["prefill_tps"], snap["decode_tps"]
    # token-weighted: sum tokens / sum ms, not the mean of the requests' speeds
    assert prefill["1m"] == pytest.approx(200 / 200.0 * 1000)
    assert prefill["5m"] == pytest.approx(500 / 300.0 * 1000)
    assert prefill["all"] == pytest.approx(1500 / 400.0 * 1000)
    assert decode["1m"] == pytest.approx(100 / 300.0 * 1000)
    assert decode["5m"] == pytest.approx(130 / 400.0 * 1000)
    assert decode["all"] == pytest.approx(230 / 1400.0 * 1000)
    # the same start read later: the 1-minute window is empty, the totals are not
    later = s.snapshot(NOW + 100)
    assert later["requests_per_min"] == 0.0
    assert later["prefill_tps"]["1m"] is None and later["decode_tps"]["1m"] is None
    assert later["prefill_tps"]["5m"] == pytest.approx(500 / 300.0 * 1000)
    assert later["prefill_tps"]["all"] == prefill["all"]


def test_percentiles_of_per_request_speeds_over_5_minutes() -> None:
    # decode speeds 100, 200, 300, 400, 500 tok/s in the last 5 minutes, 10,000 before
    s = stats_of([req(NOW - 1000, gen=10_000, gen_ms=1000.0)]
                 + [req(NOW - 250 + i * 50, gen=k, gen_ms=1000.0)
                    for i, k in enumerate([300, 100, 500, 200, 400])])
    decode = s.snapshot(NOW)["decode_tps"]
    assert decode["p50"] == pytest.approx(300.0)
    assert decode["p95"] == pytest.approx(480.0)   # linear between ranks: 400 + 0.8 × 100
    one = stats_of([req(NOW - 5, gen=64, gen_ms=32.0)]).snapshot(NOW)["decode_tps"]
    assert one["p50"] == one["p95"] == pytest.approx(2000.0)


def test_a_phase_without_tokens_or_time_has_no_speed() -> None:
    """A fully cached prompt (0 tokens, 0 ms): no division by zero, and no 0 tok/s
    dragging the percentiles down."""
    s = stats_of([req(NOW - 5, prompt=0, prompt_ms=0.0), req(NOW - 4, prompt=0, prompt_ms=0.3),
                  req(NOW - 3, prompt=100, prompt_ms=100.0)])
    prefill = s.snapshot(NOW)["prefill_tps"]
    assert prefill["p50"] == prefill["p95"] == pytest.approx(1000.0)
    assert prefill["1m"] == pytest.approx(100 / 100.3 * 1000)
    only_cached = stats_of([req(NOW - 5, prompt=0, prompt_ms=0.0)]).snapshot(NOW)["prefill_tps"]
    assert only_cached == dict.fromkeys(("1m", "5m", "all", "p50", "p95"))


def test_draft_totals_since_start_and_over_5_minutes() -> None:
    s = stats_of([
        req(NOW - 1000, accepted=90, generated=100, mean_len=3.0),
        req(NOW - 100, accepted=10, generated=40, mean_len=1.5),
        req(NOW - 50),                                   # a request without drafting
        req(NOW - 10, accepted=20, generated=20, mean_len=4.5),
    ], kind="mtp+ngram")
    assert s.snapshot(NOW)["draft"] == {
        "kind": "mtp+ngram", "accepted": 120, "generated": 160,
        "acceptance": pytest.approx(120 / 160), "acceptance_5m": pytest.approx(30 / 60),
        "mean_len": pytest.approx(3.0)}
    # the drafting requests fell out of the 5-minute window: the totals remain
    later = s.snapshot(NOW + 400)["draft"]
    assert later["acceptance_5m"] is None and later["accepted"] == 120


def test_no_draft_line_no_draft_figures() -> None:
    assert stats_of([req(NOW - 1), req(NOW - 2)], "mtp").snapshot(NOW)["draft"] is None


def test_zero_drafts_generated() -> None:
    draft = stats_of([req(NOW - 1, accepted=0, generated=0, mean_len=1.0)]).snapshot(NOW)["draft"]
    assert draft["acceptance"] is None and draft["acceptance_5m"] is None
    assert draft["mean_len"] == 1.0


def test_load_figures() -> None:
    load = Load({("CPU_Mapped", "model"): 3104.42, ("CUDA0", "model"): 920.22,
                 ("CUDA0", "KV"): 96.0}, [(4, 10), (1, 1)], NOW - 60.5, NOW - 60.0)
    snap = StartStats(NOW - 61).snapshot(NOW, load, in_flight=3)
    assert snap["memory_mib"] == {"CPU_Mapped model": 3104.42, "CUDA0 model": 920.22,
                                  "CUDA0 KV": 96.0}
    assert snap["offload"] == ["4/10", "1/1"]
    assert snap["load_seconds"] == pytest.approx(0.5)
    assert snap["in_flight"] == 3
    # the default verbosity prints no load line: unknown, not zero
    bare = StartStats(NOW).snapshot(NOW, Load(loading_at=NOW - 2))
    assert (bare["memory_mib"], bare["offload"], bare["load_seconds"]) == (None, None, None)


def test_memory_holds_only_the_window() -> None:
    """10,000 requests over 10 hours: the start's totals count all of them; the windows
    hold only the last 5 minutes' requests."""
    s = StartStats(NOW)
    every = 3.6
    for i in range(10_000):
        s.add(req(NOW + i * every, prompt=10, gen=5, slot=i % 4, task=i))
    end = NOW + 9_999 * every
    assert s.held == int(WINDOW / every) + 1 == 84
    snap = s.snapshot(end)
    assert (snap["requests"], snap["prompt_tokens"], snap["generated_tokens"]) == (
        10_000, 100_000, 50_000)
    assert snap["requests_per_min"] == 17.0     # 60 / 3.6, both ends in


def test_memory_is_bounded_at_any_rate() -> None:
    s = StartStats(NOW)
    for i in range(MAX_RECENT + 500):
        s.add(req(NOW + i * 1e-4))
    assert s.held == MAX_RECENT
    assert s.snapshot(NOW + 60)["requests"] == MAX_RECENT + 500


def test_summarize_is_a_window_of_the_past() -> None:
    """Only requests in [start, end]; 1m and 5m are the last minutes before ``end``;
    ``all`` and the counts the whole window; nothing in flight is known."""
    requests = [req(NOW - 7200, gen=999),                    # before the window
                req(NOW - 3000, prompt=400, prompt_ms=100.0),
                req(NOW - 200, prompt=100, prompt_ms=100.0, accepted=5, generated=10),
                req(NOW - 20, prompt=100, prompt_ms=100.0),
                req(NOW + 5, gen=999)]                       # after it
    out = summarize(requests, NOW - 3600, NOW, "draft")
    assert (out["requests"], out["requests_per_min"]) == (3, 1.0)
    assert (out["prompt_tokens"], out["generated_tokens"]) == (600, 150)
    assert out["prefill_tps"]["all"] == pytest.approx(600 / 300.0 * 1000)
    assert out["prefill_tps"]["5m"] == pytest.approx(200 / 200.0 * 1000)
    assert out["prefill_tps"]["1m"] == pytest.approx(1000.0)
    assert out["draft"]["kind"] == "draft" and out["draft"]["acceptance"] == 0.5
    assert out["in_flight"] is None and out["memory_mib"] is None
    # the bounds are inclusive
    assert summarize(requests, NOW - 3000, NOW - 20)["requests"] == 3


def test_summarize_and_a_running_start_agree() -> None:
    requests = [req(NOW - 500 + 7 * i, prompt=10 + i, prompt_ms=3.0 + i, gen=5 + 2 * i,
                    gen_ms=11.0 + i, accepted=i % 5, generated=5, mean_len=1.0 + i % 3)
                for i in range(70)]
    s = StartStats(NOW - 600, "mtp")
    for r in requests:
        s.add(r)
    live = s.snapshot(NOW, None, 0)
    past = summarize(requests, NOW - 600, NOW, "mtp")
    assert {**live, "in_flight": None} == past


def test_the_recorded_h200_start() -> None:
    """The real partial-offload run, end to end: parser, then figures."""
    log = EngineLog()
    at = NOW
    s = StartStats(NOW, "mtp")
    for line in (DATA / "engine-logs" / "b11434-cuda-h200-mid_auto.log").read_text().splitlines():
        at += 0.01
        r = log.feed(line, at)
        if r is not None:
            s.add(r)
    snap = s.snapshot(at, log.load, len(log.in_flight))
    assert snap["requests"] == 3
    assert (snap["prompt_tokens"], snap["generated_tokens"]) == (61 + 1091 + 1917, 64 + 32 + 300)
    assert snap["prefill_tps"]["all"] == pytest.approx(3069 / (177.95 + 109.90 + 143.96) * 1000)
    assert snap["decode_tps"]["all"] == pytest.approx(396 / (70.72 + 30.53 + 244.34) * 1000)
    assert snap["draft"] == {"kind": "mtp", "accepted": 294, "generated": 294,
                             "acceptance": 1.0, "acceptance_5m": 1.0,
                             "mean_len": pytest.approx((3.94 + 3.88 + 3.99) / 3)}
    assert snap["memory_mib"]["CUDA0 model"] == 3200.41
    assert snap["offload"] == ["10/10"] and snap["in_flight"] == 0


def test_a_running_start_agrees_with_a_recount_at_every_moment_late_requests_included() -> None:
    """The windows are kept incrementally (sums in, sums out, speeds in sorted lists):
    after every request they equal a recount of the same requests by :func:`summarize`,
    bit for bit, with requests arriving out of order (a slot finishing after a later
    one), idle gaps longer than the windows, and requests without drafts or tokens."""
    import random

    rnd = random.Random(14)
    s = StartStats(NOW - 10, "ngram")
    seen: list[Request] = []
    at = NOW
    for i in range(600):
        at += rnd.choice([0.01, 0.5, 2.0, 30.0, 400.0]) if i % 50 else 0.0
        late = at - rnd.choice([0.0, 0.0, 0.3, 1.5])           # completed a bit earlier
        r = req(late, prompt=rnd.choice([0, 7, 120]), prompt_ms=rnd.choice([0.0, 1.25, 33.5]),
                gen=rnd.randint(0, 64), gen_ms=rnd.choice([0.0, 9.99, 101.5]),
                accepted=rnd.choice([None, 3]), generated=rnd.choice([None, 5]),
                slot=i % 4, task=i)
        if (r.draft_accepted is None) != (r.draft_generated is None):
            r = req(late, accepted=None, generated=None, slot=i % 4, task=i)
        s.add(r)
        seen.append(r)
        live = s.snapshot(at)
        assert {**live, "in_flight": None} == summarize(seen, NOW - 10, at, "ngram"), i
    assert s.held <= len(seen)


def test_a_snapshot_of_an_earlier_moment_recounts_what_is_held() -> None:
    """The wall clock stepping back between two snapshots: the earlier moment's figures
    are recounted from the windows, not read from sums already moved past it."""
    s = stats_of([req(NOW - 50), req(NOW - 10)])
    assert s.snapshot(NOW + 30)["requests_per_min"] == 1.0   # NOW - 50 left the minute
    assert s.snapshot(NOW)["requests_per_min"] == 2.0        # both in NOW's minute again


def _load_of(name: str, lines: tuple[str, ...] = ()) -> Load:
    log = EngineLog()
    text = (DATA / "engine-logs" / name).read_text(errors="replace") if name else ""
    for i, line in enumerate([*lines, *text.splitlines()]):
        log.feed(line, NOW + i)
    return log.load


def test_a_gpu_engine_on_the_cpu_is_said() -> None:
    """Issue 44, item 3: the recorded Vulkan build without a device says "offloaded 3/3
    layers to GPU" with CPU buffers only; the Stats say it runs on the CPU."""
    snap = StartStats(NOW).snapshot(NOW, _load_of("vulkan-lavapipe-nodevice-lv4.log"))
    assert snap["offload"] == ["3/3"]
    assert "every buffer is in host memory" in snap["on_cpu"]
    # the healthy form: CUDA0 buffers (the recorded H200 load)
    snap = StartStats(NOW).snapshot(NOW, _load_of("b11434-cuda-h200-mid_auto.log"))
    assert snap["on_cpu"] is None
    # CUDA that failed to start (ggml-cuda.cu's format, before any load line), then the
    # default verbosity's load: no offload nor buffer line at all
    snap = StartStats(NOW).snapshot(NOW, _load_of("b11434-cuda-h200-mid_off.log", (
        "0.00.000.912 E ggml_cuda_init: failed to initialize CUDA: no CUDA-capable device "
        "is detected",)))
    assert snap["on_cpu"] == ("its GPU backend did not start (CUDA: no CUDA-capable device "
                              "is detected): the model runs on the CPU")
