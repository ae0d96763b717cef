"""Where an engine is reached: its listening address turned into a URL a client can use.

A plan binds the engine to ``host``; a wildcard (``0.0.0.0``, ``::``) is not an
address to connect to, so a client on this machine goes through loopback.
"""

from __future__ import annotations


def reachable_host(host: str) -> str:
    """Where to reach an engine listening on ``host``: a wildcard means loopback."""
    if host in ("0.0.0.0", ""):
        return "127.0.0.1"
    if host == "::":
        return "::1"
    return host


def engine_url(host: str, port: int) -> str:
    host = reachable_host(host)
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
