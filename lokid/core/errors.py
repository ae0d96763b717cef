"""Every failure mode lokid reports, one exception class each, and its D-Bus error name.

A message is written for the operator: what is wrong, where, and what would
be valid; nothing here formats a traceback. :data:`DBUS_NAMES` is the one
table from class to D-Bus error name (``org.lokid.Lokid1.Error.*``, or the
bus's own ``InvalidArgs``); a subclass without an entry takes its nearest
base's, and :func:`dbus_name` reads it. ``data/dbus/org.lokid.Lokid1.xml``
documents the names and which method raises which; a test keeps the two
in step.
"""

from __future__ import annotations

from .names import ERROR_PREFIX

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing on a start's path
if TYPE_CHECKING:
    from typing import Any

# The D-Bus error names, as callers (lokictl, busctl, a web console) match them.
FAILED = ERROR_PREFIX + "Failed"
NOT_FOUND = ERROR_PREFIX + "NotFound"
INVALID_PRESET = ERROR_PREFIX + "InvalidPreset"
PERMISSION_DENIED = ERROR_PREFIX + "PermissionDenied"
BUSY = ERROR_PREFIX + "Busy"
ENGINE_FAILED = ERROR_PREFIX + "EngineFailed"
INVALID_ARGS = "org.freedesktop.DBus.Error.InvalidArgs"


class LokiError(Exception):
    """Base of every error lokid reports to a user (D-Bus: Failed)."""


# C0 (NUL and newline among them), DEL and C1, and lone surrogates: D-Bus refuses
# a string holding a NUL or a surrogate (a file name that is not UTF-8 reads as
# one), and a newline would let a file forge a second line of an error.
# Compiled at the first error message: ``re`` (and the ``enum`` it imports) is not on a
# restart's path otherwise (lokid.unit.keptstart).
UNPRINTABLE = r"[\x00-\x1f\x7f-\x9f\ud800-\udfff]"


def printable(text: str) -> str:
    """``text`` with every control character and lone surrogate written as ``\\uXXXX``."""
    import re

    return re.sub(UNPRINTABLE, lambda m: f"\\u{ord(m.group()):04x}", text)


class ConfigError(LokiError):
    """A config or preset file is unreadable or has an invalid value.

    ``path`` and ``line`` (when known) say where; ``key`` says which setting.
    The message shows control characters escaped: its parts can come from a
    file name or a file's content, and the message crosses D-Bus.
    """

    def __init__(self, message: str, path: str = "", line: int | None = None, key: str = ""):
        self.path = path
        self.line = line
        self.key = key
        self.reason = message
        where = path
        if path and line is not None:
            where = f"{path}:{line}"
        text = message
        if key:
            text = f"{key}: {message}"
        if where:
            text = f"{where}: {text}"
        super().__init__(printable(text))


class DoesNotFitError(ConfigError):
    """The preset needs more memory on a device than this host has, even with every
    engine stopped (D-Bus: InvalidPreset: the preset must change, or the host)."""


class NotFoundError(LokiError):
    """A preset (or another named object) does not exist."""


class ModelError(LokiError):
    """A model file is missing, truncated, corrupt or not a GGUF file."""


class ModelNotPulledError(ModelError):
    """The preset names its model by a hub reference (``model = "org/repo:Q4_K_M"``) that
    has not been pulled into ``directory`` yet (issue 48): no fault of the preset's, a
    start pulls it first (:mod:`lokid.unit.pullfirst`)."""

    def __init__(self, message: str, reference: str = "", directory: str = ""):
        super().__init__(message)
        self.reference, self.directory = reference, directory


class EngineError(LokiError):
    """The engine binary is missing, not executable, or failed; or the preset's engine is
    not in the state a request needs (not ready for a benchmark, a job systemd refused)."""


class WorkersDown(EngineError):
    """An RPC worker of the preset's ``--rpc`` does not answer (lokid.unit.workers): the
    start waits for it, restarted by its unit."""


class ExternalPresetError(EngineError):
    """The preset is an external API (``kind = "external"``): it has no engine here to
    start, stop, plan or benchmark."""


