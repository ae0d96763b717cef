"""Engine capabilities: what a llama-server binary knows, from its ``--help`` and ``--version``.

Parsing only (pure): running the binary and listing its libraries is
:mod:`lokid.host.probe`'s job. The spec guards look at the help text rather
than at a version number, because a self-built engine or a fork may report any
build and still lack a flag, or have it.

Which GPU backends an engine has is read from the names of the ggml backend
libraries shipped with it (``libggml-cuda.so`` …), never from the devices
visible now: the daemon plans inside a sandbox without device nodes
(``PrivateDevices=yes``), and its plan must equal the one the unit runs.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

# "version: 0.6.0-dev (build 11434, commit 1a2b3c4)": llama.cpp since the
# version/build split.
# Bounded digits (int() refuses 4,300 and a real build has 4-5): a longer number matches
# nothing, and the build is unknown rather than an error or a shortened number.
_VERSION_NEW = re.compile(r"version:\s*\S+\s*\(build\s+(\d{1,12})(?:,\s*commit\s+"
                          r"([0-9A-Za-z]{1,64}))?(?![0-9A-Za-z])")
# "version: 6543 (abcdef12)": older builds, where the version is the build.
_VERSION_OLD = re.compile(r"version:\s*(\d{1,12})\s*\(([0-9A-Za-z]{1,64})\)")
# A flag as help lists it: "-m,    --model FNAME", "--spec-type [none|draft-mtp,...]".
_FLAG = re.compile(r"(?<![\w-])(--?[A-Za-z][A-Za-z0-9_-]*)")
# A ggml library: "libggml.so.0", "libggml-base.so", "libggml-cpu-haswell.so",
# "libggml-cuda.so.0.26.0", "libggml-metal.dylib", "ggml-vulkan.dll". Group 1 is the
# backend ("cuda"), None for the core library itself.
_GGML_LIB = re.compile(r"(?:lib)?ggml(?:-([A-Za-z0-9]+)[A-Za-z0-9_-]*)?\.(?:so|dylib|dll)\b")
# ggml libraries that are no GPU backend: the core, the CPU backend (and its per-CPU
# variants), BLAS (a CPU library), AMX (a CPU extension) and RPC (devices on other
# hosts, only with --rpc). Any other backend counts as a GPU one, a future one too:
# assuming a GPU costs journal lines, assuming none would lose the offload verdict.
_NOT_GPU = frozenset({"base", "cpu", "blas", "amx", "rpc"})
# How a note names a backend.
BACKEND_NAMES = {"cuda": "CUDA", "vulkan": "Vulkan", "hip": "HIP", "sycl": "SYCL",
                 "metal": "Metal", "opencl": "OpenCL", "musa": "MUSA", "cann": "CANN",
                 "webgpu": "WebGPU", "kompute": "Kompute"}


@dataclass(frozen=True)
class EngineCaps:
    """What one engine binary supports."""

    path: str
    build: int            # 0 = unknown (a local build without a build number, a fork)
    commit: str
    version_text: str
    help_text: str
    flags: frozenset[str]
    # GPU backends found beside the binary (("cuda",) …); () = only CPU ones; None =
    # unknown (no ggml library found: a static build, or one laid out elsewhere).
    gpu_backends: tuple[str, ...] | None = None

    def knows(self, flag: str) -> bool:
        return flag in self.flags

    def mentions(self, word: str) -> bool:
        """True when the help text contains ``word`` (a value such as ``draft-mtp``)."""
        return word in self.help_text


def parse_version(text: str) -> tuple[int, str]:
    """Build number and commit from ``--version`` output; (0, "") when unknown."""
    m = _VERSION_NEW.search(text)
    if m:
        return int(m.group(1)), m.group(2) or ""
    m = _VERSION_OLD.search(text)
    if m:
        return int(m.group(1)), m.group(2)
    return 0, ""


def parse_flags(help_text: str) -> frozenset[str]:
    """Every flag the help text lists at the start of an option line.

    Only the option column counts: a flag mentioned in another flag's
    description (such as "--draft-max was removed") is not a flag this engine
    accepts.
    """
    flags: set[str] = set()
    for line in help_text.splitlines():
        # Option lines start in column 0; indented lines continue a description.
        if not line.startswith("-"):
            continue
        # Aliases are separated by ", " or by a run of spaces ("-fit,  --fit"); the
        # description is the first segment that does not start with a dash.
        for segment in re.split(r"\s{2,}", line.strip()):
            if not segment.startswith("-"):
                break
            for m in _FLAG.finditer(segment):
                flags.add(m.group(1))
    return frozenset(flags)


def gpu_backends(library_names: Iterable[str]) -> tuple[str, ...] | None:
    """The GPU backends among the file names found beside an engine, sorted.

    () when ggml libraries are there but only CPU ones (``libggml-base``,
    ``libggml-cpu``, ``libggml``); None when there is no ggml library at all,
    which says nothing: a static build links its backends into the binary.
    """
    found = False
    gpus = set()
    for name in library_names:
        m = _GGML_LIB.match(name)
        if m is None:
            continue
        found = True
        backend = (m.group(1) or "base").lower()
        if backend not in _NOT_GPU:
            gpus.add(backend)
    return tuple(sorted(gpus)) if found else None


def backend_label(backends: Iterable[str]) -> str:
    """How a note names backends: "the CUDA backend", "the CUDA and Vulkan backends"."""
    names = [BACKEND_NAMES.get(b, b) for b in backends]
    if len(names) == 1:
        return f"the {names[0]} backend"
    return f"the {', '.join(names[:-1])} and {names[-1]} backends"


def parse_caps(path: str, version_text: str, help_text: str,
               backends: tuple[str, ...] | None = None) -> EngineCaps:
    build, commit = parse_version(version_text)
    return EngineCaps(
        path=path,
        build=build,
        commit=commit,
        version_text=version_text.strip(),
        help_text=help_text,
        flags=parse_flags(help_text),
        gpu_backends=backends,
    )
