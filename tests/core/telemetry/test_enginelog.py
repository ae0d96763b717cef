"""lokid.core.telemetry.enginelog: real llama-server lines → events, and the offload verdict
of a load."""

from __future__ import annotations

import pytest
from support import DATA

from lokid.core.telemetry.enginelog import LoadTracker, parse_line

LOGS = DATA / "engine-logs"


def offload_of(text: str) -> tuple[int, int]:
    """The (N, M) the journal watcher would judge for a whole log: its last load's."""
    tracker = LoadTracker()
    for line in text.splitlines():
        tracker.feed(line)
    return tracker.current.offload() if tracker.current else (0, 0)


def log(name: str) -> str:
    return (LOGS / name).read_text()


@pytest.mark.parametrize("line,kind,detail", [
    ("0.00.008.565 I srv    load_model: loading model '/models/tiny.gguf'", "loading",
     "/models/tiny.gguf"),
    ("0.00.043.866 I load_tensors: offloaded 0/3 layers to GPU", "offloaded", (0, 3)),
    ("load_tensors: offloaded 65/65 layers to GPU", "offloaded", (65, 65)),
    ("0.00.281.276 I srv  llama_server: model loaded", "loaded", ""),
    ("0.00.281.324 I srv  llama_server: listening on http://127.0.0.1:18080", "listening",
     "http://127.0.0.1:18080"),
    ("0.00.015.341 E common_speculative_init_result: failed to create MTP context",
     "mtp_failed", ""),
    ("0.00.015.324 W llama_init_from_model: context type MTP requested but model doesn't "
     "contain MTP layers", "mtp_missing", ""),
    ('llama.cpp/src/models/glm4-moe.cpp:147: GGML_ASSERT(layer.nextn.eh_proj && "MTP block '
     'missing nextn.eh_proj") failed', "mtp_missing", ""),
    ("0.00.010.000 E common_speculative_init_result: failed to load draft model, "
     "'/models/d.gguf'", "draft_failed", ""),
    # ggml-cuda.cu's format string: "%s: allocating %.2f MiB on device %d: cudaMalloc failed: %s"
    ("E ggml_backend_cuda_buffer_type_alloc_buffer: allocating 9628.34 MiB on device 0: "
     "cudaMalloc failed: out of memory", "oom", ""),
    ("0.00.017.669 E srv  llama_server: exiting due to model loading error", "load_failed", ""),
    ("0.00.353.071 I slot get_availabl: id  3 | task -1 | selected slot by LRU", None, ""),
    ("0.00.043.638 I load_tensors: loading model tensors, this can take a while... "
     "(load_mode = mmap)", None, ""),
    ("0.00.261.705 I srv    load_model: initializing, n_slots = 4", None, ""),
])
def test_parse_line(line: str, kind: str | None, detail: object) -> None:
    event = parse_line(line)
    if kind is None:
        assert event is None
        return
    assert event is not None and event.kind == kind
    if kind == "offloaded":
        assert (event.n, event.m) == detail
    elif detail:
        assert event.path == detail


def test_recorded_fit_log_shows_layers_pushed_to_ram() -> None:
    tracker = LoadTracker()
    for line in log("vulkan-lavapipe-fit-target-lv4.log").splitlines():
        tracker.feed(line)
    load = tracker.current
    assert load is not None and load.path == "/models/tiny.gguf"
    assert load.offload() == (0, 3) and load.loaded and load.listening
    assert load.layers_in_ram() == ("only 0/3 layers on GPU with the draft: --fit moved "
                                    "layers to RAM")


def test_recorded_partial_ngl_log() -> None:
    assert offload_of(log("vulkan-lavapipe-ngl1-lv4.log")) == (1, 3)


def test_a_cpu_build_never_concludes_anything() -> None:
    tracker = LoadTracker()
    for line in log("b11434-cpu-A_full_mtp.log").splitlines():
        tracker.feed(line)
    assert tracker.current is not None and tracker.current.offload() == (0, 0)
    assert tracker.current.layers_in_ram() == "" and tracker.current.loaded


