"""lokid.core.telemetry.requestlog: real llama-server logs → requests and load figures, exactly; and
bad input (cut, interleaved, reordered, repeated, garbage lines) never raises and never
spoils another request's figures.

The logs are recorded real runs (tests/data/engine-logs/README.md): the b11434 CPU build
and the b11434 CUDA build on an H200, at ``-lv 4`` where load lines are wanted. Times
are taken from each line's own ``M.SS.mmm.uuu`` prefix, as the journal would give them.
"""

from __future__ import annotations

import random
import re

import pytest
from support import DATA

from lokid.core.telemetry import requestlog
from lokid.core.telemetry.requestlog import MAX_LINE, MAX_PENDING, EngineLog, Request

LOGS = DATA / "engine-logs"
_STAMP = re.compile(r"^(\d+)\.(\d+)\.(\d+)\.(\d+) [A-Z] ")
T0 = 1_764_547_200.0   # the epoch time of the engine's clock zero, as a caller would add it


def stamped(name: str) -> list[tuple[str, float]]:
    """The log's lines, each with its time: its own prefix, else the last line's."""
    at, out = T0, []
    for line in (LOGS / name).read_text().splitlines():
        m = _STAMP.match(line)
        if m:
            at = T0 + int(m[1]) * 60 + int(m[2]) + int(m[3]) / 1e3 + int(m[4]) / 1e6
        out.append((line, at))
    return out


def run(lines: list[tuple[str, float]] | list[str],
        log: EngineLog | None = None) -> tuple[EngineLog, list[Request]]:
    log = log or EngineLog()
    out = []
    for i, item in enumerate(lines):
        line, at = item if isinstance(item, tuple) else (item, T0 + i)
        r = log.feed(line, at)
        if r is not None:
            out.append(r)
    return log, out


def figures(r: Request) -> tuple[object, ...]:
    return (r.slot, r.task, r.prompt_tokens, r.prompt_ms, r.gen_tokens, r.gen_ms,
            r.draft_accepted, r.draft_generated, r.mean_len, r.n_tokens, r.truncated)


# (slot, task, prompt tokens, prompt ms, generated tokens, eval ms, draft accepted,
#  draft generated, mean len, n_tokens, truncated), read off the logs by hand.
MTP_47 = (47, 47, 3.94)
REQUESTS = {
    "b11434-cpu-A_full_mtp.log": [(3, 0, 59, 27.72, 64, 65.93, *MTP_47, 122, False)],
    "b11434-cpu-B_full_nospec.log": [(3, 0, 59, 16.64, 64, 15.56, None, None, None, 122,
                                      False)],
    "b11434-cpu-C_full_mtp_ngram.log": [(3, 0, 59, 5.54, 64, 29.01, 53, 53, 6.30, 122,
                                         False)],
    "b11434-cpu-H_noagree_mtp.log": [(3, 0, 59, 2.16, 64, 95.53, 0, 183, 1.00, 122, False)],
    "b11434-cpu-tiny-llama-ngram.log": [(3, 0, 986, 535.98, 300, 2236.18, 196, 216, 50.00,
                                         1285, False)],
    "b11434-cuda-h200-full_auto.log": [
        (3, 0, 61, 172.90, 64, 37.55, *MTP_47, 124, False),
        (3, 18, 22, 2.23, 64, 20.85, *MTP_47, 89, False),
        (2, 37, 1091, 14.32, 32, 20.33, 23, 23, 3.88, 1122, False),
        (1, 47, 1917, 69.86, 300, 84.45, 224, 224, 3.99, 2216, False)],
    "b11434-cuda-h200-mid_auto.log": [
        (3, 0, 61, 177.95, 64, 70.72, *MTP_47, 124, False),
        (2, 19, 1091, 109.90, 32, 30.53, 23, 23, 3.88, 1122, False),
        (1, 29, 1917, 143.96, 300, 244.34, 224, 224, 3.99, 2216, False)],
    "b11434-cuda-h200-mid_off.log": [
        (3, 0, 61, 153.10, 64, 78.16, None, None, None, 124, False),
        (2, 66, 1091, 57.01, 32, 39.69, None, None, None, 1122, False),
        (1, 99, 1917, 53.71, 300, 379.54, None, None, None, 2216, False)],
    "b11434-cuda-h200-mid_fitt_auto.log": [(3, 0, 61, 412.44, 64, 454.26, *MTP_47, 124,
                                            False)],
    "b11434-cuda-h200-fitt_auto.log": [(3, 0, 61, 151.15, 64, 53.95, *MTP_47, 124, False)],
    "b11434-cuda-h200-head_auto.log": [(3, 0, 61, 161.46, 64, 43.68, *MTP_47, 124, False)],
    "b11434-cuda-h200-draft_auto.log": [(3, 0, 61, 108.22, 64, 24.66, *MTP_47, 124, False)],
    "b11434-cuda-h200-ngl1_mtp.log": [(3, 0, 61, 148.80, 64, 30.32, *MTP_47, 124, False)],
    # no request completed: an abort at the first one, failed loads, a refused argument
    "b10434-vulkan-h200-mtp-abort-first-request.log": [],
    "b11434-cpu-F_plain_mtp.log": [],
    "b11434-cpu-G_trunk_mtp.log": [],
    "b11434-cpu-missingmd.log": [],
    "b11434-cpu-badtype.log": [],
    "vulkan-lavapipe-draft-lv4.log": [],
}

