"""``systemctl reload loki-gateway`` (SIGHUP): lokid.toml's ``[gateway]`` read again and put
in force with every request in flight untouched (issue 48, item 5).

A restart for a changed ``peers``, ``listen``, ``cors_origins`` or keys file cut every long
stream at the stop's drain (30 s, :mod:`lokid.gateway.shutdown`): a 30,000-token stream
ended with the gateway's error event. Rules, each for a failure it prevents:

- the file is read and held to the rules of a start (:func:`lokid.gateway.settings
  .settings_of`: an address beyond loopback needs keys...), and everything that can fail
  (the keys files read, the new addresses bound) is done before anything is changed: a
  broken or refused file changes nothing, said in one log line (no traceback) and in the
  unit's STATUS=, and the gateway goes on as it was; a half-applied reload would serve
  with settings nobody wrote;
- what holds settings is replaced whole, never changed in place (the frozen
  :class:`lokid.gateway.settings.Settings`, the CORS policy, the host names, the
  keyring): a request reads an old or a new setting, never a mix made by the reload; a
  request already let in by the CORS policy keeps it (:mod:`lokid.gateway.cors`);
- a peer still listed the same keeps its state (up or down, its listing); a removed one
  is read no more (its requests in flight end as they would have); an added one is read
  at once (:meth:`lokid.gateway.peers.Peers.reconfigure`);
- ``listen`` for the sockets the gateway opened itself: the new addresses are listening
  before the removed ones stop accepting; a removed address's idle connections are
  closed and its busy ones after their answer (never in the middle of one). Under
  systemd the sockets are loki-gateway.socket's (``LISTEN_FDS``): they stay as they are,
  and the log says that ``listen`` there is the socket unit's (``systemctl edit
  loki-gateway.socket``, then restart it); with ``--listen`` the command line's stay;
- the keys files are read again (not systemd's copy of ``api_keys_file``: see below),
  and an address beyond loopback still needs keys in force; a gateway that was keyed
  stays keyed while lokid.toml names a keys file (one emptied by mistake must not open
  it), as between two reloads (:mod:`lokid.gateway.keys`);
- what a reload cannot change is said, never faked: ``api_keys_file`` under systemd is a
  credential copied at the start, and so is a peer's ``api_key_file`` (a new or changed
  one needs ``systemctl daemon-reload`` and a restart); the queue bounds and
  ``[placement]`` are held by the parts built at the start (a restart);
- systemd is told: ``RELOADING=1`` with ``MONOTONIC_USEC=`` (systemd 253 and later ask
  for it; 252, Debian 12's, ignores it) first, ``READY=1`` and a STATUS= saying what
  changed last; a reload asked while one runs is done once more after it, with the file
  as it is then.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from aiohttp import web

from ..core.config.secrets import CREDENTIALS_DIR_ENV
from ..core.errors import ConfigError, LokiError
from ..core.serve.tables import loopback
from .body import BODIES_HELD, Bodies
from .cors import Cors
from .headtimeout import Connections
from .hosts import Hosts
from .keys import Keyring
from .peers import Peers
from .settings import Settings, read_keys
from .shutdown import Draining, StoppableSite

log = logging.getLogger("lokid.gateway")

Address = tuple[str, int]
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
# the settings each request reads as it goes (put in force by replacing Settings whole)
READ_BY_REQUESTS = ("default_model", "max_body", "first_byte_timeout",
                    "stream_idle_timeout", "wait_comments")
# held by the parts built at the start: said, not applied
AT_START_ONLY = ("max_queue", "max_queue_per_key", "placement")


def at(host: str, port: int) -> tuple[IPAddress, int]:
    """An address as a value: ``[::0001]:80`` is ``[::1]:80``, as the socket says it."""
    return ipaddress.ip_address(host.partition("%")[0]), port


def accepted_by(listener: tuple[IPAddress, int], local: tuple[IPAddress, int]) -> bool:
    """Whether a connection whose local end is ``local`` came through ``listener``: a
    wildcard listener's connections have the address they reached, not 0.0.0.0 (two
    listeners never overlap: the second bind would fail)."""
    (host, port), (there, its_port) = listener, local
    return port == its_port and host.version == there.version and (
        host.is_unspecified or host == there)


def shown(address: Address) -> str:
    host, port = address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def bind(address: Address, backlog: int) -> socket.socket:
    """A listening socket on ``address`` (OSError where it cannot be bound)."""
    host, port = address
    return socket.create_server((host, port), family=socket.AF_INET6 if ":" in host
                                else socket.AF_INET, backlog=backlog)


class Gateway(Protocol):
    """What a reload changes of :class:`lokid.gateway.server.Gateway` (not imported: it
    imports this module)."""

    settings: Settings
    keyring: Keyring
    cors: Cors
    hosts: Hosts
    bodies: Bodies
    peers: Peers
    connections: Connections


@dataclass
class Prepared:
    """What a reload puts in force, all of it made before anything is changed."""

    settings: Settings
    keyring: Keyring | None   # None: the keyring stays
    sockets: dict[Address, socket.socket] = field(default_factory=dict)   # to listen on
    said: list[str] = field(default_factory=list)   # what stays until a restart


class Reloader:
    """The gateway's reload: :meth:`reload` on SIGHUP.

    ``reread``: lokid.toml's settings as a start would make them (ConfigError, or another
    LokiError, for a file that is refused) and the file's own ``listen``; ``fixed``: why
    ``listen`` is not the file's here ("" when the gateway opened its sockets from it)."""

    def __init__(self, gateway: Gateway, runner: web.AppRunner, draining: Draining,
                 reread: Callable[[], tuple[Settings, tuple[str, ...]]], fixed: str = "",
                 notify: Callable[..., None] = lambda *fields: None,
                 backlog: int = 1024):
        self.gateway = gateway
        self.runner = runner
        self.draining = draining
        self.reread = reread
        self.fixed = fixed
        self.notify = notify
        self.backlog = backlog
        self.running: asyncio.Task[None] | None = None
        self.again = False
        self.stopping = False

    def asked(self) -> None:
        """SIGHUP: a reload, or one more after the one running; none once stopping."""
        if self.stopping:
            return
        if self.running is not None and not self.running.done():
            self.again = True
            return
        self.running = asyncio.get_running_loop().create_task(self._reloads())

    async def settled(self) -> None:
        """The reload under way ended (the stop waits for it: its new sites must not
        appear after the stop closed the others); none asked after."""
        self.stopping, self.again = True, False
        if self.running is not None:
            await asyncio.gather(self.running, return_exceptions=True)

    async def _reloads(self) -> None:
        while True:
            self.again = False
            await self.reload()
            if not self.again:
                return

    async def reload(self) -> str:
        """Read lokid.toml's [gateway] again and put it in force; what changed, in words
        (the STATUS= line)."""
        self.notify("RELOADING=1", f"MONOTONIC_USEC={time.monotonic_ns() // 1000}")
        try:
            prepared = await asyncio.to_thread(self._prepare)
        except (LokiError, OSError) as e:
            status = f"reload refused, the settings before stay in force: {e}"
            log.error("%s", status)
            self.notify("READY=1", f"STATUS={status}"[:1024])
            return status
        changed = await self._apply(prepared)
        for line in prepared.said:
            log.warning("%s", line)
        status = "reloaded: " + (", ".join(changed) if changed else "nothing changed")
        log.info("%s", status)
        self.notify("READY=1", f"STATUS={status}"[:1024])
        return status

    def _prepare(self) -> Prepared:
        """The new settings, keyring and sockets (off the event loop: files are read)."""
        old = self.gateway.settings
        new, written = self.reread()
        said = [f"[gateway] {name} changed: in force after a restart of the gateway"
                for name in AT_START_ONLY if getattr(new, name) != getattr(old, name)]
        if new.api_keys_file != old.api_keys_file and os.environ.get(CREDENTIALS_DIR_ENV):
            said.append(f"[gateway] api_keys_file changed to {new.api_keys_file or 'none'}: "
                        "under systemd its keys are a credential copied at the start; run "
                        "`systemctl daemon-reload`, then restart loki-gateway.service")
            new = replace(new, api_keys_file=old.api_keys_file)   # the one in force
        keyring = self._keyring(new)
        wide = [shown(a) for a in new.listen if not loopback(a[0])]
        if wide and not (keyring or self.gateway.keyring).keyed:   # as at a start
            raise ConfigError(f"the gateway would listen beyond loopback ({', '.join(wide)})"
                              " without client keys: the keys in force would be none",
                              key="listen")
        prepared = Prepared(new, keyring, said=said)
        if self.fixed:
            if set(written) != {shown(a) for a in old.listen}:
                said.append(f"[gateway] listen is not changed by a reload: {self.fixed}")
            prepared.settings = _with_listen(new, old.listen)
            return prepared
        listening = {at(*a) for a in old.listen}
        try:
            for address in new.listen:
                if at(*address) not in listening:
                    prepared.sockets[address] = bind(address, self.backlog)
        except OSError as e:
            for sock in prepared.sockets.values():
                sock.close()
            raise LokiError(f"[gateway] listen: cannot listen on {shown(address)}: "
                            f"{e.strerror or e}") from None
        return prepared

    def _keyring(self, new: Settings) -> Keyring | None:
        """The keyring of ``new``'s keys files; None when the one in force stays. The
        api_keys_file is read again, but not systemd's copy (the same bytes until a
        restart)."""
        current = self.gateway.keyring
        legacy = current.legacy
        if not new.api_keys_file:
            legacy = frozenset()
        elif not os.environ.get(CREDENTIALS_DIR_ENV):   # the file itself: read again
            legacy = read_keys(new.api_keys_file)
        if legacy == current.legacy and new.keys_file == current.path:
            return None
        keyring = Keyring(legacy, new.keys_file)   # ConfigError for a broken named file
        if current.keyed and (new.api_keys_file or new.keys_file):
            keyring.keyed = True   # a key file emptied by mistake never opens the gateway
        return keyring

    async def _apply(self, p: Prepared) -> list[str]:
        """``p`` in force: what changed, in words. Nothing here waits before the new
        settings are all in place (one turn of the event loop)."""
        gw, old, new = self.gateway, self.gateway.settings, p.settings
        changed = [name for name in READ_BY_REQUESTS if getattr(new, name) != getattr(old, name)]
        if new.cors_origins != old.cors_origins:
            gw.cors.set(new.cors_origins)
            changed.append("cors_origins")
        if new.allowed_hosts != old.allowed_hosts:
            hosts = Hosts(new.allowed_hosts)
            hosts.learn(gw.hosts.names - Hosts(old.allowed_hosts).names)   # the machine's
            if gw.hosts.task is not None and not gw.hosts.task.done():   # its FQDN: soon
                hosts.task = asyncio.get_running_loop().create_task(hosts.learn_fqdn())
            gw.hosts = hosts
            changed.append("allowed_hosts")
        old_keyring = gw.keyring
        if p.keyring is not None:
            gw.keyring = p.keyring
            changed.append("keys")
        gw.bodies.total = BODIES_HELD * new.max_body
        removed, added = gw.peers.reconfigure(new.peers)
        if removed or added:
            changed.append("peers (" + ", ".join([f"-{n}" for n in removed]
                                                 + [f"+{n}" for n in added]) + ")")
            if os.environ.get(CREDENTIALS_DIR_ENV):
                p.said.extend(f"peer {n!r}: its api_key_file is a systemd credential copied "
                              "at the start: a new or changed one needs `systemctl "
                              "daemon-reload` and a restart of loki-gateway.service"
                              for n in added if next(x for x in new.peers if x.name == n)
                              .api_key_file)
        gw.settings = new   # replaced whole: the requests that follow read the new ones
        if p.keyring is not None:
            p.keyring.start()
            await old_keyring.stop()
        kept = {at(*a) for a in new.listen}
        gone = [a for a in old.listen if at(*a) not in kept]
        if p.sockets or gone:
            await self._listen(list(p.sockets.values()), gone)
            changed.append("listen (" + ", ".join([f"+{shown(a)}" for a in p.sockets]
                                                  + [f"-{shown(a)}" for a in gone]) + ")")
        return changed

    async def _listen(self, sockets: Sequence[socket.socket], gone: Sequence[Address]) -> None:
        """Accept on ``sockets`` first, then stop accepting on the ``gone`` addresses:
        their idle connections closed now, their busy ones after their answer."""
        for sock in sockets:
            await StoppableSite(self.runner, sock, self.gateway.connections).start()
        removed = {at(*a) for a in gone}
        ends = []
        for site in list(self.runner.sites):
            if not isinstance(site, StoppableSite):
                continue
            try:
                where = at(*site.sock.getsockname()[:2])
            except (OSError, ValueError):
                continue
            if where in removed:
                ends.append(where)
                site.stop_accepting()
                # not site.stop(): aiohttp's shuts the whole server down, every
                # connection of every address with it
                self.runner._unreg_site(site)
        server = self.runner.server
        if not ends or server is None:
            return
        await asyncio.sleep(0)   # a request whose head was read is in flight (shutdown.py)
        busy = {f.request.transport for f in self.draining.flights}
        for connection in list(server.connections):
            transport = connection.transport
            local = transport.get_extra_info("sockname") if transport is not None else None
            if not isinstance(local, tuple) or not any(
                    accepted_by(end, at(*local[:2])) for end in ends):
                continue
            if transport in busy:
                connection.close()         # after its answer
            else:
                connection.force_close()   # idle


def _with_listen(settings: Settings, listen: tuple[Address, ...]) -> Settings:
    return replace(settings, listen=listen)