@pytest.mark.parametrize("name,kinds", [
    ("b11434-cpu-F_plain_mtp.log", {"mtp_missing", "mtp_failed", "load_failed"}),
    ("b11434-cpu-G_trunk_mtp.log", {"mtp_missing"}),
    ("b11434-cpu-missingmd.log", {"load_failed"}),
])
def test_recorded_failures_are_recognised(name: str, kinds: set[str]) -> None:
    tracker = LoadTracker()
    for line in log(name).splitlines():
        tracker.feed(line)
    load = tracker.current or tracker.before
    assert kinds <= {e.kind for e in load.errors}
    assert not load.listening


# The reference's own review found these: each line below is a real b11434 format.
SERVER_LOAD = "0.00.008.565 I srv    load_model: loading model '/models/big.gguf'"
INIT_AFTER = "0.00.261.705 I srv    load_model: initializing, n_slots = 4, n_ctx_slot = 4096"
TENSORS = "0.00.043.638 I load_tensors: loading model tensors, this can take a while..."


def test_the_load_starts_at_the_servers_loading_model_line_not_at_initializing() -> None:
    text = "\n".join([SERVER_LOAD, TENSORS, "load_tensors: offloaded 30/65 layers to GPU",
                      INIT_AFTER, "llama_server: model loaded"])
    assert offload_of(text) == (30, 65)


def test_a_separately_loaded_draft_cannot_hide_the_model() -> None:
    # model partly in RAM, then the draft's own tensors and full offload line
    text = "\n".join([SERVER_LOAD, TENSORS, "load_tensors: offloaded 30/65 layers to GPU",
                      TENSORS, "load_tensors: offloaded 5/5 layers to GPU"])
    assert offload_of(text) == (30, 65)


def test_the_worse_of_model_and_draft_counts() -> None:
    text = "\n".join([SERVER_LOAD, TENSORS, "load_tensors: offloaded 65/65 layers to GPU",
                      TENSORS, "load_tensors: offloaded 2/5 layers to GPU"])
    assert offload_of(text) == (2, 5)
    full = "\n".join([SERVER_LOAD, "load_tensors: offloaded 65/65 layers to GPU",
                      "load_tensors: offloaded 5/5 layers to GPU"])
    assert offload_of(full) == (65, 65)


def test_only_the_last_load_counts() -> None:
    text = "\n".join([SERVER_LOAD, "load_tensors: offloaded 10/65 layers to GPU",
                      SERVER_LOAD, "load_tensors: offloaded 65/65 layers to GPU"])
    assert offload_of(text) == (65, 65)


def test_no_loading_line_means_nothing_to_conclude() -> None:
    assert offload_of("load_tensors: offloaded 10/65 layers to GPU") == (0, 0)


def test_recorded_draft_kept_on_cpu_is_the_worse_offload() -> None:
    """Real Vulkan log: target -ngl 99 (3/3 on GPU), draft -ngld 0 (0/2) in one load."""
    text = log("vulkan-lavapipe-draft-lv4.log")
    assert "offloaded 3/3 layers to GPU" in text
    assert offload_of(text) == (0, 2)


def _alternatives(pattern: str) -> list[str]:
    """The top-level alternatives of a regular expression's source."""
    out, depth, start = [], 0, 0
    for i, c in enumerate(pattern):
        if c == "(" and pattern[i - 1:i] != "\\":
            depth += 1
        elif c == ")" and pattern[i - 1:i] != "\\":
            depth -= 1
        elif c == "|" and depth == 0:
            out.append(pattern[start:i])
            start = i + 1
    return [*out, pattern[start:]]


def test_every_error_pattern_contains_a_word_of_the_prefilter() -> None:
    """parse_line tests a serving engine's line for a few words before the error
    patterns: each alternative of each pattern must contain one of them literally."""
    from lokid.core.telemetry import enginelog

    for kind, pattern in enginelog._ERRORS:
        for alternative in _alternatives(pattern.pattern):
            assert any(w in alternative for w in enginelog._ERROR_WORDS), (kind, alternative)


