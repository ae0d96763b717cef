"""The Cockpit page's files (cockpit/lokid/) keep to what Cockpit serves them under.

Cockpit's Content-Security-Policy refuses inline scripts, inline event handlers and
(by default) inline styles: a page that has any loads blank or half-working, with the
reason only in the browser's log (../shared/recipes/README.md). The page must also work
offline and decide no right itself: it fetches nothing from the network and speaks only
the daemon's documented D-Bus API. These are read from the files, without a browser
(tests/support/cockpitkit.py runs the page in a real one); debian/cockpit-lokid.install
must ship exactly these files (tests/packaging/test_deb.py checks the built package).
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "cockpit" / "lokid"
FILES = ("index.html", "lokid.css", "lokid.js", "manifest.json")
COCKPIT_JS = "../base1/cockpit.js"
API = REPO / "data" / "dbus" / "org.lokid.Lokid1.xml"


class Tags(HTMLParser):
    """Every start tag with its attributes, and the text inside each <script>/<style>."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.inline: list[tuple[str, str]] = []
        self._open: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        if tag in ("script", "style"):
            self._open = tag

    def handle_endtag(self, tag: str) -> None:
        if tag == self._open:
            self._open = None

    def handle_data(self, data: str) -> None:
        if self._open and data.strip():
            self.inline.append((self._open, data.strip()))


def parse(text: str) -> Tags:
    tags = Tags()
    tags.feed(text)
    tags.close()
    return tags


def csp_faults(html: str) -> list[str]:
    """What in ``html`` Cockpit's policy would refuse, one line each."""
    tags = parse(html)
    faults = [f"inline <{tag}>: {body[:40]}" for tag, body in tags.inline]
    for tag, attrs in tags.tags:
        if tag == "script" and not attrs.get("src"):
            faults.append("<script> without src")
        if tag == "style":
            faults.append("<style> element")
        faults += [f"<{tag} {name}=…> inline handler" for name in attrs
                   if name.startswith("on")]
        if "style" in attrs:
            faults.append(f"<{tag} style=…>")
        for name in ("src", "href"):
            if re.match(r"(?i)\s*javascript:", attrs.get(name) or ""):
                faults.append(f"<{tag} {name}=javascript:…>")
    return faults


def test_the_page_has_its_four_files_and_the_package_ships_exactly_them() -> None:
    assert sorted(p.name for p in PAGE.iterdir()) == sorted(FILES)
    install = (REPO / "debian" / "cockpit-lokid.install").read_text().split("\n")
    shipped = sorted(line.split()[0] for line in install if line.strip())
    assert shipped == sorted(f"cockpit/lokid/{f}" for f in FILES)
    assert {line.split()[1] for line in install if line.strip()} == {"usr/share/cockpit/lokid/"}


def test_the_manifest_puts_the_page_in_cockpits_menu() -> None:
    manifest = json.loads((PAGE / "manifest.json").read_text())
    assert manifest["version"] == 0
    entry = manifest["menu"]["index"]     # the page at index.html, in the System menu
    assert entry["label"] and isinstance(entry.get("order", 0), int)


def test_the_checker_sees_what_the_policy_refuses() -> None:
    """Each fault it should catch, caught; a page without them passes."""
    bad = ('<script>alert(1)</script><script src="x.js"></script>'
           '<button onclick="go()">x</button><p style="color:red">y</p>'
           '<style>p {}</style><a href="javascript:go()">z</a>')
    faults = csp_faults(bad)
    assert any("inline <script>" in f for f in faults)
    assert any("<script> without src" in f for f in faults)
    assert any("onclick" in f for f in faults)
    assert any("style=" in f for f in faults)
    assert any("<style> element" in f for f in faults)
    assert any("javascript:" in f for f in faults)
    assert csp_faults('<script src="a.js"></script><p hidden>ok</p>') == []


def test_index_html_has_nothing_inline_that_cockpits_policy_refuses() -> None:
    assert csp_faults((PAGE / "index.html").read_text()) == []


def test_index_html_loads_only_cockpit_js_and_the_pages_own_files() -> None:
    tags = parse((PAGE / "index.html").read_text())
    scripts = [a["src"] for t, a in tags.tags if t == "script"]
    links = [a["href"] for t, a in tags.tags if t == "link"]
    # cockpit.js first: lokid.js uses its global at once.
    assert scripts == [COCKPIT_JS, "lokid.js"]
    assert links == ["lokid.css"]
    for local in scripts[1:] + links:
        assert local in FILES, local


def test_lokid_js_fetches_nothing_and_evaluates_no_strings() -> None:
    js = (PAGE / "lokid.js").read_text()
    css = (PAGE / "lokid.css").read_text()
    for text in (js, css):
        assert not re.search(r"(?i)\b(https?:)?//[a-z0-9.-]+\.[a-z]{2,}/", text), \
            "a network address"
        assert "@import" not in text and "url(" not in text
    for word in ("fetch(", "XMLHttpRequest", "WebSocket", "import(", "eval(", "new Function",
                 "innerHTML", "document.write", "setInterval"):
        # setInterval: the page follows signals and never polls.
        assert word not in js, word
    assert {m for m in re.findall(r"\bcockpit\.(\w+)\(", js)} <= {"dbus", "message"}


def api_names() -> set[str]:
    """The interfaces and their members documented in the D-Bus API's XML."""
    names: set[str] = set()
    for iface in ET.parse(API).getroot().iter("interface"):
        names.add(iface.attrib["name"])
        names.update(m.attrib["name"] for m in iface if m.tag in ("method", "property",
                                                                    "signal"))
    return names


def test_lokid_js_uses_only_the_documented_d_bus_api() -> None:
    """Every D-Bus name the page reads or calls (p.State, manager.call("StartPreset"),
    the "EngineStateChanged" event) is in data/dbus/org.lokid.Lokid1.xml: the page shows
    only documented facts, and a member renamed there cannot leave it silently blank."""
    js = (PAGE / "lokid.js").read_text()
    known = api_names()
    used = set(re.findall(r"\b(?:p|manager)\.([A-Z]\w*)", js))
    # Verbs called and signals followed: quoted CamelCase words ("Start" is a label).
    used |= set(re.findall(r'"([A-Z][a-z]+(?:[A-Z][a-z]+)+)"', js))
    used |= set(re.findall(r'"(org\.lokid\.Lokid1\.(?:Manager|Preset))"', js))
    assert {"State", "Presets", "BrokenPresets", "StartPreset", "StopPreset",
            "EngineStateChanged", "SpecActive", "PendingRestart"} <= used
    assert used - known == set()
