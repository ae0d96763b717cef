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
FILES = tuple(sorted(p.name for p in PAGE.iterdir()))
SCRIPTS = tuple(f for f in FILES if f.endswith(".js"))
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


def test_the_package_ships_every_file_of_the_page_and_only_them() -> None:
    """debian/cockpit-lokid.install takes cockpit/lokid/ whole, and it holds only what
    Cockpit serves: the manifest, the HTML, the style sheet and the scripts it loads."""
    install = [line.split() for line in
               (REPO / "debian" / "cockpit-lokid.install").read_text().splitlines()
               if line.strip()]
    assert install == [["cockpit/lokid/*", "usr/share/cockpit/lokid/"]]
    assert {"index.html", "lokid.css", "manifest.json", "common.js", "main.js"} <= set(FILES)
    assert {f.rsplit(".", 1)[1] for f in FILES} == {"html", "css", "json", "js"}


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


def test_index_html_loads_cockpit_js_then_every_script_of_the_page() -> None:
    tags = parse((PAGE / "index.html").read_text())
    scripts = [a["src"] for t, a in tags.tags if t == "script"]
    links = [a["href"] for t, a in tags.tags if t == "link"]
    # cockpit.js first (every file uses its global at once), then common.js (the one
    # global the others add to), the router main.js last (it draws what they made).
    assert scripts[:2] == [COCKPIT_JS, "common.js"] and scripts[-1] == "main.js"
    assert sorted(scripts[1:]) == sorted(SCRIPTS), "a script the page never loads"
    assert links == ["lokid.css"]


# What cockpit.js the page may call: D-Bus, its error words, its location events, a
# process on the server as the user (journalctl: the user's own journal rights) and
# HTTP to the server's own ports (the engine, for the chat box).
COCKPIT_CALLS = {"dbus", "message", "spawn", "http", "variant", "addEventListener"}


def test_the_scripts_fetch_nothing_and_evaluate_no_strings() -> None:
    css = (PAGE / "lokid.css").read_text()
    for name in (*SCRIPTS, "lokid.css"):
        # the SVG namespace names the charts' elements; nothing is fetched from it
        text = (PAGE / name).read_text().replace('"http://www.w3.org/2000/svg"', "")
        assert not re.search(r"(?i)\b(https?:)?//[a-z0-9.-]+\.[a-z]{2,}/", text), \
            f"{name}: a network address"
    assert "@import" not in css and "url(" not in css
    for name in SCRIPTS:
        js = (PAGE / name).read_text()
        for word in ("fetch(", "XMLHttpRequest", "WebSocket", "import(", "eval(",
                     "new Function", "innerHTML", "document.write", "setInterval"):
            # setInterval: the page follows signals and never polls on a timer.
            assert word not in js, f"{name}: {word}"
        assert set(re.findall(r"\bcockpit\.(\w+)\(", js)) <= COCKPIT_CALLS, name
        # every process it runs is named, never a shell (cockpit.script is sh -c)
        assert "cockpit.script" not in js, name


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
    js = "\n".join((PAGE / name).read_text() for name in SCRIPTS)
    known = api_names()
    used = set(re.findall(r"\b(?:p|proxy|manager)\.([A-Z]\w*)", js))
    # Verbs called and signals followed: quoted CamelCase words ("Start" is a label).
    used |= set(re.findall(r'"([A-Z][a-z]+(?:[A-Z][a-z]+)+)"', js))
    used |= set(re.findall(r'"(org\.lokid\.Lokid1\.(?:Manager|Preset))"', js))
    assert {"State", "Presets", "BrokenPresets", "StartPreset", "StopPreset",
            "EngineStateChanged", "SpecActive", "PendingRestart"} <= used
    assert used - known == set()
