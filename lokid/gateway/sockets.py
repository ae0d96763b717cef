"""This host's engines reached at their UNIX socket, not through their port's relay.

Under systemd an on-demand preset's engine listens on ``/run/loki/<preset>.sock`` and
systemd holds its port (``loki-port@.socket``), relayed by ``systemd-socket-proxyd``
(:mod:`lokid.core.launch.portunit`): a client that knew the port keeps it. The gateway went
through that port too, so after every start of the engine (a cold start, a GPU group's
swap) its first connection waited for the relay's unit to be started, a sandboxed
process spawned for each start (benchmarks/swap_systemd.py, issue 31: a swap's READY to
its first byte 62 ms with it, 15 ms without); and every byte of every answer crossed one
more process.

The daemon says where an engine listens (its ``Stats``' ``socket``); the engine's step
gives the socket to the gateway's group once the engine answers
(:mod:`lokid.host.sockshare`). The gateway's connections to that engine go there:

- the socket is tried first; where the connect fails (none there: the engine runs a plan
  from before a ``daemon-reload``; refused: it is gone; EACCES: an install whose engine
  could not give it to the gateway's group) the port is used, as before, and the log says
  so once per socket and reason;
- only this host's engines: a peer gateway or an external API is never routed so;
- the requests straight to the port are the relay's, unchanged.

:class:`EngineConnector` is aiohttp's pool with that route (the relay's short answers,
the slots, ``/health``); :func:`open_engine` is the same connect for the byte tunnel
(:mod:`lokid.gateway.tunnel`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import aiohttp

log = logging.getLogger("lokid.gateway")

# (host, port) of an engine's URL -> its UNIX socket, "" for none
Route = Callable[[str, int], str]


class Fallbacks:
    """The sockets whose connect failed, by reason: each said once in the log (a
    connect that works again forgets it)."""

    def __init__(self) -> None:
        self.said: set[tuple[str, str]] = set()

    def failed(self, path: str, host: str, port: int, e: OSError) -> None:
        why = e.strerror or type(e).__name__
        if (path, why) not in self.said:
            self.said.add((path, why))
            log.info("engine at %s:%d: its socket %s cannot be reached (%s): through its "
                     "port instead", host, port, path, why)

    def worked(self, path: str) -> None:
        if self.said:
            self.said = {s for s in self.said if s[0] != path}


FALLBACKS = Fallbacks()


async def _at_socket(factory: Callable[[], Any], path: str, host: str, port: int,
                     timeout: float | None) -> tuple[asyncio.Transport, Any] | None:
    """A connection at the engine's socket ``path``; None (said once) where it fails."""
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(timeout):   # no wait_for: its task is a turn more
            connected = await loop.create_unix_connection(factory, path)
    except OSError as e:
        FALLBACKS.failed(path, host, port, e)
        return None
    FALLBACKS.worked(path)
    return connected


async def open_engine(factory: Callable[[], asyncio.BaseProtocol], host: str, port: int,
                      route: Route | None, timeout: float | None
                      ) -> tuple[asyncio.Transport, Any]:
    """A connection to the engine at ``host``:``port``: at its socket where ``route`` names
    one and it takes the connect, else at the address. OSError when neither does."""
    path = route(host, port) if route is not None else ""
    connected = await _at_socket(factory, path, host, port, timeout) if path else None
    if connected is not None:
        return connected
    loop = asyncio.get_running_loop()
    # asyncio.timeout, not wait_for: on Python 3.11 wait_for runs the connect in a task of
    # its own, turns of the event loop more before the request is written, each behind
    # every other request's steps (issue 47)
    async with asyncio.timeout(timeout):
        return await loop.create_connection(factory, host, port)


class EngineConnector(aiohttp.TCPConnector):
    """aiohttp's TCP pool whose connections to an engine with a socket (``route``) go to
    that socket. The pool keys them by the engine's URL as before: one engine, one key."""

    def __init__(self, route: Route, **kwargs: Any):
        super().__init__(**kwargs)
        self.route = route

    async def _create_connection(self, req: Any, traces: Any, timeout: Any) -> Any:
        path = "" if req.proxy or req.is_ssl() else self.route(req.host, req.port)
        connected = await _at_socket(self._factory, path, req.host, req.port,
                                     timeout.sock_connect) if path else None
        if connected is not None:
            return connected[1]
        return await super()._create_connection(req, traces, timeout)
