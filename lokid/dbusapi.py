"""The D-Bus API, ``org.lokid.Lokid1``: thin interfaces over the daemon's registry.

The manager (``/org/lokid/Lokid1``, ``org.lokid.Lokid1.Manager``) and one
object per preset (``/org/lokid/Lokid1/preset/<escaped name>``,
``org.lokid.Lokid1.Preset``). Signatures are dbus-fast's string annotations,
which every version accepts (Debian 12 ships 1.84; ``dbus_fast.annotations``
exists only from 4.0) — and so this module does not use postponed
annotations.

Deny by default: every exported method declares who may call it with
:func:`access`; a test walks the interfaces and fails on a method that does
not. This first part of the API is read-only (``READ``: anyone); the verbs
that change things (start, stop, reload, clear failures) come with the
authorisation model.

No traceback crosses the bus: :func:`guarded` turns lokid's own errors into
their ``org.lokid.Lokid1.Error.*`` names with the operator's message, and
anything unexpected into a generic error, logged in full locally.
"""

import functools
import inspect
import logging
from collections.abc import Callable
from typing import Any, TypeVar

from dbus_fast import DBusError, PropertyAccess, Variant
from dbus_fast.service import ServiceInterface, dbus_property, method, signal

from . import __version__
from .errors import LokiError
from .names import ERROR_PREFIX, MANAGER_INTERFACE, PRESET_INTERFACE, preset_object_path
from .registry import PresetView, Registry

log = logging.getLogger("lokid.dbus")

READ = "read"        # anyone may call it
MANAGE = "manage"    # needs authorisation (the authorisation model comes with the verbs)
ACCESS_ATTR = "_lokid_access"

F = TypeVar("F", bound=Callable[..., Any])


def access(level: str) -> Callable[[F], F]:
    """Declare who may call a D-Bus method (READ or MANAGE)."""
    def mark(fn: F) -> F:
        setattr(fn, ACCESS_ATTR, level)
        return fn
    return mark


def to_dbus_error(e: BaseException) -> DBusError:
    if isinstance(e, DBusError):
        return e
    if isinstance(e, LokiError):
        return DBusError(e.dbus_name, str(e))
    log.exception("unexpected error in a D-Bus call")
    return DBusError(ERROR_PREFIX + "Failed", "internal error in lokid; details are in its log")


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


def plan_variant(plan: dict[str, Any]) -> dict[str, Variant]:
    """``lokid plan --json`` as a{sv}: argv (as), env (a{ss}), notes (as), spec (a{sv})."""
    spec = plan["spec"]
    return {
        "preset": Variant("s", plan["preset"]),
        "argv": Variant("as", list(plan["argv"])),
        "env": Variant("a{ss}", dict(plan["env"])),
        "notes": Variant("as", list(plan["notes"])),
        "spec": Variant("a{sv}", {"mode": Variant("s", spec["mode"]),
                                  "types": Variant("as", list(spec["types"])),
                                  "auto": Variant("b", bool(spec["auto"]))}),
    }


class PresetInterface(ServiceInterface):
    """One preset: its settings, its plan as the next start would run it."""

    def __init__(self, registry: Registry, name: str):
        super().__init__(PRESET_INTERFACE)
        self.registry = registry
        self.preset = name  # not .name: ServiceInterface keeps the interface's name there

    @property
    def view(self) -> PresetView:
        return self.registry.get(self.preset)

    @dbus_property(access=PropertyAccess.READ)
    def Name(self) -> "s":
        return self.preset

    @dbus_property(access=PropertyAccess.READ)
    def Model(self) -> "s":
        return self.view.model

    @dbus_property(access=PropertyAccess.READ)
    def Unit(self) -> "s":
        return self.view.unit

    @dbus_property(access=PropertyAccess.READ)
    def SpecMode(self) -> "s":
        return self.view.spec_mode

    @dbus_property(access=PropertyAccess.READ)
    def Notes(self) -> "as":
        return self.view.notes

    @dbus_property(access=PropertyAccess.READ)
    def Argv(self) -> "as":
        return self.view.argv

    @dbus_property(access=PropertyAccess.READ)
    def AutoSpecBlocked(self) -> "s":
        return self.view.auto_blocked

    @method()
    @access(READ)
    @guarded
    def Plan(self) -> "a{sv}":
        view = self.view
        if view.plan is None:
            raise LokiError(view.error)
        return plan_variant(view.plan)


class ManagerInterface(ServiceInterface):
    """The daemon: which presets exist, and (later) the verbs on them."""

    def __init__(self, registry: Registry):
        super().__init__(MANAGER_INTERFACE)
        self.registry = registry

    @dbus_property(access=PropertyAccess.READ)
    def Version(self) -> "s":
        return __version__

    @dbus_property(access=PropertyAccess.READ)
    def Presets(self) -> "ao":
        return [preset_object_path(name) for name in sorted(self.registry.presets)]

    @dbus_property(access=PropertyAccess.READ)
    def BrokenPresets(self) -> "a{ss}":
        return dict(self.registry.broken)

    @method()
    @access(READ)
    @guarded
    def GetPreset(self, name: "s") -> "o":
        self.registry.get(name)
        return preset_object_path(name)

    @signal()
    def VerdictRecorded(self, preset: "s", reason: "s") -> "ss":
        return [preset, reason]
