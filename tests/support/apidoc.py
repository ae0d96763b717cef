"""The documented D-Bus API, ``data/dbus/org.lokid.Lokid1.xml``, read for comparison with
what the daemon exports (on a private bus, and under real systemd)."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from . import REPO

DOC = REPO / "data" / "dbus" / "org.lokid.Lokid1.xml"
DOCSTRING = "org.gtk.GDBus.DocString"


def members(iface: ET.Element) -> dict[tuple[str, str], tuple[str, ...]]:
    """(kind, name) → signature: arg types with directions, or property type and access."""
    out: dict[tuple[str, str], tuple[str, ...]] = {}
    for el in iface:
        if el.tag == "property":
            out[("property", el.get("name", ""))] = (el.get("type", ""), el.get("access", ""))
        elif el.tag in ("method", "signal"):
            out[(el.tag, el.get("name", ""))] = tuple(
                f"{a.get('direction', 'out')}:{a.get('type')}" for a in el if a.tag == "arg")
    return out


def documented() -> dict[str, ET.Element]:
    return {i.get("name", ""): i for i in ET.parse(DOC).getroot() if i.tag == "interface"}
