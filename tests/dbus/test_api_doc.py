"""The documented API (data/dbus/org.lokid.Lokid1.xml) is exactly what the daemon exports,
and every member is described."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from support.apidoc import DOCSTRING, documented, members

from lokid.dbus.interfaces import ManagerInterface, PresetInterface
from lokid.dbus.registry import Registry


@pytest.mark.parametrize("cls", [ManagerInterface, PresetInterface])
def test_the_document_matches_the_exported_interface(cls: type) -> None:
    backend = SimpleNamespace(registry=Registry("/nonexistent", "/nonexistent"))
    iface = cls(backend, *(["p"] if cls is PresetInterface else []))
    live = iface.introspect().to_xml()
    doc = documented()[live.get("name")]
    assert members(doc) == members(live)


def test_every_interface_and_member_is_described() -> None:
    for iface in documented().values():
        for el in [iface, *[e for e in iface if e.tag in ("property", "method", "signal")]]:
            docs = [a for a in el if a.tag == "annotation" and a.get("name") == DOCSTRING]
            assert docs and len(docs[0].get("value", "")) > 10, el.get("name")


def test_every_key_of_the_bench_reply_is_documented() -> None:
    from lokid.bench.measure import Outcome
    from lokid.core.bench.rules import Result

    (bench,) = [m for m in documented()["org.lokid.Lokid1.Manager"] if m.get("name") == "Bench"]
    text = next(a.get("value", "") for a in bench if a.get("name") == DOCSTRING)
    for key in Outcome(Result("quick"), False, "0" * 16, "http://127.0.0.1:1").reply():
        assert f" {key} (" in text, key


def test_the_bus_policy_lets_every_documented_method_reach_the_daemon() -> None:
    """data/dbus/org.lokid.Lokid1.conf: a method it does not list is refused by the bus
    itself ("Access denied") before the daemon can authorise it and say why."""
    import xml.etree.ElementTree as ET

    from support import REPO

    policy = ET.parse(REPO / "data" / "dbus" / "org.lokid.Lokid1.conf").getroot()
    allowed = {(a.get("send_interface"), a.get("send_member"))
               for p in policy if p.get("context") == "default" for a in p
               if a.tag == "allow" and a.get("send_destination") == "org.lokid.Lokid1"}
    for name, iface in documented().items():
        for method in (m for m in iface if m.tag == "method"):
            assert (name, method.get("name")) in allowed, (name, method.get("name"))
    # the Cockpit page reads every preset at once (its bridge's namespace watch)
    assert ("org.freedesktop.DBus.ObjectManager", "GetManagedObjects") in allowed