# The time of each request's release line (its ``at``), in the order above.
RELEASED_AT = {
    "b11434-cuda-h200-full_auto.log": [0.634543, 0.659035, 6.505097, 6.664876],
    "b11434-cuda-h200-mid_fitt_auto.log": [1.616538],
}

# acc per pos (printed at -lv 4 only) of the H200 logs with speculation
ACC_PER_POS = {
    "b11434-cuda-h200-full_auto.log": [(1.0, 1.0, 0.938), (1.0, 1.0, 0.938),
                                       (1.0, 1.0, 0.875), (1.0, 1.0, 0.987)],
    "b11434-cuda-h200-mid_off.log": [(), (), ()],
    "b11434-cpu-A_full_mtp.log": [()],
}


@pytest.mark.parametrize("name", sorted(REQUESTS))
def test_every_request_of_a_recorded_log(name: str) -> None:
    log, got = run(stamped(name))
    assert [figures(r) for r in got] == REQUESTS[name]
    assert log.flush(stamped(name)[-1][1]) == []


@pytest.mark.parametrize("name", sorted(RELEASED_AT))
def test_a_request_is_timed_by_its_release_line(name: str) -> None:
    _, got = run(stamped(name))
    assert [r.at for r in got] == pytest.approx([T0 + t for t in RELEASED_AT[name]])


@pytest.mark.parametrize("name", sorted(ACC_PER_POS))
def test_acceptance_by_draft_position(name: str) -> None:
    _, got = run(stamped(name))
    assert [r.acc_per_pos for r in got] == ACC_PER_POS[name]


@pytest.mark.parametrize("values", [
    "9" * 390 + ", 1.000",   # float() makes 1e390 inf of it, not an error
    "1e300, 1.000",
    "1.5, 0.938",            # a rate above 1
    "-0.5, 1.000",
    "1.000, , 0.938",
    "",
])
def test_acceptance_by_position_takes_rates_only(values: str) -> None:
    """The engine prints each draft position's acceptance as %.3f in [0, 1]: a list with
    anything else keeps the request's figures and drops only that list."""
    name = "b11434-cuda-h200-full_auto.log"
    lines = [line for line, _ in request_lines(name)]
    i = next(i for i, line in enumerate(lines) if "acc per pos" in line)
    lines[i] = lines[i][:lines[i].index("(") + 1] + values + ")"
    _, got = run(lines)
    assert [figures(r) for r in got] == REQUESTS[name]
    assert [r.acc_per_pos for r in got] == [(), *ACC_PER_POS[name][1:]]


