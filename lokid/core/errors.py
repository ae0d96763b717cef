"""The failure modes of lokid, one exception class each.

Every class carries the D-Bus error name it will map to once the daemon
exists, and a message written for the operator: what is wrong, where, and
what would be valid. Nothing here formats a traceback.
"""

from __future__ import annotations

from .names import ERROR_PREFIX


class LokiError(Exception):
    """Base of every error lokid reports to a user."""

    dbus_name = ERROR_PREFIX + "Failed"


class ConfigError(LokiError):
    """A config or preset file is unreadable or has an invalid value.

    ``path`` and ``line`` (when known) say where; ``key`` says which setting.
    """

    dbus_name = ERROR_PREFIX + "InvalidPreset"

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
        super().__init__(text)


class NotFoundError(LokiError):
    """A preset (or another named object) does not exist."""

    dbus_name = ERROR_PREFIX + "NotFound"


class ModelError(LokiError):
    """A model file is missing, truncated, corrupt or not a GGUF file."""

    dbus_name = ERROR_PREFIX + "InvalidPreset"


class EngineError(LokiError):
    """The engine binary is missing, not executable, or failed."""

    dbus_name = ERROR_PREFIX + "EngineFailed"


class PortBusyError(LokiError):
    """The preset's port is already taken by another process."""

    dbus_name = ERROR_PREFIX + "Busy"


class PermissionDeniedError(LokiError):
    """The caller may not do this (only root, the loki group or polkit may manage engines)."""

    dbus_name = ERROR_PREFIX + "PermissionDenied"


class BusyError(LokiError):
    """The object is busy with something that excludes the request."""

    dbus_name = ERROR_PREFIX + "Busy"
