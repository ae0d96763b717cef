"""Port conflicts: two presets on one address, and who holds a busy port.

Two engines cannot listen on one port. Started one after the other, the
second only fails at its prestart, and only while the first runs; this module
finds the clash from the config, so that ``lokid plan``, the generator, an
edit and the daemon report it before either starts (:func:`port_conflicts`).
The clash belongs to the newcomer: the preset that holds the address is the
one that started on it last (a running engine's start is the last one on its
port: its runtime plan says so), else, when none has since boot, the first by
name; it stays startable, and every preset that would listen where it does is
refused with the reason. A preset file dropped beside a running engine with
its port therefore never takes that engine down at its next restart, and
which side is refused does not change while both files stay as they are
(only the holder can start, and its start keeps it the last). When a port is
busy at start all the same, it says
who holds it (:func:`holder`): a preset, from the runtime plans in the
runtime directory, or a process, from ``/proc`` (both read by
:mod:`lokid.planning.endpoint`).

An address can also be unusable on its own: a host that does not resolve, an
address of another machine, a port below 1024 for the unit's unprivileged
user. Those are config errors, reported against the file and key that set
them (:func:`listen_source`), with what would be valid (:func:`unresolvable`,
:func:`not_local`, :func:`port_refused`); :mod:`lokid.planning.endpoint` finds
them, for the plan and for the start alike.

Pure: addresses, presets and runtime plans in, messages out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, NamedTuple

from .flags import flag_value

if TYPE_CHECKING:  # the unit's start path checks its port through here: no TOML reader
    from ..config.files import GlobalConfig, Preset
    from .runtimeplan import RuntimePlan

# What a host name means for binding; anything else is compared as written.
_LOCALHOST = frozenset({"127.0.0.1", "::1"})


class Endpoint(NamedTuple):
    """Where a preset's engine listens, and the preset's file (for the message)."""

    host: str
    port: int
    path: str


def listen_address(preset: Preset, config: GlobalConfig) -> tuple[str, int]:
    """Where the preset's engine will listen: ``--host``/``--port`` in extra_args win
    over the preset's port and lokid.toml's host and port, as in
    :func:`lokid.core.launch.plan.build_plan` (the plan's ``host``/``port`` are authoritative
    where a plan exists; this is the same rule for presets not planned)."""
    port = preset.port if preset.port is not None else config.port
    extra_port = _extra_port(preset)
    if extra_port is not None:
        port = extra_port
    host = flag_value(preset.extra_args, "--host") or config.host
    return host, port


def _extra_port(preset: Preset) -> int | None:
    """The port extra_args sets, when it is one (the plan ignores anything else)."""
    value = flag_value(preset.extra_args, "--port")
    if value is not None and value.isdigit() and 0 < int(value) < 65536:
        return int(value)
    return None


class Setting(NamedTuple):
    """Where a listening setting is written, for its error: the file and the key."""

    path: str   # "" for lokid's default (no lokid.toml)
    key: str    # "host", "port" or "extra_args"; "" where not known


class ListenSource(NamedTuple):
    """Where the host and the port a preset's engine listens on are set."""

    host: Setting
    port: Setting


# Where the caller does not have the files at hand (a start reusing its last plan): the
# messages name none.
UNKNOWN_SOURCE = ListenSource(Setting("", ""), Setting("", ""))


def listen_source(preset: Preset, config: GlobalConfig) -> ListenSource:
    """Which file and key set the host and the port of :func:`listen_address`."""
    if _extra_port(preset) is not None:
        port = Setting(preset.path, "extra_args")
    elif preset.port is not None:
        port = Setting(preset.path, "port")
    else:
        port = Setting(config.path, "port" if config.path else "")
    if flag_value(preset.extra_args, "--host"):
        host = Setting(preset.path, "extra_args")
    else:
        host = Setting(config.path, "host" if config.path else "")
    return ListenSource(host, port)


def _setting(key: str, flag: str, value: str) -> str:
    """A listening setting as a message names it after ConfigError's "file: key: ":
    ``--host 'x'`` in extra_args, ``'x'`` after ``host:``, ``host 'x'`` alone."""
    if key == "extra_args":
        return f"{flag} {value}"
    return value if key else f"{flag.lstrip('-')} {value}"


_ADDRESSES = "127.0.0.1 (this machine only) or 0.0.0.0 (every interface)"


def unresolvable(host: str, key: str, reason: str) -> str:
    """``host`` does not resolve (``reason``: the resolver's words)."""
    return (f"{_setting(key, '--host', repr(host))} does not resolve to an address "
            f"({reason}): use an address or a name of this host, such as {_ADDRESSES}")


def not_local(host: str, key: str) -> str:
    """``host`` resolves, but to no address of this machine (EADDRNOTAVAIL)."""
    return (f"{_setting(key, '--host', repr(host))} is not an address of this host: use one "
            f"of its addresses, such as {_ADDRESSES}")


def port_refused(port: int, key: str, user: str, unprivileged_start: int) -> str:
    """``port`` is below net.ipv4.ip_unprivileged_port_start and ``user`` may not bind it."""
    return (f"{_setting(key, '--port', str(port))} is below {unprivileged_start}: user {user}, "
            f"which runs the engine, may not listen on it: use a port of {unprivileged_start} "
            f"or above, or set the sysctl net.ipv4.ip_unprivileged_port_start to {port}")