# Memory per (device, kind) in MiB, read off the -lv 4 logs by hand. Model, KV and output
# buffers are summed over the model's and the draft's (or MTP context's) lines; compute
# over contexts, each context's latest reservation only (the MTP context reserves twice).
BUFFERS = {
    "b11434-cuda-h200-mid_fitt_auto.log": {
        ("CPU_Mapped", "model"): 3104.42, ("CUDA0", "model"): 920.22,
        ("CPU", "KV"): 192.00, ("CUDA0", "KV"): 64.00 + 32.00,
        ("CUDA0", "compute"): 192.00 + 51.02, ("CUDA_Host", "compute"): 40.02 + 24.01,
        ("CUDA_Host", "output"): 0.0},
    "b11434-cuda-h200-mid_auto.log": {
        ("CPU_Mapped", "model"): 4.05, ("CUDA0", "model"): 3200.41,
        ("CUDA0", "KV"): 256.00 + 32.00,
        ("CUDA0", "compute"): 112.01 + 40.01, ("CUDA_Host", "compute"): 40.02 + 24.01,
        ("CUDA_Host", "output"): 0.0},
    "b11434-cuda-h200-full_auto.log": {
        ("CPU_Mapped", "model"): 0.06, ("CUDA0", "model"): 0.54, ("CUDA0", "KV"): 3.00,
        ("CUDA0", "compute"): 82.15, ("CUDA_Host", "compute"): 16.78,
        ("CUDA_Host", "output"): 0.0},
    "b11434-cuda-h200-head_auto.log": {   # a separate MTP head file: its model buffers add
        ("CPU_Mapped", "model"): 0.06 + 0.06, ("CUDA0", "model"): 0.38 + 0.23,
        ("CUDA0", "KV"): 3.00, ("CUDA0", "compute"): 41.14 + 41.01,
        ("CUDA_Host", "compute"): 8.52 + 8.26, ("CUDA_Host", "output"): 0.0},
    "b11434-cuda-h200-draft_auto.log": {  # a draft model: reserved once per context
        ("CPU_Mapped", "model"): 0.12, ("CUDA0", "model"): 0.38 + 0.22, ("CUDA0", "KV"): 3.00,
        ("CUDA0", "compute"): 41.14 * 2, ("CUDA_Host", "compute"): 8.52 * 2,
        ("CUDA_Host", "output"): 0.0},
    "b11434-cuda-h200-ngl1_mtp.log": {
        ("CPU_Mapped", "model"): 0.61, ("CUDA0", "model"): 0.06, ("CPU", "KV"): 3.00,
        ("CUDA0", "compute"): 1.38 + 0.66, ("CUDA_Host", "compute"): 4.52 + 4.39,
        ("CUDA_Host", "output"): 0.0},
    "b11434-cuda-h200-fitt_auto.log": {   # --fit moved every layer off the GPU
        ("CPU_Mapped", "model"): 0.61, ("CPU", "KV"): 3.00, ("CPU", "output"): 0.0,
        ("CUDA0", "compute"): 1.38 + 0.66, ("CUDA_Host", "compute"): 4.52 + 4.39},
    "b10434-vulkan-h200-mtp-abort-first-request.log": {
        ("CPU_Mapped", "model"): 0.44, ("CPU", "KV"): 6.00, ("CPU", "output"): 0.0,
        ("CPU", "compute"): 10.02},
    "vulkan-lavapipe-draft-lv4.log": {
        ("CPU_Mapped", "model"): 0.06 + 0.28, ("Vulkan0", "model"): 0.38,
        ("Vulkan0", "KV"): 0.25, ("CPU", "KV"): 0.12,
        ("Vulkan0", "compute"): 1.51 + 1.02, ("Vulkan_Host", "compute"): 0.76 + 0.89,
        ("Vulkan_Host", "output"): 0.0, ("CPU", "output"): 0.0},
    "vulkan-lavapipe-ngl1-lv4.log": {
        ("CPU_Mapped", "model"): 0.44, ("Vulkan0", "model"): 0.06, ("CPU", "KV"): 1.00,
        ("Vulkan0", "compute"): 3.27, ("Vulkan_Host", "compute"): 2.39,
        ("Vulkan_Host", "output"): 0.0},
    # the default verbosity prints no load line at all
    "b11434-cuda-h200-mid_off.log": {},
    "b11434-cpu-A_full_mtp.log": {},
}

OFFLOADED = {
    "b11434-cuda-h200-mid_fitt_auto.log": [(4, 10)],
    "b11434-cuda-h200-mid_auto.log": [(10, 10)],
    "b11434-cuda-h200-full_auto.log": [(4, 4)],
    "b11434-cuda-h200-head_auto.log": [(3, 3), (4, 4)],
    "b11434-cuda-h200-draft_auto.log": [(3, 3), (2, 2)],
    "b11434-cuda-h200-ngl1_mtp.log": [(1, 4)],
    "b11434-cuda-h200-fitt_auto.log": [(0, 4)],
    "vulkan-lavapipe-draft-lv4.log": [(3, 3), (0, 2)],
    "b11434-cuda-h200-mid_off.log": [],
    "b11434-cpu-tiny-llama-ngram.log": [],
}

