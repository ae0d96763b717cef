"""Each on-demand preset's ``loki-port@<preset>.socket`` kept in line with the presets
after a ``daemon-reload`` (issue 22, item 4), as :mod:`lokid.runners.gatewaysocket`
does for the gateway's socket.

The generator writes a port socket's ``ListenStream=`` and its ``sockets.target.wants``
link, but a link takes effect when its target starts: at boot. On a running system a
reload loads the socket and starts nothing, so a preset made ``on_demand`` (or a new
one) would not listen until its first start by hand (its engine unit wants its socket)
or the next boot. After each reload the daemon brings every port socket in line:

- wanted (the generator wrote it) and not active: started, unless the preset's engine
  runs (on the port itself, planned before the socket existed: the bind would fail;
  said once, and the socket opens at the engine's next start, which wants it);
- active and no longer wanted (on_demand turned off, the preset removed): stopped,
  unless its engine runs (a stop would cut the connections the relay carries, and leave
  the engine, which listens on its UNIX socket, unreachable until it restarts): said;
- active on another address than wanted: restarted when nothing runs behind it, else
  said. What a running socket bound is what the daemon last aligned it to (kept by the
  caller), as for the gateway: systemd's ``Listen`` shows the reloaded settings at once.

Each decision is :func:`decide`, pure; :func:`align` asks systemd and acts, one preset
failing never stops the others; :func:`wanted_ports` reads what the generator wrote
from the same files by the same rule. The daemon's hook, after each reload (beside the
gateway's alignment)::

    from ..runners.portsockets import align, wanted_ports
    wanted = await asyncio.to_thread(wanted_ports, self.config_dir)
    self.port_listen = await align(self.bus, wanted, self.port_listen)   # None at start
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from dbus_fast import DBusError
from dbus_fast.aio import MessageBus

from ..core.launch.portunit import PORT_UNIT_PREFIX, port_service, port_socket
from ..core.names import engine_unit
from .unitcalls import active_state, queue, units_matching

log = logging.getLogger("lokid.systemd")

LIVE = ("active", "activating", "reloading", "deactivating")


def decide(wanted: str, bound: str, socket_state: str, relay_state: str,
           engine_state: str) -> tuple[str, str]:
    """What to do with one preset's port socket (``start``, ``stop``, ``restart``,
    ``warn`` or ``""``) and why. ``wanted``: the ``ListenStream=`` the generator wrote
    ("" for none); ``bound``: the one the running socket holds."""
    running = socket_state in LIVE
    relaying = relay_state in LIVE
    if not wanted:
        if not running:
            return "", ""
        if relaying or engine_state in LIVE:
            return "warn", ("the preset holds no port unit any more, but its engine runs "
                            "behind it: stop the socket, then restart the preset")
        return "stop", "the preset holds no port unit any more"
    if not running:
        if engine_state in LIVE:
            return "warn", (f"its engine runs and holds port {wanted} itself: the socket "
                            "opens at the engine's next start")
        return "start", f"the preset is on demand at {wanted}"
    if bound == wanted:
        return "", ""
    why = f"it listens on {bound or 'nothing'}, the preset says {wanted}"
    if relaying or engine_state in LIVE:
        return "warn", why + f": `systemctl restart {PORT_UNIT_PREFIX}<preset>.socket` " \
            "applies it (and cuts the connections it relays)"
    return "restart", why


def wanted_ports(config_dir: str) -> dict[str, str]:
    """Each preset's ``ListenStream=`` as the generator writes it (preset → address),
    read from the files now (blocking); {} when lokid.toml or the presets directory
    cannot be read (the generator says why)."""
    from ..core.config import files as cfg
    from ..core.errors import ConfigError
    from ..unit.generator import held_ports

    try:
        glob = cfg.load_global(config_dir)
        presets, _ = cfg.load_presets(config_dir)
    except ConfigError:
        return {}
    return held_ports(glob, presets, quiet=True)


async def _loaded_sockets(bus: MessageBus) -> set[str]:
    """The presets whose port socket systemd has loaded (listed by its units)."""
    units = await units_matching(bus, f"{PORT_UNIT_PREFIX}*.socket")
    return {u[len(PORT_UNIT_PREFIX):-len(".socket")] for u in units}


async def align(bus: MessageBus, wanted: Mapping[str, str],
                before: Mapping[str, str] | None) -> dict[str, str]:
    """Bring each port socket in line with ``wanted`` (preset → ``ListenStream=``, as
    :func:`lokid.unit.generator.held_ports` gives it); ``before``: what each was last
    aligned to (None: what they hold is taken to be ``wanted``). Returns what each
    socket holds now, for the next call."""
    try:
        names = set(wanted) | await _loaded_sockets(bus)
    except DBusError as e:
        log.warning("the on-demand ports: cannot list their sockets: %s", e.text)
        return dict(wanted if before is None else before)
    holds = dict(wanted if before is None else before)
    for name in sorted(names):
        socket = port_socket(name)
        try:
            states = [await active_state(bus, u) for u in (socket, port_service(name),
                                                      engine_unit(name))]
        except DBusError as e:
            log.warning("%s: cannot read its state: %s", socket, e.text)
            continue
        # A socket running that no alignment started (by hand, by its engine's Wants=,
        # or between a reload and this) bound what the generator wrote last: what is
        # wanted now. Taken as "nothing", it was restarted, and a client's connection
        # found the port closed for that moment.
        if name in wanted and name not in holds:
            holds[name] = wanted[name]
        action, why = decide(wanted.get(name, ""), holds.get(name, ""), *states)
        if action == "warn":
            log.warning("%s: %s", socket, why)
        if action in ("", "warn"):
            continue
        log.info("%s: %s, because %s", socket, action, why)
        try:
            await queue(bus, action, socket)
        except DBusError as e:
            log.warning("%s: cannot %s it: %s", socket, action, e.text)
            continue
        if action == "stop":
            holds.pop(name, None)
        else:
            holds[name] = wanted[name]
    return holds
