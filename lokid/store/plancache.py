"""Reusing the plan of the last start that became ready, when nothing it came from changed.

A start plans from files and from lokid's environment: ``lokid.toml``, every
preset (the port conflicts), the model directories and the model, draft and
mmproj files, the engine binary and its libraries, ``LLAMA_ARG_*``/``GGML_*``
and ``PATH``, and lokid's own planner. Planning in a new process costs most of
its time in imports (the TOML parser, the GGUF reader, the planner), on the
path from ``systemctl start`` to READY.

So a start that became ready records, in ``$LOKI_RUNTIME_DIR/<preset>.reuse``,
its runtime plan, the attempt verdict it was planned with, and a *key*: a hash
of the status (device, inode, size, modification and change times) of each of
those paths, or their absence, of that environment and of the preset's name.
It records nothing when any of those paths changed less than a second before
its planning began, or since (git's "racy index" rule): the key then might
describe content the plan was not made from. The next start computes the key
again (``stat`` calls only) and, when it is the same, runs the recorded plan.
What is not a file is still read every time by the caller: the attempt verdict
in the state DB (any verdict but "allowed", and the caller plans afresh),
and the port. A changed file, a failed start (no record is written for it), a
new engine build or a new lokid plans afresh; ``lokid plan`` always plans.

The record's head is plain text, fields ended by NUL (no path holds one): the format,
the key, whether the plan is *settled alone* (:meth:`~lokid.core.launch.runtimeplan.RuntimePlan.
settled_alone`: a restart has nothing to ask of the state DB or of RPC workers), its
engine's socket, and the paths; then the JSON body (the verdict and the runtime plan).
So the planning step of a restart (:mod:`lokid.unit.keptstart`) checks the key
without importing the JSON module (``json`` and the ``re`` and ``enum`` it imports:
~7 ms of a restart under systemd).
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing; mypy knows the name
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from typing import Any

    from ..core.launch.plan import PlanInputs
    from ..core.launch.runtimeplan import RuntimePlan

SUFFIX = ".reuse"
# A note of the plans the daemon writes ahead of a start (lokid.dbus.readyplans): the
# journal of the start that runs one says where it came from
AHEAD = "planned ahead by lokid's daemon, for a start that a request asks for (serve)"
ENV_PREFIXES = ("LLAMA_ARG_", "GGML_")
FORMAT = 2   # 1: one JSON document (a record of that format reads as none: plan afresh)
MAGIC = "lokid-reuse"


def _path(runtime_dir: str, preset: str) -> str:
    return os.path.join(runtime_dir, preset + SUFFIX)


RACY_NS = 1_000_000_000


def _status(path: str) -> tuple[str, int]:
    """The status line of ``path`` and its change time (0 when absent)."""
    try:
        st = os.stat(path)
    except OSError as e:
        return f"{path} -{e.errno}", 0
    return (f"{path} {st.st_dev}:{st.st_ino} {st.st_mode:o} {st.st_size} {st.st_mtime_ns} "
            f"{st.st_ctime_ns}", max(st.st_ctime_ns, st.st_mtime_ns))


def _planner_files() -> list[str]:
    """lokid's own planning code: an upgrade, or an edited checkout, plans afresh. The
    sub-packages count too (the core's topics, lokid/core/launch/ holding the plan): a
    key of the top directory alone kept an old plan after an edit of the plan itself."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = []
    todo = [os.path.join(package, "core"), os.path.join(package, "planning")]
    while todo:
        directory = todo.pop(0)
        try:
            names = sorted(os.listdir(directory))
        except OSError:
            names = []
        out += [directory, *(os.path.join(directory, n) for n in names if n.endswith(".py"))]
        todo += [os.path.join(directory, n) for n in names
                 if "." not in n and n != "__pycache__"
                 and os.path.isfile(os.path.join(directory, n, "__init__.py"))]
    return [*out, os.path.join(package, "host", "probe.py")]


_SHA256: Any = None


def _sha256(data: bytes) -> Any:
    """SHA-256 from CPython's own implementation where it has one: hashlib loads
    OpenSSL's libcrypto first (~3 ms on a start's path); the digest is the same. The
    constructor is found once (a failed import searches the whole path each time)."""
    global _SHA256
    if _SHA256 is None:
        try:
            from _sha2 import sha256  # type: ignore[import-not-found]  # CPython 3.12+
        except ImportError:
            try:
                from _sha256 import sha256  # type: ignore[import-not-found]  # 3.11
            except ImportError:
                from hashlib import sha256
        _SHA256 = sha256
    return _SHA256(data)


def key(preset: str, paths: Iterable[str], environ: Mapping[str, str]) -> tuple[str, int]:
    """The hash of everything a plan of ``preset`` was made from, and the latest change
    time among those paths."""
    h = _sha256(f"{FORMAT}\0{preset}\0".encode())
    latest = 0
    for path in [*paths, *_planner_files()]:
        line, changed = _status(path)
        latest = max(latest, changed)
        h.update(line.encode("utf-8", "surrogateescape") + b"\0")
    for name in sorted(environ):
        if name.startswith(ENV_PREFIXES) or name == "PATH":
            h.update(f"{name}={environ[name]}\0".encode("utf-8", "surrogateescape"))
    return h.hexdigest(), latest


def inputs_paths(config_dir: str, inputs: PlanInputs, environ: Mapping[str, str]) -> list[str]:
    """The files and directories a plan made from ``inputs`` depends on."""
    from ..core.config.files import GLOBAL_FILE, PRESETS_DIR
    from ..host.probe import library_dirs

    presets = os.path.join(config_dir, PRESETS_DIR)
    try:
        preset_files = sorted(os.path.join(presets, n) for n in os.listdir(presets))
    except OSError:
        preset_files = []
    paths = [os.path.join(config_dir, GLOBAL_FILE), presets, *preset_files,
             *inputs.config.model_dirs, inputs.model_path, inputs.caps.path,
             *library_dirs(inputs.caps.path)]
    if inputs.mmproj_path:
        paths.append(inputs.mmproj_path)
    if inputs.draft is not None and inputs.draft.path:
        paths.append(inputs.draft.path)
    if not os.path.isabs(inputs.config.engine):  # found in PATH: where it is looked up
        paths += environ.get("PATH", "").split(os.pathsep)
    return paths


def record(runtime_dir: str, preset: str, paths: list[str], environ: Mapping[str, str],
           plan: RuntimePlan, verdict: str, planned_at_ns: int,
           owner: tuple[int, int] | None = None) -> bool:
    """Keep the runtime plan of a start that became ready, planned from ``paths`` at
    ``planned_at_ns`` (``time.time_ns()`` before planning) with the attempt verdict
    ``verdict``; False (nothing kept) when one of the paths changed since a second
    before. ``owner``: (uid, gid) to give the file (the daemon writing, as root, for the
    engine's user). Atomic; I/O errors are the caller's."""
    import json

    digest, latest = key(preset, paths, environ)
    path = _path(runtime_dir, preset)
    if latest >= planned_at_ns - RACY_NS:
        forget(runtime_dir, preset)
        return False
    head = [f"{MAGIC} {FORMAT}", digest, "1" if plan.settled_alone(verdict) else "0",
            plan.socket, *paths]
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8", errors="surrogateescape") as f:
        f.write("".join(field + "\0" for field in head))
        json.dump({"verdict": verdict, "plan": plan.to_json()}, f)
        if owner is not None:
            os.fchown(f.fileno(), *owner)
    os.replace(tmp, path)
    return True


class Kept:
    """A record's head, read without the JSON module: its key (still to be compared),
    whether its plan is settled alone, its engine's socket, its paths; ``body`` the
    JSON text of the rest."""

    __slots__ = ("key", "settled_alone", "socket", "paths", "body")

    def __init__(self, fields: list[str]):
        self.key, alone, self.socket = fields[1:4]
        self.settled_alone = alone == "1"
        self.paths, self.body = fields[4:-1], fields[-1]


def kept(runtime_dir: str, preset: str) -> Kept | None:
    """The record of ``preset``'s last ready start, its key not compared yet; None when
    there is none, or it is of another format or damaged."""
    try:
        with open(_path(runtime_dir, preset), encoding="utf-8", errors="surrogateescape") as f:
            fields = f.read().split("\0")
    except OSError:
        return None
    return Kept(fields) if len(fields) >= 5 and fields[0] == f"{MAGIC} {FORMAT}" else None


def unchanged(record: Kept, preset: str, environ: Mapping[str, str]) -> bool:
    """Whether nothing ``record``'s plan came from changed since it was kept."""
    return record.key == key(preset, record.paths, environ)[0]


def reusable(runtime_dir: str, preset: str, environ: Mapping[str, str],
             keyed: bool = False) -> tuple[dict[str, object], str] | None:
    """The recorded runtime plan (its JSON form) and the verdict it was planned with, when
    nothing it came from changed; ``keyed``: the caller compared the key already."""
    import json

    found = kept(runtime_dir, preset)
    if found is None or not (keyed or unchanged(found, preset, environ)):
        return None
    try:
        data = json.loads(found.body)
        plan, verdict = data["plan"], data["verdict"]
    except (ValueError, KeyError, TypeError):
        return None
    return (plan, verdict) if isinstance(plan, dict) and isinstance(verdict, str) else None


def forget(runtime_dir: str, preset: str) -> None:
    try:
        os.unlink(_path(runtime_dir, preset))
    except OSError:
        pass