# From the ``loading model '…'`` line to ``llama_server: model loaded``, by their prefixes.
LOAD_SECONDS = {
    "b11434-cuda-h200-mid_fitt_auto.log": 0.625902 - 0.203445,
    "b11434-cuda-h200-mid_auto.log": 1.487774 - 0.224310,
    "b11434-cuda-h200-mid_off.log": 0.627224 - 0.104783,
    "b11434-cpu-tiny-llama-ngram.log": 0.281276 - 0.008565,
    "vulkan-lavapipe-draft-lv4.log": 16.824906 - 0.063578,
    "b11434-cpu-missingmd.log": None,   # never loaded
}


@pytest.mark.parametrize("name", sorted(BUFFERS))
def test_memory_per_device_and_kind(name: str) -> None:
    log, _ = run(stamped(name))
    assert log.load.buffers == {k: pytest.approx(v, abs=1e-9)
                                for k, v in BUFFERS[name].items()}


def test_the_real_partial_offload_shows_where_the_weights_are() -> None:
    """The H200 run where --fit left 4 of 10 layers on the GPU: 3104 MiB of weights in
    RAM (CPU_Mapped), 920 MiB on the device."""
    log, _ = run(stamped("b11434-cuda-h200-mid_fitt_auto.log"))
    assert log.load.offloaded == [(4, 10)]
    assert log.load.buffers[("CPU_Mapped", "model")] == 3104.42
    assert log.load.buffers[("CUDA0", "model")] == 920.22


@pytest.mark.parametrize("name", sorted(OFFLOADED))
def test_offloaded_lines_in_order(name: str) -> None:
    log, _ = run(stamped(name))
    assert log.load.offloaded == OFFLOADED[name]


@pytest.mark.parametrize("name", sorted(LOAD_SECONDS))
def test_load_seconds(name: str) -> None:
    log, _ = run(stamped(name))
    assert log.load.seconds == (None if LOAD_SECONDS[name] is None
                                else pytest.approx(LOAD_SECONDS[name], abs=1e-6))


def test_loading_and_loaded_are_the_servers_own_lines() -> None:
    """Not ``loading model tensors`` (also printed for a draft), not ``loading draft
    model '…'``, not ``error loading model``; the first ``loading model '…'`` counts."""
    log, _ = run([
        ("load_tensors: loading model tensors, this can take a while... (load_mode = mmap)",
         1.0),
        ("llama_model_load: error loading model: key not found", 2.0),
        ("common_speculative_init_result: loading draft model '/m/d.gguf'", 3.0),
        ("0.00.005.793 I srv    load_model: loading model 'full.gguf'", 10.0),
        ("srv    load_model: loading model 'again.gguf'", 11.0),
        ("srv  llama_server: model loaded", 12.5),
        ("srv  llama_server: model loaded", 20.0),
    ])
    assert (log.load.loading_at, log.load.loaded_at, log.load.seconds) == (10.0, 12.5, 2.5)


def test_the_prefix_is_optional() -> None:
    """Lines with the ``0.00.043.866 I `` prefix and without it read the same."""
    lines = stamped("b11434-cuda-h200-full_auto.log")
    bare = [(_STAMP.sub("", line), at) for line, at in lines]
    assert bare != lines
    a, ra = run(lines)
    b, rb = run(bare)
    assert ra == rb and a.load == b.load and a.known_lines == b.known_lines


def test_known_lines_counts_what_the_parser_read() -> None:
    """Every request, load and context line of a log, and nothing else: a changed format
    shows as no known lines (the caller's breakage warning)."""
    log, _ = run(stamped("b11434-cuda-h200-mid_off.log"))
    # 3 requests × (launch, prompt, eval, total, graphs, release) + loading + loaded
    assert log.known_lines == 3 * 6 + 2
    changed = [(line.replace("print_timing", "timings").replace("release", "done")
                .replace("processing task", "working").replace("model loaded", "ready")
                .replace("loading model", "opening model"), at)
               for line, at in stamped("b11434-cuda-h200-mid_off.log")]
    log, got = run(changed)
    assert (log.known_lines, got) == (0, [])