def unix_socket(host: str, key: str) -> str:
    """``host`` names a Unix socket (llama-server listens on one for a host ending in
    ``.sock``): lokid reaches its engines over TCP."""
    return (f"{_setting(key, '--host', repr(host))} is a Unix socket: lokid reaches the "
            f"engine over TCP (/health, the benchmark); use an address such as {_ADDRESSES}")


def cannot_listen(host: str, port: int, reason: str) -> str:
    """Any other refusal to bind (``reason``: the kernel's words)."""
    return f"cannot listen on port {port} of {host}: {reason}"


def _addresses(host: str) -> frozenset[str] | None:
    """The addresses a bind to ``host`` takes; None for a wildcard (all of them)."""
    name = host.strip().lower().strip("[]")
    if name in ("", "*"):
        return None
    if name == "localhost":
        return _LOCALHOST
    import ipaddress

    try:
        ip = ipaddress.ip_address(name)
    except ValueError:
        return frozenset({name})
    return None if ip.is_unspecified else frozenset({ip.compressed})


def overlap(a: str, b: str) -> bool:
    """Whether binds to hosts ``a`` and ``b`` on one port clash: the same address, or
    either a wildcard (``0.0.0.0`` and ``::`` are both taken as taking every address:
    a dual-stack ``::`` does, and a v4-only/v6-only split is not worth guessing)."""
    x, y = _addresses(a), _addresses(b)
    return x is None or y is None or bool(x & y)


class Started(NamedTuple):
    """A preset's last start, from its runtime plan: where it listened, and when it was
    planned (Unix time). It holds its preset's address only if it is the same one."""

    host: str
    port: int
    at: float


def _since(name: str, mine: Endpoint, started: Mapping[str, Started]) -> float | None:
    """When ``name`` last started on the address it has now (None: not since boot)."""
    s = started.get(name)
    if s is None or s.port != mine.port or not overlap(s.host, mine.host):
        return None
    return s.at


def _ranked(items: list[tuple[str, Endpoint]],
            started: Mapping[str, Started]) -> list[tuple[str, Endpoint]]:
    """Who holds first: the presets that last started on their current address, the
    latest first; then the others, by name."""
    def key(item: tuple[str, Endpoint]) -> tuple[bool, float, str]:
        at = _since(item[0], item[1], started)
        return (at is None, -(at or 0.0), item[0])
    return sorted(items, key=key)


def port_conflicts(endpoints: Mapping[str, Endpoint | tuple[str, int, str]],
                   started: Mapping[str, Started] | None = None) -> dict[str, str]:
    """Every preset that may not start because another one holds where it would listen,
    with why.

    ``endpoints`` maps each preset name to ``(host, port, path)``: its listening
    address (:func:`listen_address`, or its plan's) and its file. Pass the
    presets that could start: a broken preset never starts, and one whose model
    is missing fails before it binds (the packaged example preset, which shares
    lokid.toml's default port with every preset that sets none). ``started``:
    each preset's last start (:class:`Started`, from its runtime plan), where
    there is one.

    The presets are taken in the order of who holds first (the last to start on
    its address, the latest first, then by name); each one that would listen
    where an earlier one kept does is refused, and the others are kept (a
    wildcard beside two hosts that do not clash with each other is refused when
    either comes first, and keeps both out when it does). Returns ``{name: message}`` for each
    refused preset (the holders are absent). The message is one line naming the
    port, the holder and its file, written to be prefixed with the preset's own
    file: "port 8080 on 127.0.0.1 belongs to preset b (/etc/loki/presets/b.toml),
    the last to start on it: set another port in this preset".
    """
    started = started or {}
    items = _ranked([(name, Endpoint(*e)) for name, e in endpoints.items()], started)
    kept: list[tuple[str, Endpoint]] = []
    out: dict[str, str] = {}
    for name, mine in items:
        holders = [(other, e) for other, e in kept
                   if e.port == mine.port and overlap(e.host, mine.host)]
        if not holders:
            kept.append((name, mine))
            continue
        listed = ", ".join(
            f"{other} ({e.path}{'' if e.host == mine.host else ', on ' + e.host})"
            for other, e in holders)
        which = "preset" if len(holders) == 1 else "presets"
        last = any(_since(other, e, started) is not None for other, e in holders)
        why = ("the last to start on it" if last else
               "first by name (no preset has started on it since boot)")
        out[name] = (f"port {mine.port} on {mine.host} belongs to {which} {listed}, {why}: "
                     "set another port in this preset")
    return out


def holder(host: str, port: int, plans: Sequence[RuntimePlan], pid: int | None,
           cmdline: Sequence[str] | None, command: str | None, user: str) -> str:
    """Who holds a busy port, for "port P on H is already in use by …".

    ``plans``: the runtime plans found (each start's address and argv); ``pid``,
    ``cmdline``, ``command``: the process listening on the port, as far as
    ``/proc`` shows it to ``user`` (None where it does not). A runtime plan can
    outlive its engine (the runtime directory is kept across stops), so where
    the process is known, a preset is named only when the process runs that
    plan's argv (its arguments: a wrapper script passes them on to the engine).
    """
    mine = [p for p in plans if p.port == port and overlap(p.host, host)]
    proc = f"pid {pid}" + (f" ({command})" if command else "") if pid is not None else ""
    if pid is not None:
        args = list(cmdline or ())[1:]
        for p in mine:
            if args and args == list(p.argv[1:]):
                return f"preset {p.preset} ({proc})"
        return f"another process: {proc}"
    if mine:
        names = ", ".join(p.preset for p in mine)
        return (f"preset {names} (its runtime plan has this port; the process is not "
                f"visible to user {user})")
    return f"another process (not visible to user {user})"
