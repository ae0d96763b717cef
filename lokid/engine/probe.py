"""Asking an engine binary what it is: ``--version`` and ``--help``, cached per binary.

An edge around :mod:`lokid.core.caps`: this module runs the binary (no shell, a
timeout, a clean stdin), the parsing is pure. Results are cached by (path,
size, mtime), so an engine upgraded in place is probed again.
"""

from __future__ import annotations

import os
import shutil
import subprocess

from ..core.caps import EngineCaps, parse_caps
from ..core.errors import EngineError

PROBE_TIMEOUT = 60.0  # a CUDA build initialises its backends even for --help

_cache: dict[tuple[str, int, int], EngineCaps] = {}


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


def probe_engine(engine: str, config_file: str = "") -> EngineCaps:
    """What the engine supports (cached per binary)."""
    path = resolve_engine(engine, config_file)
    st = os.stat(path)
    key = (path, st.st_size, st.st_mtime_ns)
    cached = _cache.get(key)
    if cached is not None:
        return cached
    _, version = _run([path, "--version"])
    rc, help_text = _run([path, "--help"])
    if rc != 0 or "--model" not in help_text:
        tail = help_text.strip().splitlines()[-1:] or ["no output"]
        raise EngineError(f"{path} --help failed (exit {rc}): {tail[0]} — is it llama-server?")
    caps = parse_caps(path, version, help_text)
    _cache[key] = caps
    return caps
