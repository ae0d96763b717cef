"""The names a keyless gateway answers to: a request's ``Host`` checked (issue 45, item 5).

A gateway without ``api_keys_file`` serves whoever reaches its port, and a browser
reaches a loopback port for any page a local user opens. CORS (:mod:`lokid.gateway.cors`)
stops a page's request that carries an ``Origin``; it cannot stop DNS rebinding: a page
at ``http://attacker.example:8000`` whose name then resolves to 127.0.0.1 is the same
origin as the gateway for the browser, sends no ``Origin`` on its GETs, and reads every
answer (``GET /v1/models`` with ``Host: attacker.example`` was answered 200). What such a
page cannot change is the name it asked for: the browser sends it as ``Host``. Rules:

- a request to a keyless gateway is served only when its ``Host`` (port aside, case
  and a final dot ignored) is a name the gateway is known by: an IP literal (v4, or v6
  in brackets: rebinding needs a name, and a page served from an address is that
  address's), ``localhost`` and its subdomains (RFC 6761: browsers resolve them to
  loopback themselves), Debian's loopback names in ``/etc/hosts``, this machine's host
  name and fully qualified name, and the names in ``[gateway] allowed_hosts`` (a
  reverse proxy's public name; ``.example.org`` is that domain and its subdomains,
  ``"*"`` turns the check off). Any other is refused, 421 (Misdirected Request) in
  OpenAI's error shape, one rate-limited log line (:mod:`lokid.gateway.faults`);
- a request without ``Host`` (HTTP/1.0) is served: every browser sends one;
- ``GET /health`` answers whatever the name (a load balancer's check often names the
  backend by anything): it says only that the gateway and lokid are up, and starts
  nothing;
- a gateway with ``api_keys_file`` does not check: a request without a valid key is
  refused anyway (401), and a page cannot hold the key (a bearer key is not sent by
  the browser on its own, as a cookie is). Checking there would only refuse the names
  its clients and peer gateways already use;
- the client is not told which names are served (a rebinding page reads the refusal):
  the operator's log line names the refused one.

The machine's names are read once, at start (:meth:`Hosts.start`): its host name at
once, its fully qualified name in the background, off the event loop (it asks the
resolver, which may be slow or absent: the first requests do not wait for it).
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
from collections.abc import Iterable

from .replies import GatewayError

log = logging.getLogger("lokid.gateway")

# Names of loopback everywhere, and in Debian's /etc/hosts
LOOPBACK_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback")
RESOLVE_TIMEOUT = 5.0   # seconds the FQDN lookup at start may take before it is skipped
ANY = "*"


def host_name(header: str) -> str | None:
    """The name or address in a ``Host`` header, lower case without its port or final
    dot (an IPv6 literal without its brackets); None for a header that is no host."""
    text = header.strip().lower()
    if text.startswith("["):
        inside, sep, rest = text[1:].partition("]")
        if not sep or (rest and not (rest.startswith(":") and rest[1:].isdigit())):
            return None
        try:
            return str(ipaddress.IPv6Address(inside))
        except ValueError:
            return None
    name, sep, port = text.rpartition(":")
    if not sep:
        name = text
    elif not port.isdigit():
        return None
    name = name[:-1] if name.endswith(".") else name
    if not name or len(name) > 253 or any(not (ch.isalnum() or ch in "-._") or not ch.isascii()
                                          for ch in name):
        return None
    return name


def is_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


class Hosts:
    """The names of :data:`LOOPBACK_NAMES`, ``allowed`` (``[gateway] allowed_hosts``) and
    the machine's (:meth:`learn`); any IP literal."""

    def __init__(self, allowed: Iterable[str] = ()):
        allowed = [a.strip().lower().rstrip(".") for a in allowed]
        self.any = ANY in allowed
        self.names = set(LOOPBACK_NAMES) | {a for a in allowed if a and a[0] != "."}
        self.domains = tuple(a for a in allowed if a.startswith(".") and len(a) > 1)
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """The machine's names learnt: its host name now, its FQDN soon."""
        self.learn([socket.gethostname()])
        self.task = asyncio.get_running_loop().create_task(self.learn_fqdn())

    async def learn_fqdn(self) -> None:
        self.learn(await machine_names())

    def learn(self, names: Iterable[str]) -> None:
        """The machine's own names (its host name, its FQDN)."""
        self.names |= {n.lower().rstrip(".") for n in names if n and n.strip(".")}

    def allows(self, header: str | None) -> bool:
        if header is None or self.any:
            return True
        name = host_name(header)
        if name is None:
            return False
        return (name in self.names or is_address(name) or name.endswith(".localhost")
                or any(name.endswith(d) or name == d[1:] for d in self.domains))

    def check(self, header: str | None) -> None:
        """GatewayError 421 for a ``Host`` this gateway is not known by."""
        if self.allows(header):
            return
        shown = (header or "")[:80]
        raise GatewayError(421, f"this gateway does not answer to the name {shown!r}: ask "
                           "for it by its address, localhost or this machine's name, or "
                           "have its operator add the name to lokid.toml's [gateway] "
                           "allowed_hosts", code="host_not_allowed")


async def machine_names() -> list[str]:
    """This machine's host name and fully qualified name ([] of what cannot be read in
    :data:`RESOLVE_TIMEOUT` seconds: the resolver's failure costs a name, not a start)."""
    names = [socket.gethostname()]
    try:
        names.append(await asyncio.wait_for(asyncio.to_thread(socket.getfqdn),
                                            RESOLVE_TIMEOUT))
    except (TimeoutError, OSError) as e:
        log.info("this machine's fully qualified name was not read (%s): requests naming "
                 "it need [gateway] allowed_hosts", type(e).__name__)
    return names