def test_in_flight_follows_launch_and_release() -> None:
    lines = stamped("b11434-cuda-h200-full_auto.log")
    log = EngineLog()
    seen = []
    for line, at in lines:
        log.feed(line, at)
        if "processing task" in line or "stop processing" in line:
            seen.append(set(log.in_flight))
    assert seen == [{(3, 0)}, set(), {(3, 18)}, set(), {(2, 37)}, set(), {(1, 47)}, set()]


def test_a_request_the_engine_died_in_stays_in_flight() -> None:
    """The Vulkan engine aborted on its first request: launched, never timed or released.
    It is in flight until the caller flushes (the engine stopped); it yields no record."""
    lines = stamped("b10434-vulkan-h200-mtp-abort-first-request.log")
    log, got = run(lines)
    assert got == [] and log.in_flight == {(3, 0)}
    assert log.flush(lines[-1][1]) == [] and log.in_flight == set()


def test_flush_returns_a_timed_request_without_its_release() -> None:
    """The engine stopped between the timing lines and the release: the request is still
    counted, at the time of its last timing line, without the release's n_tokens."""
    lines = [(line, at) for line, at in stamped("b11434-cuda-h200-fitt_auto.log")
             if "release:" not in line]
    log, got = run(lines)
    assert got == []
    flushed = log.flush(T0 + 10.0)
    assert [figures(r) for r in flushed] == [(3, 0, 61, 151.15, 64, 53.95, *MTP_47, None,
                                              False)]
    assert flushed[0].at == pytest.approx(T0 + 0.549812)   # its acc per pos line
    assert log.flush(T0 + 11.0) == []   # once


def test_flush_never_dates_a_request_after_the_stop() -> None:
    log = EngineLog()
    log.feed("slot print_timing: id  0 | task 5 | prompt eval time = 1.00 ms / 2 tokens", 50.0)
    log.feed("slot print_timing: id  0 | task 5 |        eval time = 3.00 ms / 4 tokens", 50.0)
    assert [r.at for r in log.flush(40.0)] == [40.0]


def test_a_truncated_release_flag() -> None:
    _, got = run(["slot print_timing: id  0 | task 1 | prompt eval time = 1.00 ms / 2 tokens",
                  "slot print_timing: id  0 | task 1 | eval time = 3.00 ms / 4 tokens",
                  "slot      release: id  0 | task 1 | stop processing: n_tokens = 4096, "
                  "truncated = 1"])
    assert [(r.n_tokens, r.truncated) for r in got] == [(4096, True)]


# ---- bad input --------------------------------------------------------------------


def request_lines(name: str) -> list[tuple[str, float]]:
    """The lines of a log that belong to requests (launch, timing, release)."""
    return [(line, at) for line, at in stamped(name)
            if "| task " in line and ("print_timing" in line or "release:" in line
                                      or "processing task" in line)]


def key_of(line: str) -> tuple[int, int]:
    m = re.search(r"id +(\d+) \| task +(\d+)", line)
    assert m
    return int(m[1]), int(m[2])


def expected(name: str) -> dict[tuple[int, int], tuple[object, ...]]:
    return {(f[0], f[1]): f for f in REQUESTS[name]}


def consistent(r: Request, want: tuple[object, ...]) -> bool:
    """Every figure of ``r`` is the true one, or missing: a damaged line may lose a figure,
    never change one."""
    got = figures(r)
    required = got[:6] == want[:6]
    optional = all(g is None or g == w for g, w in zip(got[6:10], want[6:10], strict=True))
    return required and optional and got[10] == want[10]


@pytest.mark.parametrize("strip", [False, True], ids=["prefixed", "bare"])
def test_every_prefix_of_every_request_line(strip: bool) -> None:
    """Each request line of a real four-request log, cut at every length in turn (the
    journal or a pipe may cut a line): nothing raises, every other request comes out
    exactly, and the damaged one is absent or right in every figure it has."""
    name = "b11434-cuda-h200-full_auto.log"
    lines = [(_STAMP.sub("", line) if strip else line, at) for line, at in request_lines(name)]
    want = expected(name)
    cases = 0
    for i, (line, _) in enumerate(lines):
        damaged = key_of(line)
        for cut in range(len(line)):
            variant = lines[:i] + [(line[:cut], lines[i][1])] + lines[i + 1:]
            log, got = run(variant)
            got += log.flush(T0 + 100)
            by_key = {(r.slot, r.task): r for r in got}
            assert len(by_key) == len(got)
            for key, w in want.items():
                acc = ACC_PER_POS[name][list(want).index(key)]
                if key == damaged:
                    r = by_key.get(key)
                    assert r is None or (consistent(r, w) and r.acc_per_pos in (acc, ())), (
                        line[:cut], key)
                else:
                    assert figures(by_key[key]) == w, (line[:cut], key)
                    assert by_key[key].acc_per_pos == acc
            cases += 1
    assert cases > 3000