def test_the_prefilter_changes_no_event_of_any_recorded_log() -> None:
    from lokid.core.telemetry import enginelog

    def unfiltered(line: str) -> enginelog.Event | None:
        text = enginelog._text(line)
        return next((enginelog.Event(kind, text) for kind, pattern in enginelog._ERRORS
                     if pattern.search(text)), None)

    lines = [line for path in sorted(LOGS.glob("*.log"))
             for line in path.read_text(errors="replace").splitlines()]
    assert len(lines) > 3_000
    errors = 0
    for line in lines:
        event = parse_line(line)
        if event is None or event.kind not in ("offloaded", "loading", "loaded", "listening",
                                                "buffer", "gpu_failed"):
            assert event == unfiltered(line), line
            errors += event is not None
    assert errors > 5  # the recorded failures are among them


# Lines a broken or hostile engine (or a garbage line in the journal) may print: each is
# read without raising, and none yields a number or field past the module's bounds.
HOSTILE = [
    "load_tensors: offloaded " + "9" * 5000 + "/33 layers to GPU",
    "load_tensors: offloaded 1/" + "9" * 5000 + " layers to GPU",
    "load_tensors: offloaded 9999999999/33 layers to GPU",
    "load_tensors: offloaded -1/33 layers to GPU",
    "load_tensors: offloaded 1.5/33 layers to GPU",
    "load_tensors: offloaded 1e9/33 layers to GPU",
    "load_tensors: offloaded /33 layers to GPU",
    "srv    load_model: loading model '" + "x" * 100_000 + "'",
    "srv  llama_server: listening on http://" + "h" * 100_000,
    "0" * 100_000 + ".1.1.1 I CUDA error: " + "e" * 100_000,
    "9" * 5000 + "." + "9" * 5000 + ".0.0 I srv  llama_server: model loaded",
    "\x00\xff" * 10_000 + "out of memory",
    "",
]


@pytest.mark.parametrize("line", HOSTILE, ids=range(len(HOSTILE)))
def test_a_hostile_line_is_read_within_bounds(line: str) -> None:
    from lokid.core.telemetry import enginelog

    event = parse_line(line)
    if event is not None:
        assert len(event.text) <= enginelog.MAX_TEXT and len(event.path) <= enginelog.MAX_FIELD
        bound = 10 ** enginelog.MAX_DIGITS
        assert 0 <= event.n < bound and 0 <= event.m < bound
        assert event.kind != "offloaded"   # none of these is a layer count the engine printed


def test_hostile_lines_among_a_real_load_change_nothing() -> None:
    """The recorded --fit load with every hostile line after each of its lines: the same
    path, offload verdict, readiness and address as the load alone."""
    real = log("vulkan-lavapipe-fit-target-lv4.log").splitlines()
    tracker = LoadTracker()
    for i, line in enumerate(real):
        tracker.feed(line)
        if i > 0 and "loading model '" not in real[i - 1]:
            for bad in HOSTILE:
                if "loading model '" not in bad:   # a new load would, rightly, start
                    tracker.feed(bad)
    load = tracker.current
    assert load is not None and load.path == "/models/tiny.gguf"
    assert load.offload() == (0, 3) and load.loaded
    assert load.listening.startswith("http://127.0.0.1:")


def test_a_loading_line_with_a_huge_path_starts_no_load() -> None:
    from lokid.core.telemetry import enginelog

    tracker = LoadTracker()
    tracker.feed(SERVER_LOAD)
    tracker.feed("srv    load_model: loading model '" + "x" * (enginelog.MAX_FIELD + 1) + "'")
    assert tracker.current is not None and tracker.current.path == "/models/big.gguf"


