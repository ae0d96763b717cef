"""llama-server's log lines → events, and the verdict of one load (pure).

The lines come from the journal of ``loki-engine@*.service`` (or a pipe, in
local mode). Formats are those of llama.cpp b11434 (``tools/server``,
``src/llama-model.cpp``, ``common/speculative.cpp``, ``ggml-cuda``); every
line keeps its optional ``0.00.043.866 I `` timestamp/level prefix.

The offload rule is the reference's ``lastOffload``, exactly: a load starts at
the server's ``loading model '<path>'`` line (not at ``load_model:``, which
the server also prints *after* loading, nor at ``loading model tensors``,
printed for a draft too); within it, each ``offloaded N/M layers to GPU``
line counts (the model's, then a separately loaded draft's), and the first
one with N < M decides: the worst of the two. None at all: nothing can be
concluded (a CPU-only engine never prints the line).

**A GPU engine running on the CPU** (issue 44, item 3) is a fact of its own, said by
:meth:`Load.on_cpu` and counted in the layers-in-RAM verdict, because the engine never
says it in so many words and the unit is active all the same, 10-100x slower:

- a GPU backend that failed to start prints one line and goes on without it:
  ``ggml_cuda_init: failed to initialize CUDA: <cudaGetErrorString>`` (``ggml-cuda.cu``,
  ``GGML_LOG_ERROR``, so at every verbosity; ``ROCm`` and ``MUSA`` builds print their
  name there), ``ggml_vulkan: No devices found.`` (no usable Vulkan device: lavapipe
  without ``GGML_VK_VISIBLE_DEVICES``, recorded) and ``ggml_vulkan: Error: Vulkan 1.2
  required.``. Such a line counts unless a buffer of the load is on a GPU (a build with
  two GPU backends, one of which started);
- a build with the RPC backend (ours: ``GGML_RPC=ON``) counts RPC as GPU offload
  (``llama_supports_gpu_offload()``), so it prints ``offloaded 3/3 layers to GPU`` with
  only ``CPU`` buffers: an offload line with N > 0 whose load's buffers (``-lv 4``) are
  all host buffers (``CPU``, ``CPU_Mapped``, ``CUDA_Host``…: :func:`host_buffer`) is one
  too. An RPC worker's buffers (``RPC0[host:port]``) are not the host's.

Everything kept is bounded, whatever the engine (or a garbage line) prints: a
number has at most :data:`MAX_DIGITS` digits (``int()`` refuses 4,300, and a
5,000-digit offload line once cost every other line of its batch), a field (a
path, an address) at most :data:`MAX_FIELD` characters, only the first
:data:`MAX_LINE` characters of a line are searched, and an event's text is cut
to :data:`MAX_TEXT`. A load counts its error lines and keeps only the first
:data:`FIRST_ERRORS` and the last :data:`LAST_ERRORS` of them (100,000 "CUDA
error" lines of 4 KB once grew the daemon by 400 MiB, for good), and at most
:data:`MAX_OFFLOADS` offload lines, its verdict computed as they come.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field

# The bounds (see the module docstring). A real layer count has 1-4 digits, a real line
# is under 300 characters; an error line's text is for the operator, who needs its start.
MAX_DIGITS = 9
MAX_FIELD = 1024
MAX_LINE = 4096
MAX_TEXT = 512
FIRST_ERRORS = 5
LAST_ERRORS = 5
MAX_OFFLOADS = 16

_PREFIX = re.compile(r"^\s*(?:\d+\.\d+\.\d+\.\d+\s+[A-Z]\s+)?")
_LOADING = re.compile(rf"loading model '(?P<path>[^']{{0,{MAX_FIELD}}})'")
# Bounded digits, each followed by what the format prints after it: a longer number
# ("offloaded 9999999999/33") matches nothing rather than a shortened one.
_OFFLOADED = re.compile(rf"offloaded (?P<n>\d{{1,{MAX_DIGITS}}})/(?P<m>\d{{1,{MAX_DIGITS}}}) "
                        r"layers to GPU")
_BUFFER = re.compile(r"(?P<dev>\S{1,64}) +\w{1,16} buffer size = ")
# ggml-cuda.cu: "%s: failed to initialize " GGML_CUDA_NAME ": %s" (CUDA, ROCm or MUSA);
# ggml-vulkan.cpp: "ggml_vulkan: No devices found." and "ggml_vulkan: Error: Vulkan 1.2
# required." (b11434). The first group is what is said of it.
_GPU_FAILED = re.compile(r"(?:ggml_cuda_init: failed to initialize (?P<cuda>CUDA|ROCm|MUSA): "
                         r"|ggml_vulkan: (?P<vk>No devices found|Error: Vulkan 1\.2 required))")
_LISTENING = re.compile(rf"listening on (?P<url>\S{{1,{MAX_FIELD}}})(?!\S)")
_ERRORS: list[tuple[str, re.Pattern[str]]] = [
    ("mtp_missing", re.compile(r"MTP block missing nextn|context type MTP requested but model "
                               r"doesn't contain MTP layers")),
    ("mtp_failed", re.compile(r"failed to create MTP context")),
    ("draft_failed", re.compile(r"failed to load draft model")),
    ("oom", re.compile(r"cudaMalloc failed|out of memory|failed to allocate (?:CUDA|ROCm|"
                       r"Vulkan|CPU)\w* buffer|ErrorOutOfDeviceMemory|failed to allocate compute"
                       r"|failed to allocate buffer")),
    ("gpu_error", re.compile(r"CUDA error|ROCm error|ggml_cuda_error|Vulkan error")),
    ("load_failed", re.compile(r"exiting due to model loading error|failed to load model")),
]


@dataclass(frozen=True)
class Event:
    """One meaningful engine line. ``kind`` is one of: loading, offloaded, loaded,
    listening, buffer (``path``: its device), gpu_failed (``path``: the backend and what it
    said), and the error kinds of _ERRORS."""

    kind: str
    text: str
    path: str = ""
    n: int = 0
    m: int = 0


# Every match of a pattern of _ERRORS contains one of these words (keep them in step: a
# test checks each pattern's alternatives): a serving engine's lines, nearly all of a
# long-running engine's, are let go after a few substring tests instead of six searches.
_ERROR_WORDS = ("failed", "error", "MTP", "out of memory", "ErrorOutOfDeviceMemory")


def _could_be_error(line: str) -> bool:
    return any(word in line for word in _ERROR_WORDS)


def _text(line: str) -> str:
    text = _PREFIX.sub("", line.rstrip("\n"), count=1)
    return text if len(text) <= MAX_TEXT else text[:MAX_TEXT - 1] + "…"


def host_buffer(device: str) -> bool:
    """Whether a buffer line's device is the host's memory: ``CPU``, ``CPU_Mapped``,
    ``CPU_REPACK``, ``CUDA_Host``, ``Vulkan_Host``… (not ``CUDA0``, ``Vulkan1``, an RPC
    worker's ``RPC0[host:port]``)."""
    return device.startswith("CPU") or device.endswith("_Host")


def gpu_failure(line: str) -> str:
    """What a line says of a GPU backend that did not start ("CUDA: no CUDA-capable device
    is detected", "Vulkan: No devices found"), or ""."""
    if "ggml_" not in line:
        return ""
    line = line[:MAX_LINE]
    m = _GPU_FAILED.search(line)
    if m is None:
        return ""
    if m["vk"]:
        return f"Vulkan: {m['vk']}"
    said = line[m.end():].strip()[:MAX_TEXT // 2]
    return f"{m['cuda']}: {said}" if said else m["cuda"]


def on_cpu_reason(failed: str, offloaded: tuple[int, int], host_buffers: bool,
                  gpu_buffers: bool) -> str:
    """The rule of a GPU engine running on the CPU (see the module docstring), from what a
    load showed: ``failed`` what :func:`gpu_failure` found ("" none), ``offloaded`` the
    first offload line with N > 0 ((0, 0) none), whether any buffer was on the host, on a
    GPU. "" when it does not run on the CPU, or nothing says so."""
    if gpu_buffers:
        return ""
    if failed:
        return f"its GPU backend did not start ({failed}): the model runs on the CPU"
    n, m = offloaded
    if n > 0 and host_buffers:
        return (f"it says offloaded {n}/{m} layers to GPU, but every buffer is in host "
                "memory (no GPU device: the RPC backend counts as offload): the model runs "
                "on the CPU")
    return ""


def parse_line(line: str) -> Event | None:
    """The event a log line carries, or None. Never raises on any text."""
    line = line[:MAX_LINE]
    if "buffer size = " in line:
        m = _BUFFER.search(line)
        if m:
            return Event("buffer", _text(line), path=m["dev"])
    failed = gpu_failure(line)
    if failed:
        return Event("gpu_failed", _text(line), path=failed)
    if "layers to GPU" in line:
        m = _OFFLOADED.search(line)
        if m:
            return Event("offloaded", _text(line), n=int(m["n"]), m=int(m["m"]))
    if "loading model '" in line:
        m = _LOADING.search(line)
        if m:
            return Event("loading", _text(line), path=m["path"])
    if "llama_server: model loaded" in line:
        return Event("loaded", _text(line))
    if "listening on " in line:
        m = _LISTENING.search(line)
        if m:
            return Event("listening", _text(line), path=m["url"])
    if not _could_be_error(line):
        return None
    text = _text(line)
    for kind, pattern in _ERRORS:
        if pattern.search(text):
            return Event(kind, text)
    return None


@dataclass
class Load:
    """What one load of the engine showed, from its ``loading model`` line on.

    ``offloads`` holds the first :data:`MAX_OFFLOADS` offload lines; the verdict
    (:meth:`offload`) is computed as each line comes, so a line past that bound still
    counts. ``errors_seen`` counts the error lines; :attr:`errors` holds the first
    :data:`FIRST_ERRORS` and the last :data:`LAST_ERRORS` of them, ``error_kinds``
    every kind seen."""

    path: str = ""
    offloads: list[tuple[int, int]] = field(default_factory=list)
    first_errors: list[Event] = field(default_factory=list)
    last_errors: deque[Event] = field(default_factory=lambda: deque(maxlen=LAST_ERRORS))
    errors_seen: int = 0
    error_kinds: set[str] = field(default_factory=set)
    loaded: bool = False
    listening: str = ""
    gpu_failed: str = ""        # the first GPU backend failure of this load or before it
    host_buffers: bool = False  # a buffer line on the host's memory was seen
    gpu_buffers: bool = False   # ... on a GPU (or an RPC worker)
    _offloaded_some: tuple[int, int] = (0, 0)   # the first offload line with N > 0
    lines: int = 0
    known: int = 0   # lines that matched any event: none means the format changed
    _decided: tuple[int, int] = (0, 0)
    _final: bool = False   # a line with N < M decided: later lines change nothing

    @property
    def errors(self) -> list[Event]:
        """The error lines kept, in order: the first ones, then the last ones (those of
        the middle are only counted, in ``errors_seen``)."""
        return [*self.first_errors, *self.last_errors]

    def feed(self, event: Event | None) -> None:
        self.lines += 1
        if event is None:
            return
        self.known += 1
        if event.kind == "offloaded":
            if len(self.offloads) < MAX_OFFLOADS:
                self.offloads.append((event.n, event.m))
            self._offloaded(event.n, event.m)
            if event.n > 0 and self._offloaded_some == (0, 0):
                self._offloaded_some = (event.n, event.m)
        elif event.kind == "buffer":
            if host_buffer(event.path):
                self.host_buffers = True
            else:
                self.gpu_buffers = True
        elif event.kind == "gpu_failed":
            self.gpu_failed = self.gpu_failed or event.path
        elif event.kind == "loaded":
            self.loaded = True
        elif event.kind == "listening":
            self.listening = event.path
        elif event.kind != "loading":
            self.errors_seen += 1
            self.error_kinds.add(event.kind)
            if len(self.first_errors) < FIRST_ERRORS:
                self.first_errors.append(event)
            else:
                self.last_errors.append(event)

    def _offloaded(self, a: int, b: int) -> None:
        # The reference's rule, one line at a time: the first line with N < M decides;
        # until one does, the first with M > 0 stands.
        if self._final:
            return
        if self._decided[1] == 0 or a < b:
            self._decided = (a, b)
        self._final = a < b

    def offload(self) -> tuple[int, int]:
        """(N, M) of the worst offload line of this load; (0, 0) = none seen."""
        return self._decided

    def on_cpu(self) -> str:
        """Why this load runs on the CPU although its engine has a GPU backend or says it
        offloaded ("" if nothing says so): :func:`on_cpu_reason`."""
        return on_cpu_reason(self.gpu_failed, self._offloaded_some, self.host_buffers,
                             self.gpu_buffers)

    def layers_in_ram(self) -> str:
        """Why this load counts as a failed automatic launch ("" if it does not): layers
        --fit left in RAM, or a model on the CPU (:meth:`on_cpu`)."""
        cpu = self.on_cpu()
        if cpu:
            return cpu
        n, m = self.offload()
        if m > 0 and n < m:
            return (f"only {n}/{m} layers on GPU with the draft: --fit moved layers to RAM")
        return ""


class LoadTracker:
    """Follows one engine's lines; ``current`` is the load in progress or last seen."""

    def __init__(self) -> None:
        self.current: Load | None = None
        self.before: Load = Load()   # lines before any loading line (start-up noise)

    def feed(self, line: str) -> Event | None:
        event = parse_line(line)
        if event is not None and event.kind == "loading":
            # a backend fails at start-up, before the load's line: the load inherits it
            self.current = Load(path=event.path, gpu_failed=self.before.gpu_failed)
        (self.current or self.before).feed(event)
        return event