def test_two_slots_interleaved_any_way() -> None:
    """Two real requests on slots 2 and 1 (task 37 and 47), their lines merged in 200
    random interleavings (each request's own order kept): both come out exactly."""
    name = "b11434-cuda-h200-full_auto.log"
    lines = [line for line, _ in request_lines(name)]
    a = [line for line in lines if key_of(line) == (2, 37)]
    b = [line for line in lines if key_of(line) == (1, 47)]
    assert len(a) == len(b) == 8
    want = expected(name)
    rng = random.Random(14)
    for _ in range(200):
        ia, ib, merged = iter(a), iter(b), []
        for pick in rng.sample([0] * len(a) + [1] * len(b), len(a) + len(b)):
            merged.append(next(ia) if pick == 0 else next(ib))
        log, got = run(merged)
        assert sorted(figures(r) for r in got) == sorted([want[(2, 37)], want[(1, 47)]])
        assert log.in_flight == set()


def test_timing_lines_in_any_order_before_the_release() -> None:
    """Four requests' timing lines shuffled together (an eval line before its prompt line,
    one slot's lines among another's), each release last: every request exact."""
    name = "b11434-cuda-h200-full_auto.log"
    lines = [line for line, _ in request_lines(name)]
    timings = [line for line in lines if "print_timing" in line]
    releases = [line for line in lines if "release:" in line]
    rng = random.Random(7)
    for _ in range(50):
        rng.shuffle(timings)
        _, got = run(timings + releases)
        assert [figures(r) for r in got] == REQUESTS[name]


def test_a_release_without_timings_yields_nothing_and_spoils_nothing() -> None:
    name = "b11434-cuda-h200-mid_off.log"
    lines = [line for line, _ in request_lines(name)]
    orphan = "slot      release: id  2 | task 5 | stop processing: n_tokens = 9, truncated = 0"
    # a release line whose timing lines were lost, in the middle of another slot's request
    log, got = run(lines[:3] + [orphan] + lines[3:])
    assert [figures(r) for r in got] == REQUESTS[name]
    assert log.flush(T0 + 100) == []


def test_a_release_with_half_the_figures_yields_nothing() -> None:
    """Decided: a request needs both its prompt and its eval figures; a release that
    finds only one ends the assembly with nothing (no half request in the totals)."""
    log, got = run([
        "slot print_timing: id  0 | task 3 | prompt eval time = 5.00 ms / 10 tokens (…)",
        "slot      release: id  0 | task 3 | stop processing: n_tokens = 10, truncated = 0",
        "slot print_timing: id  1 | task 4 |        eval time = 5.00 ms / 10 tokens (…)",
        "slot print_timing: id  1 | task 4 | draft acceptance = 1.00000 (   3 accepted /"
        "     3 generated), mean len =  4.00",
        "slot      release: id  1 | task 4 | stop processing: n_tokens = 10, truncated = 0",
    ])
    assert got == [] and log.flush(T0 + 9) == []


def test_a_duplicate_release_and_late_lines() -> None:
    """A release seen twice gives one request; a timing line arriving after its release
    starts nothing that ever comes out, and changes nothing already returned."""
    name = "b11434-cuda-h200-mid_auto.log"
    lines = [line for line, _ in request_lines(name)]
    release = next(line for line in lines if "release:" in line)
    late = next(line for line in lines if "acc per pos" in line).replace("0.938", "0.500")
    i = lines.index(release) + 1
    log, got = run(lines[:i] + [release, late.replace("(1.000", "(9.000"), release]
                   + lines[i:])
    assert [figures(r) for r in got] == REQUESTS[name]
    assert log.flush(T0 + 100) == []