def test_error_lines_of_a_load_are_counted_and_only_a_few_kept() -> None:
    """100,000 "CUDA error" lines of 4 KB once stayed in the daemon whole (34 → 441 MiB):
    the load counts them and keeps the first and last few, each cut to MAX_TEXT."""
    from lokid.core.telemetry import enginelog

    n = 20_000
    tracker = LoadTracker()
    tracker.feed(SERVER_LOAD)
    tracker.feed("load_tensors: offloaded 30/65 layers to GPU")
    tracker.feed("E common_speculative_init_result: failed to load draft model, '/m/d.gguf'")
    for i in range(n):
        tracker.feed(f"E ggml_cuda_error: CUDA error {i:06d} " + "x" * 4096)
    tracker.feed("0.00.017.669 E srv  llama_server: exiting due to model loading error")
    load = tracker.current
    assert load is not None
    assert load.errors_seen == n + 2
    assert load.error_kinds == {"draft_failed", "gpu_error", "load_failed"}
    kept = load.errors
    assert len(kept) == enginelog.FIRST_ERRORS + enginelog.LAST_ERRORS
    assert all(len(e.text) <= enginelog.MAX_TEXT for e in kept)
    assert sum(len(e.text) for e in kept) <= 10 * enginelog.MAX_TEXT
    # the first lines (the cause) and the last (the end) are the right ones, in order
    assert kept[0].kind == "draft_failed"
    assert [e.text.split()[4] for e in kept[1:enginelog.FIRST_ERRORS]] == [
        f"{i:06d}" for i in range(enginelog.FIRST_ERRORS - 1)]
    assert kept[-1].kind == "load_failed" and kept[-1].text.endswith("model loading error")
    assert [e.text.split()[4] for e in kept[enginelog.FIRST_ERRORS:-1]] == [
        f"{i:06d}" for i in range(n - enginelog.LAST_ERRORS + 1, n)]
    assert kept[1].text.endswith("…")
    # and the verdict still comes from the offload line
    assert load.offload() == (30, 65) and "30/65" in load.layers_in_ram()


def test_offload_lines_are_bounded_and_the_verdict_still_exact() -> None:
    from lokid.core.telemetry import enginelog

    tracker = LoadTracker()
    tracker.feed(SERVER_LOAD)
    for _ in range(10 * enginelog.MAX_OFFLOADS):
        tracker.feed("load_tensors: offloaded 65/65 layers to GPU")
    tracker.feed("load_tensors: offloaded 2/5 layers to GPU")   # past the bound, it decides
    tracker.feed("load_tensors: offloaded 0/5 layers to GPU")   # the first N < M decides
    load = tracker.current
    assert load is not None and len(load.offloads) == enginelog.MAX_OFFLOADS
    assert load.offload() == (2, 5)
    # M = 0 lines decide nothing until a real one comes, as before
    zero = LoadTracker()
    for line in (SERVER_LOAD, "offloaded 0/0 layers to GPU", "offloaded 3/3 layers to GPU",
                 "offloaded 4/4 layers to GPU"):
        zero.feed(line)
    assert zero.current is not None and zero.current.offload() == (3, 3)


def test_the_module_documents_its_bounds() -> None:
    from lokid.core.telemetry import enginelog

    doc = enginelog.__doc__ or ""
    for name in ("MAX_DIGITS", "MAX_FIELD", "MAX_LINE", "MAX_TEXT", "FIRST_ERRORS",
                 "LAST_ERRORS", "MAX_OFFLOADS"):
        assert name in doc, name
    assert enginelog.MAX_LINE < 4300 and enginelog.MAX_DIGITS < 4300


# Issue 44, item 3: a GPU engine running on the CPU.

def load_of(text: str):  # type: ignore[no-untyped-def]
    tracker = LoadTracker()
    for line in text.splitlines():
        tracker.feed(line)
    assert tracker.current is not None
    return tracker.current


@pytest.mark.parametrize("name", ["b11434-cpu-rpc-ngl99-lv4.log",
                                  "vulkan-lavapipe-nodevice-lv4.log"])
def test_rpc_build_says_offloaded_with_cpu_buffers_only(name: str) -> None:
    # the recorded b11434 CPU build (with RPC), and the Vulkan build (with RPC) on a host
    # where Vulkan finds no usable device: "offloaded 3/3 layers to GPU", every buffer
    # CPU / CPU_Mapped
    load = load_of((LOGS / name).read_text(errors="replace"))
    assert load.offload() == (3, 3)
    assert "offloaded 3/3 layers to GPU, but every buffer is in host memory" in load.on_cpu()
    assert load.layers_in_ram() == load.on_cpu()


