"""The engine's port seen from outside: free before a start, answering ``/health`` after.

``check_port_free`` runs before any attempt token moves (``lokid prestart``,
``lokid run``): a second start refused because the first still loads must not
count as a failure. A busy port is reported with who holds it: the preset whose
runtime plan has the port, or the listening process found through ``/proc``
(:func:`lokid.core.launch.conflicts.holder` decides; the files are read only once
the bind has failed).

An address the engine could never listen on is a config error, found by the
same bind: a host that does not resolve, an address of another machine
(EADDRNOTAVAIL), a port below net.ipv4.ip_unprivileged_port_start for a user
without CAP_NET_BIND_SERVICE (EACCES). ``check_address`` is that check for
``lokid plan``: it binds port 0 of the address (a running engine keeps its
port, and a starting one never finds it taken by a plan) and asks
:func:`lokid.core.access.may_listen` about the port, for the engine's user,
who need not be this process (root planning for the unit's ``loki``).

``health_status`` is a raw HTTP/1.1 request on a socket (TCP, or the UNIX socket an
on-demand preset's engine listens on under systemd, :mod:`lokid.core.launch.portunit`): it
costs nothing to import and answers within milliseconds, which keeps lokid's readiness
overhead over the raw engine small (``benchmarks/readiness.py``). ``check_socket_free``
is the port check of such an engine: systemd holds the port, and the socket file the
last engine left behind is removed, since llama-server will not bind over it.
"""

from __future__ import annotations

import os

from ..core.address import reachable_host
from ..core.errors import ConfigError, PortBusyError

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing; mypy knows the name
if TYPE_CHECKING:
    from typing import Any

    from ..core.access import User
    from ..core.launch.conflicts import ListenSource, Setting

UNPRIVILEGED_PORT_START = "/proc/sys/net/ipv4/ip_unprivileged_port_start"
_CAP_NET_BIND_SERVICE = 10  # linux/capability.h


def _holder(host: str, port: int, runtime_dir: str | None) -> str:
    """Who holds the port, best effort (what this user may see of /proc and the
    runtime directory)."""
    from ..core.errors import StalePlanError
    from ..core.launch.conflicts import holder
    from ..host.proc import cmdline, command_name, pid_listening_on
    from ..store.runtimedir import RUNTIME_SUFFIX, read_runtime_plan

    plans = []
    if runtime_dir:
        try:
            names = sorted(os.listdir(runtime_dir))
        except OSError:         # not there yet, or not ours to read (/run/loki is 0750)
            names = []
        for entry in names:
            if entry.endswith(RUNTIME_SUFFIX) and not entry.startswith("."):
                try:
                    plans.append(read_runtime_plan(runtime_dir, entry[:-len(RUNTIME_SUFFIX)]))
                except StalePlanError:
                    continue
    pid = pid_listening_on(port)
    return holder(host, port, plans, pid, None if pid is None else cmdline(pid),
                  None if pid is None else command_name(pid), _my_name())


def unprivileged_port_start() -> int:
    """The lowest port any user may bind (the sysctl; the kernel's default when unread)."""
    from ..core.access import UNPRIVILEGED_PORT_START as DEFAULT

    try:
        with open(UNPRIVILEGED_PORT_START, encoding="ascii") as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return DEFAULT


def _capable() -> bool:
    """Whether this process may bind any port: CAP_NET_BIND_SERVICE in its effective set
    (root's, unless a container dropped it)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> _CAP_NET_BIND_SERVICE & 1)
    except (OSError, ValueError, IndexError):
        pass
    return os.geteuid() == 0


def _my_name() -> str:
    import pwd

    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return str(os.geteuid())


def _config_error(message: str, where: Setting) -> ConfigError:
    return ConfigError(message, where.path, None, where.key)


def _known(source: ListenSource | None) -> ListenSource:
    """``source``, or the one that names no file: imported on an error's path only (the
    conflicts module is not on a start's path when the port is free)."""
    from ..core.launch.conflicts import UNKNOWN_SOURCE

    return source or UNKNOWN_SOURCE


def _resolve(host: str, port: int, source: ListenSource | None
             ) -> list[tuple[int, tuple[Any, ...]]]:
    """Where a bind to ``host`` goes, as llama-server resolves it (getaddrinfo, passive):
    (family, address) in the resolver's order; ConfigError when nothing. The C module
    ``_socket`` (as in :func:`_bind`): the prestart step's only use of sockets, and the
    ``socket`` module's own import (selectors, its enums) cost it ~2 ms."""
    import _socket as socket

    if host.endswith(".sock"):
        from ..core.launch.conflicts import unix_socket

        where = _known(source).host
        raise _config_error(unix_socket(host, where.key), where)
    # an ASCII name as bytes: the same lookup, without loading the IDNA codec (a start's path)
    name: str | bytes = host.encode("ascii") if host.isascii() else host
    try:
        found = socket.getaddrinfo(name, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, ValueError) as e:
        # ValueError: UnicodeError (an IDNA label too long), a NUL in the name
        from ..core.launch.conflicts import unresolvable

        why = (e.strerror or str(e)) if isinstance(e, socket.gaierror) else str(e)
        where = _known(source).host
        raise _config_error(unresolvable(host, where.key, why), where) from None
    return [(family, address) for family, _, _, _, address in found
            if family in (socket.AF_INET, socket.AF_INET6)]