def test_the_same_timing_line_twice_is_harmless() -> None:
    name = "b11434-cpu-A_full_mtp.log"
    lines = [line for line, _ in request_lines(name)]
    doubled = [line for line in lines for _ in range(2)]
    _, got = run(doubled)
    assert [figures(r) for r in got] == REQUESTS[name]


GARBAGE = [
    "",
    " ",
    "\x00\x01\x02\xff\xfe",
    bytes(range(256)).decode("latin-1"),
    b"\xc3\x28\xa0\xa1slot print_timing".decode("utf-8", "surrogateescape"),
    "| task ",
    "slot print_timing: id | task | prompt eval time = ms / tokens",
    "slot print_timing: id  x | task y | prompt eval time = 1.0 ms / 2 tokens",
    "slot print_timing: id  3 | task 0 | prompt eval time = -1.00 ms / -5 tokens",
    "slot print_timing: id  3 | task 0 | prompt eval time = 1e9 ms / 2 tokens",
    "slot print_timing: id  3 | task 0 | prompt eval time = nan ms / 2 tokens",
    "slot print_timing: id  3 | task 0 | draft acceptance = 1.0 (x accepted / y generated)",
    "slot print_timing: id  3 | task 0 |      acc per pos = (1.0.0, ,)",
    "slot      release: id  3 | task 0 | stop processing: n_tokens = , truncated = 0",
    "slot      release: id  3 | task 0 | stop processing: n_tokens = 1, truncated = 7",
    "slot launch_slot_: id  | task 0 | processing task",
    "CUDA0 model buffer size = lots MiB",
    "buffer size = 1.00 MiB",
    "offloaded -1/4 layers to GPU",
    "offloaded 1/ layers to GPU",
    "x" * 1_000_000,
    "slot print_timing: id  3 | task 0 | prompt eval time = 1.00 ms / 2 tokens" + " " * MAX_LINE,
    "slot print_timing: id  3 | task 0 | prompt eval time = 1.00 ms / " + "9" * 4000
    + " tokens",
    "slot print_timing: id  " + "9" * 4000 + " | task 0 | eval time = 1.00 ms / 2 tokens",
    "sched_reserve: reserving ...",
    "llama_context: constructing llama_context",
]


def test_garbage_lines_among_real_ones() -> None:
    """Binary, empty, very long and malformed lines between every real line: nothing
    raises, the real requests and load come out exactly."""
    name = "b11434-cuda-h200-mid_auto.log"
    real = stamped(name)
    mixed: list[tuple[str, float]] = []
    for i, (line, at) in enumerate(real):
        mixed += [(line, at), (GARBAGE[i % len(GARBAGE)], at)]
    log, got = run(mixed)
    assert [figures(r) for r in got] == REQUESTS[name]
    assert log.load.offloaded == OFFLOADED[name]


@pytest.mark.parametrize("line", GARBAGE, ids=range(len(GARBAGE)))
def test_a_garbage_line_alone(line: str) -> None:
    log = EngineLog()
    assert log.feed(line, 1.0) is None
    assert log.flush(2.0) == []


def test_a_line_too_long_is_not_read() -> None:
    line = "slot launch_slot_: id  3 | task 0 | processing task, is_child = 0"
    log = EngineLog()
    log.feed(line + " " * (MAX_LINE - len(line) + 1), 1.0)
    assert log.in_flight == set() and log.known_lines == 0
    log.feed(line, 1.0)
    assert log.in_flight == {(3, 0)}


def test_pending_assemblies_are_bounded() -> None:
    """Tasks whose release never comes (lost lines) cannot grow the parser without bound:
    beyond MAX_PENDING the oldest assembly goes; the newest are still flushed."""
    log = EngineLog()
    n = MAX_PENDING * 4
    for task in range(n):
        log.feed(f"slot print_timing: id  1 | task {task} | prompt eval time = 1.00 ms / "
                 f"{task + 1} tokens (…)", float(task))
        log.feed(f"slot print_timing: id  1 | task {task} |        eval time = 2.00 ms / "
                 "4 tokens (…)", float(task))
    assert log.pending == MAX_PENDING
    flushed = log.flush(float(n))
    assert [r.task for r in flushed] == list(range(n - MAX_PENDING, n))
    assert all(r.prompt_tokens == r.task + 1 for r in flushed)