class BusyError(LokiError):
    """The object is busy with something that excludes the request."""


class PortBusyError(BusyError):
    """The preset's port is already taken by another process."""


class PermissionDeniedError(LokiError):
    """The caller may not do this (only root, the loki group or polkit may manage engines)."""


class InvalidArgsError(LokiError):
    """A D-Bus caller passed an argument outside its documented range (a bench mode, a
    token count)."""


class ProbePending(EngineError):
    """The engine's probe (``--help``) has not ended within the caller's wait; it goes
    on in the background, and ``future`` (its :class:`lokid.host.probe.Outcome`,
    like a :class:`concurrent.futures.Future` of its :class:`~lokid.core.launch.caps.EngineCaps`)
    ends with it."""

    def __init__(self, message: str, future: Any) -> None:
        super().__init__(message)
        self.future = future


class StalePlanError(LokiError):
    """The runtime plan of a start is missing, unreadable or belongs to another start."""


class StateError(LokiError):
    """The state DB cannot be opened or written."""


class DaemonError(LokiError):
    """The daemon cannot start (bus unreachable, name taken, engines not followed)."""


class BenchError(LokiError):
    """A phase of the benchmark failed: nothing is saved."""


class EngineHTTPError(BenchError):
    """The engine answered a benchmark request with an HTTP error."""

    def __init__(self, method: str, path: str, status: int, body: str):
        self.status = status
        self.body = body
        snippet = body.strip()[:300]
        super().__init__(f"{method} {path}: HTTP {status} {snippet}")


class RequestTimeout(BenchError):
    """One benchmark request ran past its budget."""


class ReplicasBusyError(BusyError):
    """No replica of the preset can be started or stopped now (issue 47): the preset does
    not run, it runs ``max_replicas`` already, or the replica named does not run."""


class EngineBusyError(BusyError):
    """The engine is serving another request: measuring now would measure the wait."""


class PullError(LokiError):
    """A model pull cannot go on (issue 48: :mod:`lokid.core.model.pullref`, :mod:`lokid.host.hub`,
    :mod:`lokid.host.download`). ``retry`` says whether the same pull later can succeed
    (a cut connection, a hub answering 5xx): the pull's unit restarts on those only."""

    retry = False


class PullReferenceError(PullError):
    """The model reference cannot be read (``org/repo:Q4_K_M``, ``org/repo/file.gguf``, an
    https URL), or it names no file the repository holds."""


class HubError(PullError):
    """The hub refused or failed a request: no such repository or file, a gated model
    without a token, a token refused, a server error (``retry``: 5xx and 429)."""

    def __init__(self, message: str, retry: bool = False):
        super().__init__(message)
        self.retry = retry


class PullCutError(PullError):
    """The transfer ended before the file did (a cut connection, a short answer): what
    came is kept, and the next pull resumes from it."""

    retry = True


class PullCorruptError(PullError):
    """The file came whole but is not the hub's (its SHA-256 differs, or the server sent
    more bytes than the file has): the partial file is removed, never renamed into place."""


class NoSpaceError(PullError):
    """The target directory's file system has not the room the rest of the file needs."""


class PullBusyError(BusyError, PullError):
    """Another pull writes the same file now."""


DBUS_NAMES: dict[type[LokiError], str] = {
    LokiError: FAILED,
    ConfigError: INVALID_PRESET,
    ModelError: INVALID_PRESET,
    NotFoundError: NOT_FOUND,
    EngineError: ENGINE_FAILED,
    BenchError: ENGINE_FAILED,
    BusyError: BUSY,
    PermissionDeniedError: PERMISSION_DENIED,
    InvalidArgsError: INVALID_ARGS,
    PullReferenceError: INVALID_ARGS,
}


def dbus_name(error: LokiError) -> str:
    """The D-Bus error name of ``error``: its class's entry, else its nearest base's."""
    for cls in type(error).__mro__:
        name = DBUS_NAMES.get(cls)
        if name is not None:
            return name
    return FAILED