def _bind(host: str, port: int, source: ListenSource | None,
          any_port: bool = False) -> OSError | None:
    """Bind ``host``:``port`` (port 0 with ``any_port``) as the engine will, trying each
    address in turn; None once one binds, else the first address's error."""
    import _socket as socket

    first: OSError | None = None
    for family, address in _resolve(host, port, source):
        if any_port:
            address = (address[0], 0, *address[2:])
        s = socket.socket(family, socket.SOCK_STREAM)
        try:
            # SO_REUSEADDR: a port in TIME_WAIT after a previous engine is free.
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(address)
        except OSError as e:
            first = first or e
            continue
        finally:
            s.close()
        return None
    return first


def _refused(e: OSError, host: str, port: int, source: ListenSource, user: str) -> ConfigError:
    """The config error for a bind that failed other than on a busy port."""
    import errno

    from ..core.launch.conflicts import cannot_listen, not_local, port_refused

    if e.errno == errno.EADDRNOTAVAIL:
        return _config_error(not_local(host, source.host.key), source.host)
    start = unprivileged_port_start()
    if e.errno in (errno.EACCES, errno.EPERM) and port < start:
        return _config_error(port_refused(port, source.port.key, user, start), source.port)
    return ConfigError(cannot_listen(host, port, e.strerror or str(e)))


def check_port_free(host: str, port: int, runtime_dir: str | None = None,
                    source: ListenSource | None = None) -> None:
    """PortBusyError when something already listens on host:port, naming who: a preset
    whose runtime plan in ``runtime_dir`` has the port, or the process. ConfigError when
    the engine, run as this process's user, could not listen there at all; ``source``
    says which file and key set the host and the port
    (:func:`lokid.core.launch.conflicts.listen_source`)."""
    import errno

    e = _bind(host, port, source)
    if e is None:
        return
    if e.errno == errno.EADDRINUSE:
        raise PortBusyError(f"port {port} on {host} is already in use by "
                            f"{_holder(host, port, runtime_dir)}")
    raise _refused(e, host, port, _known(source), _my_name())


def check_address(host: str, port: int, user: User | None = None,
                  source: ListenSource | None = None) -> None:
    """ConfigError when the engine could not listen on host:port whoever held the port:
    the host does not resolve or is not this machine's, or the port is below
    net.ipv4.ip_unprivileged_port_start for the engine's ``user`` (None: this process's
    own user, as ``lokid run`` starts it). A port in use is not checked."""
    from ..core.access import may_listen
    from ..core.launch.conflicts import UNKNOWN_SOURCE, port_refused

    source = source or UNKNOWN_SOURCE
    name = user.name if user is not None else _my_name()
    e = _bind(host, port, source, any_port=True)
    if e is not None:
        raise _refused(e, host, port, source, name)
    uid, capable = (user.uid, False) if user is not None else (os.geteuid(), _capable())
    start = unprivileged_port_start()
    if not may_listen(uid, port, start, capable):
        raise _config_error(port_refused(port, source.port.key, name, start), source.port)


def check_socket_free(path: str) -> None:
    """Make ``path`` free for the engine to listen on (an on-demand preset's UNIX socket,
    :mod:`lokid.core.launch.portunit`): PortBusyError when an engine answers there; a socket
    file nobody listens on (the previous engine's: llama-server leaves it behind, and
    refuses to bind over it) is removed."""
    import socket
    import stat

    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as e:
        raise ConfigError(f"cannot use {path} for the engine's socket: {e.strerror}") from None
    if not stat.S_ISSOCK(mode):
        raise ConfigError(f"{path} is in the way of the engine's socket: it is not a "
                          "socket (remove it)")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(1.0)
        try:
            s.connect(path)
        except OSError:
            pass        # refused (no listener) or gone: stale
        else:
            raise PortBusyError(f"an engine already listens on {path}")
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as e:
        raise ConfigError(f"cannot remove the stale socket {path}: {e.strerror}") from None


def check_listen_free(host: str, port: int, socket_path: str, runtime_dir: str | None = None,
                      source: ListenSource | None = None) -> None:
    """Where a plan's engine will listen is free: its UNIX socket where systemd holds
    host:port for it (the port is the socket unit's then, and rightly busy), else the
    port (:func:`check_port_free`)."""
    if socket_path:
        check_socket_free(socket_path)
    else:
        check_port_free(host, port, runtime_dir, source)


def health_status(host: str, port: int, timeout: float = 1.0,
                  socket_path: str = "") -> int | None:
    """HTTP status of GET /health, or None when nothing answers; at the UNIX socket
    ``socket_path`` instead of host:port when one is given (an on-demand preset's
    engine under systemd: asked directly, not through the port's relay, whose unit
    waits for this very readiness)."""
    import socket

    try:
        if socket_path:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(timeout)
            try:
                s.connect(socket_path)
            except BaseException:
                s.close()
                raise
        else:
            s = socket.create_connection((reachable_host(host), port), timeout=timeout)
        with s:
            s.sendall(b"GET /health HTTP/1.1\r\nHost: lokid\r\nConnection: close\r\n\r\n")
            head = s.recv(64)
    except OSError:
        return None
    parts = head.split(b" ", 2)
    if len(parts) >= 2 and parts[0].startswith(b"HTTP/") and parts[1].isdigit():
        return int(parts[1])
    return None
