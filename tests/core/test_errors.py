"""lokid.core.errors: each failure mode has one class and one D-Bus name, and it is documented."""

from __future__ import annotations

import inspect
import re

import pytest
from support.apidoc import DOC, DOCSTRING, documented

import lokid
from lokid.core import errors
from lokid.core.errors import LokiError


def short(name: str) -> str:
    return name.rsplit(".", 1)[1]


def documented_names() -> set[str]:
    """The full error names the XML's header lists: org.lokid.Lokid1.Error.{A, B, …} and
    the bus's own org.freedesktop.DBus.Error.X."""
    text = DOC.read_text()
    group = re.search(r"org\.lokid\.Lokid1\.Error\.\{([^}]*)\}", text)
    assert group is not None
    names = {"org.lokid.Lokid1.Error." + n.strip() for n in group.group(1).split(",")}
    return names | set(re.findall(r"org\.freedesktop\.DBus\.Error\.[A-Za-z]+", text))


DOCUMENTED_NAMES = {short(n) for n in documented_names()}


def all_error_classes() -> list[type[LokiError]]:
    return [c for _, c in inspect.getmembers(errors, inspect.isclass)
            if issubclass(c, LokiError)]


def test_every_lokid_error_class_lives_in_the_errors_module() -> None:
    """No failure mode is defined elsewhere (they frayed across six modules once)."""
    import pkgutil
    from importlib import import_module

    defined_elsewhere = []
    for info in pkgutil.walk_packages(lokid.__path__, "lokid."):
        if info.name.rpartition(".")[2] == "__main__":
            continue  # runs a command line when imported (python -m lokid, -m lokid.ctl)
        module = import_module(info.name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, LokiError) and cls.__module__ != "lokid.core.errors":
                defined_elsewhere.append(f"{cls.__module__}.{cls.__name__}")
    assert defined_elsewhere == []


@pytest.mark.parametrize("cls", all_error_classes(), ids=lambda c: c.__name__)
def test_every_class_maps_to_a_documented_name(cls: type[LokiError]) -> None:
    error = cls.__new__(cls)
    assert errors.dbus_name(error) in documented_names()


def test_the_table_gives_the_names_callers_match() -> None:
    assert errors.dbus_name(errors.PortBusyError("x")) == "org.lokid.Lokid1.Error.Busy"
    assert errors.dbus_name(errors.EngineBusyError("x")) == errors.BUSY
    assert errors.dbus_name(errors.EngineHTTPError("POST", "/x", 500, "")) == errors.ENGINE_FAILED
    assert errors.dbus_name(errors.ModelError("x")) == errors.INVALID_PRESET
    assert errors.dbus_name(errors.InvalidArgsError("x")) == \
        "org.freedesktop.DBus.Error.InvalidArgs"
    assert errors.dbus_name(errors.StateError("x")) == errors.FAILED
    assert isinstance(errors.PortBusyError("x"), errors.BusyError)


def test_every_error_a_method_documents_is_a_known_name() -> None:
    """Each method's description names its errors; each named one exists."""
    for iface in documented().values():
        for el in iface:
            if el.tag != "method":
                continue
            text = next(a.get("value", "") for a in el if a.get("name") == DOCSTRING)
            found = re.search(r"Errors?:? ([^.]*)\.", text)
            if found is None:
                continue
            named = set(re.findall(r"\b([A-Z][A-Za-z]+)\b", re.sub(r"\([^)]*\)", "",
                                                                       found.group(1))))
            named -= {"StartPreset", "StartReplica"}  # "Errors as StartPreset"
            assert named <= DOCUMENTED_NAMES, (el.get("name"), named - DOCUMENTED_NAMES)
