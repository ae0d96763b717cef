"""The gateway's table of llama-server's routes (issue 48, lokid.gateway.routetable)
against the engine build itself, the gateway's own routes and the README.

The engine's routes are read from the engine build (``make engine`` builds it from
PyPI's sdist in a temporary directory and keeps only the wheel, so its source is not
on a CI machine): each route is registered from a string literal of
``libllama-server-impl.so`` (or of a static ``llama-server``), kept there NUL-ended.
A route the engine gains is a literal this table does not name, and the test fails
saying which. The linker stores a literal that ends another only once (``/health``
inside ``/v1/health``), so a route of the table is found as the end of a literal."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from support import REPO

from lokid.gateway import routetable
from lokid.gateway.routetable import ENGINE_TABLE

# a route-like literal: lower case, and a word of 4 letters at least (machine code holds
# short runs such as "/jzm" that end in a NUL by chance)
ROUTE_LITERAL = re.compile(rb"(?<=\x00)/[a-z0-9_][a-z0-9_/:.-]*(?=\x00)")
WORD = re.compile(rb"[a-z_-]{4,}")
ANY_LITERAL = re.compile(rb"(?<=\x00)/[\x21-\x7e]*(?=\x00)")
FILES = (b"/etc/", b"/usr/", b"/tmp/", b"/proc/", b"/dev/", b"/sys/", b"/var/", b"/lib",
         b"/opt/", b"/run/", b"/home/", b"/bin/", b"/sbin/", b"/build/", b"/root/")
# the web UI's page, served only by a build with its assets (LLAMA_UI_HAS_ASSETS)
ONLY_WITH_UI = {"/index.html"}


def route_literals(data: bytes) -> set[str]:
    """The literals of a binary that look like an HTTP route (not a file's path)."""
    return {m.group().decode() for m in ROUTE_LITERAL.finditer(data)
            if not m.group().startswith(FILES) and WORD.search(m.group())}


def unnamed(data: bytes) -> list[str]:
    """The engine's routes in ``data`` that the table does not name."""
    named = {r.path for r in ENGINE_TABLE}
    return sorted(route_literals(data) - named)


def server_binaries(engine: str) -> list[Path]:
    """The engine build's files that hold llama-server's HTTP routes."""
    found = [p for p in sorted(Path(engine).parent.iterdir())
             if "server" in p.name and not p.name.startswith("ggml-rpc") and not p.is_symlink()
             and p.is_file()]
    assert found, f"no llama-server file beside {engine}"
    return found


@pytest.mark.engine
def test_the_engine_build_has_no_route_the_table_does_not_name(engine: str) -> None:
    data = b"".join(p.read_bytes() for p in server_binaries(engine))
    assert {"/v1/chat/completions", "/v1/audio/transcriptions",
            "/v1/chat/completions/control", "/slots/:id_slot"} <= route_literals(data)
    missing = unnamed(data)
    assert not missing, (
        f"llama-server registers {missing}, which lokid.gateway.routetable.ENGINE_TABLE "
        "does not name: offer each (lokid.gateway.routes) or say why not, and update the "
        "table in docs/gateway.md")
    # and the table names no route this build lacks
    ends = [m.group() for m in ANY_LITERAL.finditer(data)]
    stale = {r.path for r in ENGINE_TABLE
             if not any(e.endswith(r.path.encode()) for e in ends)}
    assert stale <= ONLY_WITH_UI, stale


def test_a_route_the_engine_gains_is_found() -> None:
    # as a newer build would hold it, among literals that are no routes
    data = (b"\x00/v1/chat/completions\x00/v1/audio/translations\x00/etc/ssl/certs\x00"
            b"/jzm\x00/E1\x00/Slots\x00/v1/health\x00")
    assert unnamed(data) == ["/v1/audio/translations"]


def test_the_table_and_the_gateways_routes_agree() -> None:
    assert routetable.check() == []
    offered = routetable.offered_by_engine_routes()
    assert offered["/v1/audio/transcriptions"] == frozenset({"POST"})
    assert "/slots" not in offered and "/v1/health" not in offered   # the gateway's own
    for r in ENGINE_TABLE:
        assert bool(r.offered) != bool(r.why), r   # offered, or why not: never both


def test_the_guide_shows_the_table() -> None:
    readme = (REPO / "docs" / "gateway.md").read_text()
    rows = "".join("  " + line + "\n" for line in routetable.markdown().splitlines())
    assert rows in readme, ("docs/gateway.md's route table is not lokid.gateway.routetable's: "
                            "paste routetable.markdown() (indented 2 spaces)")
