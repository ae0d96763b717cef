"""An on-demand preset's own port under systemd: systemd holds it, the engine listens
privately, ``systemd-socket-proxyd`` relays (issue 22, item 4).

For a preset with ``[serve] on_demand = true`` lokid's generator writes an instance of
``loki-port@.socket`` listening on the preset's host:port, and ``loki-port@.service``
runs systemd's own ``systemd-socket-proxyd`` relaying it to the engine's UNIX socket
:func:`engine_socket` (llama-server listens on a ``--host`` path ending in ``.sock``).
A client that knew the preset's URL keeps it: its first connection waits in the
socket's backlog while the relay's unit starts the engine's and waits for it to be
ready (``Type=notify``), so it is neither refused nor answered 502; no Python sits in
the byte path.

One home for the rule (:func:`held_by_systemd`): the generator writes the units by it,
and marks the engine's drop-in with :data:`HELD_ENV`; the engine's own start plans by
that mark (what the generator really wrote, so an edit not yet seen by a
``daemon-reload`` keeps the engine on its port); a plan for the unit made from outside
(``lokid plan``, the daemon) plans by the rule. Under the local runner nothing
changes: no systemd holds anything, the port is the engine's own.

Part of the pure core: names and text only.
"""

from __future__ import annotations

from .flags import flag_value

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing; mypy knows the name
if TYPE_CHECKING:
    from collections.abc import Mapping

    from ..config.files import Preset

PORT_UNIT_PREFIX = "loki-port@"
# The engine unit's runtime directory (RuntimeDirectory=loki of a system unit, %t/loki):
# where loki-port@.service's ExecStart= looks for the socket too (%t/loki/%i.sock).
UNIT_RUNTIME_DIR = "/run/loki"
SOCKET_SUFFIX = ".sock"
# Set in the engine unit's generated drop-in when its port unit exists: the value is
# the socket unit's name.
HELD_ENV = "LOKI_PORT_UNIT"


def port_socket(preset: str) -> str:
    return f"{PORT_UNIT_PREFIX}{preset}.socket"


def port_service(preset: str) -> str:
    return f"{PORT_UNIT_PREFIX}{preset}.service"


def engine_socket(preset: str) -> str:
    """The UNIX socket the engine of an on-demand preset listens on under systemd."""
    return f"{UNIT_RUNTIME_DIR}/{preset}{SOCKET_SUFFIX}"


def marked_socket(preset: str, environ: Mapping[str, str]) -> str:
    """The engine's socket where the unit's environment carries the generator's mark for
    this preset (:data:`HELD_ENV`), else "": how a start inside the unit decides."""
    return engine_socket(preset) if environ.get(HELD_ENV) == port_socket(preset) else ""


def listen_stream(host: str, port: int) -> str | None:
    """``ListenStream=``'s value for the engine's host:port; None when the host is a
    name (a socket unit takes addresses only, and a generator must not wait on DNS).
    A wildcard means every address, as the engine's bind does."""
    import ipaddress  # here: a start's path reads this module, never this function

    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None
    return f"[{address}]:{port}" if address.version == 6 else f"{address}:{port}"


def held_by_systemd(preset: Preset, host: str, port: int) -> str | None:
    """``ListenStream=``'s value when systemd holds the preset's port (on demand, an
    address to listen on); None when the engine listens on it itself. ``host``,
    ``port``: where the preset listens (:func:`lokid.core.launch.conflicts.listen_address`)."""
    if not preset.serve.on_demand or preset.external is not None:
        return None
    if flag_value(preset.extra_args, "--host") is not None:
        return None     # the operator says where the engine listens (see extra_host_note)
    return listen_stream(host, port)


def name_note(host: str) -> str:
    """Why an on-demand preset's port is its engine's own all the same."""
    return (f"on demand, but host {host!r} is a name: systemd's socket unit listens on "
            "addresses only, so the engine listens on the port itself (no port unit; "
            "bind the preset to an address to have systemd hold it)")


def extra_host_note() -> str:
    """Why an on-demand preset with ``--host`` in extra_args holds no port unit."""
    return ("on demand, but extra_args sets --host: the engine listens where it says, "
            "so systemd holds no port for it (no port unit)")


def held_note(preset: str, port: int) -> str:
    """What ``lokid plan`` says of a port systemd holds."""
    return (f"on demand: systemd holds port {port} ({port_socket(preset)}), the engine "
            f"listens on {engine_socket(preset)}; the first connection to the port starts "
            f"it and waits until it is ready, and a stop by hand leaves the port listening "
            f"(the next connection starts it again; `systemctl stop {port_socket(preset)}` "
            "closes it)")


def stop_note(preset: str) -> str:
    """What ``lokictl stop`` says of an on-demand preset: stopped is not closed."""
    return (f"{preset} is on demand: the next request starts it again (through the "
            f"gateway, or on its own port where systemd holds it: `systemctl stop "
            f"{port_socket(preset)}` closes that port)")
