"""``loki-gateway.socket`` kept in line with lokid.toml's ``[gateway] listen``.

The generator writes the socket's ``ListenStream=`` lines and a
``sockets.target.wants/`` link, but a link only takes effect when its target
starts: at boot. On a running system ``systemctl daemon-reload`` loads the
socket and starts nothing, so an operator who set ``listen`` and reloaded found
nothing listening (last session's walk). After each reload the daemon (which
runs as root and already drives the engines through systemd) brings the socket
in line:

- listen set, socket not active: started;
- listen unset (the generator wrote no address), socket active: stopped, which
  stops the gateway with it (``Requires=``): the operator turned it off;
- listen changed, socket active: restarted when the gateway service is not
  running (nothing to cut); while it runs, a warning says that
  ``systemctl restart loki-gateway.socket`` applies it, because that restart ends
  the gateway's requests in flight.

A running socket keeps the addresses it bound until it restarts, but systemd's
``Listen`` property shows the reloaded unit's settings at once: what it bound is
the listen the daemon last aligned it to (kept by the caller; at the daemon's start,
lokid.toml's as then, taken as what the socket holds). A listen edited while the
daemon was down and reloaded before it came back is not noticed as a change.

With listen unset, a socket systemd has not loaded is not running: nothing to stop, and
nothing is asked of it. Asked (``LoadUnit``), systemd loads the shipped socket, which
has no address, and logs "Unit has no Listen setting … Refusing." each time: ten such
warnings at an install, before any listen was set (issue 28, item 17).

Each decision is :func:`decide`, pure; :func:`align` asks systemd and acts.
"""

from __future__ import annotations

import logging

from dbus_fast import DBusError
from dbus_fast.aio import MessageBus

from ..core.serve.tables import split_listen
from .systemd_runner import SYSTEMD
from .unitcalls import queue, unit_properties, units_matching

log = logging.getLogger("lokid.systemd")

SOCKET = "loki-gateway.socket"
SERVICE = "loki-gateway.service"
LIVE = ("active", "activating", "reloading")
# StopUnit of a socket that a reload left without ListenStream= and that stopped since:
# systemd has unloaded it
NO_SUCH_UNIT = SYSTEMD + ".NoSuchUnit"


def addresses(listen: tuple[str, ...]) -> set[str]:
    """The addresses as systemd's ``Listen`` property shows them (``[::1]:8000``)."""
    out = set()
    for text in listen:
        host, port = split_listen(text)
        out.add(f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
    return out


def decide(listen: set[str], socket_state: str, socket_listens: set[str],
           service_state: str) -> tuple[str, str]:
    """What to do (``start``, ``stop``, ``restart``, ``warn`` or ``""``) and why;
    ``socket_listens``: the addresses the running socket bound."""
    running = socket_state in LIVE
    if not listen:
        if running:
            return "stop", "lokid.toml sets no [gateway] listen any more"
        return "", ""
    if not running:
        return "start", f"lokid.toml's [gateway] listen is {', '.join(sorted(listen))}"
    if socket_listens == listen:
        return "", ""
    why = (f"it listens on {', '.join(sorted(socket_listens)) or 'nothing'}, lokid.toml's "
           f"[gateway] listen says {', '.join(sorted(listen))}")
    if service_state in LIVE:
        return "warn", why
    return "restart", why


async def align(bus: MessageBus, listen: tuple[str, ...],
                before: tuple[str, ...] | None) -> str:
    """Bring the socket in line with ``listen`` (``before``: the listen it was last aligned
    to, None for the one it holds); what was done ("" for nothing)."""
    wanted = addresses(listen)
    try:
        if not wanted and SOCKET not in await units_matching(bus, SOCKET):
            return ""   # not loaded, so not running: loading it would only warn
        sock = await unit_properties(bus, SOCKET, "Unit", ("ActiveState", "LoadState"))
        # not installed: nothing to align; "bad-setting" is a loaded socket whose
        # ListenStream= lines the reload just took away, which may still be running
        if sock["LoadState"] in ("not-found", "masked"):
            return ""
        service = await unit_properties(bus, SERVICE, "Unit", ("ActiveState",))
    except DBusError as e:
        log.warning("%s: cannot read its state: %s", SOCKET, e.text)
        return ""
    action, why = decide(wanted, str(sock["ActiveState"]),
                         wanted if before is None else addresses(before),
                         str(service["ActiveState"]))
    if action == "warn":
        log.warning("%s: %s; `systemctl restart %s` applies it (and ends the gateway's "
                    "requests in flight)", SOCKET, why, SOCKET)
        return action
    if not action:
        return ""
    log.info("%s: %s, because %s", SOCKET,
             {"start": "starting", "stop": "stopping", "restart": "restarting"}[action], why)
    try:
        await queue(bus, action, SOCKET)
    except DBusError as e:
        if action == "stop" and e.type == NO_SUCH_UNIT:
            return action   # stopped meanwhile (a reload after another), and unloaded
        log.warning("%s: cannot %s it: %s", SOCKET, action, e.text)
        return ""
    return action
