"""Who may call each method of lokid's D-Bus API, and how errors cross the bus.

Deny by default: every exported method declares who may call it with :func:`access`
(``READ``, anyone; or a polkit action, checked by :mod:`lokid.dbus.authz` before the
method runs). :func:`guarded` turns lokid's own errors into their
``org.lokid.Lokid1.Error.*`` names with the operator's message, and anything unexpected
into a generic error logged in full here: no traceback crosses the bus. Preset names
are checked at the boundary (:func:`checked_name`). :class:`Backend` is what the
interfaces (:mod:`lokid.dbus.interfaces`) need of the daemon.
"""

import functools
import inspect
import logging
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from dbus_fast import DBusError

from ..core.config.presetname import valid_preset_name
from ..core.errors import FAILED, LokiError, NotFoundError, dbus_name
from ..core.names import (
    ACTION_BENCH,
    ACTION_EDIT,
    ACTION_MANAGE,
    ACTION_MANAGE_KEYS,
    ACTION_READ_LOGS,
)
from ..runners.runner import EngineState
from .registry import Registry

log = logging.getLogger("lokid.dbus")

READ = "read"            # anyone may call it
MANAGE = ACTION_MANAGE   # start, stop, reload, clear failures: authorised per call
BENCH = ACTION_BENCH     # running a benchmark against an engine
EDIT = ACTION_EDIT       # reading a preset's source, creating, changing, removing presets
READ_LOGS = ACTION_READ_LOGS  # reading an engine's journal (lines, past request figures)
KEYS = ACTION_MANAGE_KEYS     # adding, changing, revoking the gateway's client keys
ACCESS_ATTR = "_lokid_access"

F = TypeVar("F", bound=Callable[..., Any])


class Backend(Protocol):
    """What the interfaces need from the daemon."""

    registry: Registry
    editor: Any   # lokid.dbus.editing.Editor
    logs: Any     # lokid.dbus.logs.Logs
    # lokid.dbus.telemetry.Telemetry (its idle stops: IdleStopAt, RequestsInFlight; its
    # sight, lokid.dbus.sight: OnDemandState, GroupHolder, the gateway's reports)
    telemetry: Any
    unloads: Any  # lokid.dbus.unload.Unloads
    replicas: Any  # lokid.dbus.replicas.Replicas: a preset's engines past the first

    def engine_state(self, name: str) -> EngineState: ...
    def spec_active(self, name: str) -> list[str]: ...
    def active_presets(self) -> list[str]: ...
    def runner_in_use(self) -> str: ...
    def stats(self, name: str) -> dict[str, Any]: ...
    def pending_restart(self, name: str) -> bool: ...
    def running_argv(self, name: str) -> list[str]: ...
    async def authorize(self, member: str, action: str) -> None: ...
    async def reveals(self) -> bool: ...
    async def caller(self) -> Any: ...   # lokid.core.access.User, None for root
    async def start(self, name: str) -> str: ...
    async def stop(self, name: str) -> str: ...
    async def restart(self, name: str) -> str: ...
    async def reload(self) -> None: ...
    async def clear_failures(self, name: str) -> int: ...
    async def bench(self, name: str, mode: str, predict: int, prompt: int,
                    repeat: int = 1) -> dict[str, Any]: ...


def access(level: str) -> Callable[[F], F]:
    """Declare who may call a D-Bus method: READ, or a polkit action checked before it runs.

    The method must be a coroutine of an interface with a ``backend``; its
    errors (including a refusal) become D-Bus errors.
    """
    def mark(fn: F) -> F:
        setattr(fn, ACCESS_ATTR, level)
        if level == READ:
            return fn

        @functools.wraps(fn)
        async def checked(self: Any, *args: Any) -> Any:
            try:
                await self.backend.authorize(fn.__name__, level)
            except Exception as e:
                raise to_dbus_error(e) from None
            return await fn(self, *args)
        return checked  # type: ignore[return-value]
    return mark


def checked_name(name: str) -> str:
    """A preset name from a caller: NotFound unless it could name a preset file."""
    if not valid_preset_name(name):
        shown = name if len(name) <= 64 else name[:64] + "…"
        raise NotFoundError(f"no preset {shown!r}: preset names are 1 to 64 characters "
                            "A-Z a-z 0-9 _ . - starting with a letter or a digit")
    return name


def to_dbus_error(e: BaseException) -> DBusError:
    if isinstance(e, DBusError):
        return e
    if isinstance(e, LokiError):
        return DBusError(dbus_name(e), str(e))
    log.exception("unexpected error in a D-Bus call")
    return DBusError(FAILED, "internal error in lokid; details are in its log")


def guarded(fn: F) -> F:
    """Errors of ``fn`` become D-Bus errors with a name and a message, never a traceback."""
    if inspect.iscoroutinefunction(fn):
        @functools.wraps(fn)
        async def async_wrapper(*args: Any, **kw: Any) -> Any:
            try:
                return await fn(*args, **kw)
            except Exception as e:
                raise to_dbus_error(e) from None
        return async_wrapper  # type: ignore[return-value]

    @functools.wraps(fn)
    def wrapper(*args: Any, **kw: Any) -> Any:
        try:
            return fn(*args, **kw)
        except Exception as e:
            raise to_dbus_error(e) from None
    return wrapper  # type: ignore[return-value]
