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
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_PREFIX = re.compile(r"^\s*(?:\d+\.\d+\.\d+\.\d+\s+[A-Z]\s+)?")
_LOADING = re.compile(r"loading model '(?P<path>[^']*)'")
_OFFLOADED = re.compile(r"offloaded (?P<n>\d+)/(?P<m>\d+) layers to GPU")
_LISTENING = re.compile(r"listening on (?P<url>\S+)")
_ERRORS: list[tuple[str, re.Pattern[str]]] = [
    ("mtp_missing", re.compile(r"MTP block missing nextn|context type MTP requested but model "
                               r"doesn't contain MTP layers")),
    ("mtp_failed", re.compile(r"failed to create MTP context")),
    ("draft_failed", re.compile(r"failed to load draft model")),
    ("oom", re.compile(r"cudaMalloc failed|out of memory|failed to allocate (?:CUDA|ROCm|"
                       r"Vulkan)\d* buffer|ErrorOutOfDeviceMemory|failed to allocate compute")),
    ("gpu_error", re.compile(r"CUDA error|ROCm error|ggml_cuda_error|Vulkan error")),
    ("load_failed", re.compile(r"exiting due to model loading error|failed to load model")),
]


@dataclass(frozen=True)
class Event:
    """One meaningful engine line. ``kind`` is one of: loading, offloaded, loaded,
    listening, and the error kinds of _ERRORS."""

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
    return _PREFIX.sub("", line.rstrip("\n"))


def parse_line(line: str) -> Event | None:
    """The event a log line carries, or None."""
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
    """What one load of the engine showed, from its ``loading model`` line on."""

    path: str = ""
    offloads: list[tuple[int, int]] = field(default_factory=list)
    errors: list[Event] = field(default_factory=list)
    loaded: bool = False
    listening: str = ""
    lines: int = 0
    known: int = 0   # lines that matched any event: none means the format changed

    def feed(self, event: Event | None) -> None:
        self.lines += 1
        if event is None:
            return
        self.known += 1
        if event.kind == "offloaded":
            self.offloads.append((event.n, event.m))
        elif event.kind == "loaded":
            self.loaded = True
        elif event.kind == "listening":
            self.listening = event.path
        elif event.kind != "loading":
            self.errors.append(event)

    def offload(self) -> tuple[int, int]:
        """(N, M) of the worst offload line of this load; (0, 0) = none seen."""
        n = m = 0
        for a, b in self.offloads:
            if m == 0 or a < b:
                n, m = a, b
            if a < b:
                break
        return n, m

    def layers_in_ram(self) -> str:
        """Why this load counts as a failed automatic launch ("" if it does not)."""
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
            self.current = Load(path=event.path)
        (self.current or self.before).feed(event)
        return event