@pytest.mark.parametrize("name", ["b11434-cuda-h200-full_auto.log",
                                  "b11434-cuda-h200-mid_auto.log",
                                  "vulkan-lavapipe-ngl1-lv4.log"])
def test_gpu_buffers_are_no_cpu_fallback(name: str) -> None:
    # the healthy forms: CUDA0 / Vulkan0 buffers beside the host's
    load = load_of(log(name))
    assert load.gpu_buffers and load.on_cpu() == ""


# ggml-cuda.cu b11434, ggml_cuda_init: "%s: failed to initialize " GGML_CUDA_NAME ": %s"
# with cudaGetErrorString's text (GGML_LOG_ERROR: printed at every verbosity); the real
# load lines of the recorded CPU run around it.
CUDA_FAILED = ("0.00.000.912 E ggml_cuda_init: failed to initialize CUDA: no CUDA-capable "
               "device is detected")


def test_cuda_that_failed_to_start_counts_at_default_verbosity() -> None:
    text = "\n".join([CUDA_FAILED, "0.00.104.783 I srv    load_model: loading model "
                      "'/srv/models/mid-glm-full.gguf'", "0.00.261.705 I srv  llama_server: "
                      "model loaded"])
    load = load_of(text)
    assert load.offload() == (0, 0)   # no offload line: the old rule concluded nothing
    assert load.on_cpu() == ("its GPU backend did not start (CUDA: no CUDA-capable device "
                             "is detected): the model runs on the CPU")
    assert load.layers_in_ram() == load.on_cpu()


@pytest.mark.parametrize("line,said", [
    (CUDA_FAILED, "CUDA: no CUDA-capable device is detected"),
    ("E ggml_cuda_init: failed to initialize ROCm: no ROCm-capable device is detected",
     "ROCm: no ROCm-capable device is detected"),
    ("ggml_vulkan: No devices found.", "Vulkan: No devices found"),
    ("ggml_vulkan: Error: Vulkan 1.2 required.", "Vulkan: Error: Vulkan 1.2 required"),
    ("0.00.104.055 I ggml_cuda_init: found 1 CUDA devices (Total VRAM: 143155 MiB):", ""),
])
def test_gpu_failure_lines(line: str, said: str) -> None:
    event = parse_line(line)
    if not said:
        assert event is None
        return
    # not "oom" although cudaGetErrorString may say "out of memory"
    assert event is not None and event.kind == "gpu_failed" and event.path == said


def test_cuda_init_out_of_memory_is_a_backend_failure_not_an_allocation() -> None:
    event = parse_line("E ggml_cuda_init: failed to initialize CUDA: out of memory")
    assert event is not None and event.kind == "gpu_failed"


def test_a_started_backend_beside_a_failed_one_is_not_cpu() -> None:
    text = "\n".join(["ggml_vulkan: No devices found.",
                      "I srv    load_model: loading model '/m.gguf'",
                      "I load_tensors: offloaded 3/3 layers to GPU",
                      "I load_tensors:   CPU_Mapped model buffer size =     0.06 MiB",
                      "I load_tensors:        CUDA0 model buffer size =     0.54 MiB"])
    assert load_of(text).on_cpu() == ""


def test_rpc_worker_buffers_are_not_the_host() -> None:
    text = "\n".join(["I srv    load_model: loading model '/m.gguf'",
                      "I load_tensors: offloaded 3/3 layers to GPU",
                      "I load_tensors:   CPU_Mapped model buffer size =     0.06 MiB",
                      "I load_tensors: RPC0[10.0.0.2:50052] model buffer size =     0.54 MiB"])
    assert load_of(text).on_cpu() == ""


def test_no_offload_asked_is_no_cpu_fallback() -> None:
    # -ngl 0 on a build with RPC: offloaded 0/3, CPU buffers: what the operator asked
    text = "\n".join(["I srv    load_model: loading model '/m.gguf'",
                      "I load_tensors: offloaded 0/3 layers to GPU",
                      "I load_tensors:   CPU_Mapped model buffer size =     0.44 MiB"])
    load = load_of(text)
    assert load.on_cpu() == ""
    assert "only 0/3 layers on GPU" in load.layers_in_ram()