def test_in_flight_is_bounded_and_one_task_per_slot() -> None:
    """A slot runs one task at a time: a launch replaces that slot's task whose release
    was lost; launches on ever new slot numbers (garbage) stay bounded."""
    log = EngineLog()
    log.feed("slot launch_slot_: id  3 | task 0 | processing task, is_child = 0", 1.0)
    log.feed("slot launch_slot_: id  3 | task 7 | processing task, is_child = 0", 2.0)
    log.feed("slot launch_slot_: id  2 | task 8 | processing task, is_child = 0", 2.0)
    assert log.in_flight == {(3, 7), (2, 8)}
    for slot in range(10 * MAX_PENDING):
        log.feed(f"slot launch_slot_: id {slot} | task {slot} | processing task", 3.0)
    assert len(log.in_flight) <= MAX_PENDING


def test_a_re_reservation_replaces_the_context_figure() -> None:
    """Each compute line gives the scheduler's whole size (ggml_backend_sched_get_buffer_size):
    a second reservation of one context replaces, two contexts add."""
    log, _ = run([
        "llama_context: constructing llama_context",
        "sched_reserve: reserving ...",
        "sched_reserve:      CUDA0 compute buffer size =   192.00 MiB",
        "sched_reserve:  CUDA_Host compute buffer size =    40.02 MiB",
        "llama_context: constructing llama_context",
        "sched_reserve: reserving ...",
        "sched_reserve:      CUDA0 compute buffer size =    51.02 MiB",
        "sched_reserve:  CUDA_Host compute buffer size =    24.01 MiB",
        "sched_reserve: reserving ...",
        "sched_reserve:      CUDA0 compute buffer size =    60.00 MiB",   # Host now ≤ 1 byte
    ])
    assert log.load.buffers == {("CUDA0", "compute"): 252.0, ("CUDA_Host", "compute"): 40.02}


def test_buffer_lines_of_every_recorded_form() -> None:
    """Devices with underscores and digits, every kind (RS: recurrent state), with or
    without the function name and prefix; a cut line adds nothing."""
    log, _ = run([
        "0.00.249.364 I load_tensors:   CPU_Mapped model buffer size =  3104.42 MiB",
        "load_tensors:        CUDA0 model buffer size =   920.22 MiB",
        "llama_kv_cache:      CUDA0 KV buffer size =   256.00 MiB",
        "llama_memory_recurrent:      CUDA1 RS buffer size =     1.50 MiB",
        "llama_context:  CUDA_Host  output buffer size =     0.97 MiB",
        "      Vulkan0 KV buffer size =     0.25 MiB",
        "load_tensors:   CPU_REPACK model buffer size =   100.00 MiB",
        "load_tensors:        CUDA0 model buffer size =   920.2",
        "load_tensors:        CUDA0 model buffer size =  1000.00 MiB",
    ])
    assert log.load.buffers == {
        ("CPU_Mapped", "model"): 3104.42, ("CUDA0", "model"): 1920.22, ("CUDA0", "KV"): 256.0,
        ("CUDA1", "RS"): 1.5, ("CUDA_Host", "output"): 0.97, ("Vulkan0", "KV"): 0.25,
        ("CPU_REPACK", "model"): 100.0}


def test_the_module_documents_its_limits() -> None:
    doc = requestlog.__doc__ or ""
    assert "MAX_PENDING" in doc and "MAX_LINE" in doc
    assert MAX_LINE < 4300   # int() refuses longer digit strings; a line cannot hold one


def test_load_figures_are_bounded() -> None:
    """Garbage that looks like load lines (ever new device names, endless offloaded
    lines) cannot grow the load figures without bound."""
    log = EngineLog()
    for i in range(10 * requestlog.MAX_LOAD_ENTRIES):
        log.feed(f"load_tensors: DEV{i} model buffer size = 1.00 MiB", 1.0)
        log.feed(f"sched_reserve: DEV{i} compute buffer size = 1.00 MiB", 1.0)
        log.feed("load_tensors: offloaded 1/2 layers to GPU", 1.0)
    assert len(log.load.offloaded) == requestlog.MAX_LOAD_ENTRIES
    assert len(log.load.buffers) <= 2 * requestlog.MAX_LOAD_ENTRIES
    log.feed("load_tensors: DEV0 model buffer size = 1.00 MiB", 2.0)   # a known key still adds
    assert log.load.buffers[("DEV0", "model")] == 2.0
