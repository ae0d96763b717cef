"""lokid.toml's ``[gateway] peers``: the other lokid gateways this one routes to (issue 30,
item 1), typed and validated. Part of the pure core.

::

    [gateway]
    peers = [
      { url = "https://gpu2:8443", api_key_file = "/etc/loki/keys/gpu2" },
      { name = "gpu3", url = "http://10.0.0.3:8000" },
    ]

Rules, each for a failure it prevents:

- ``url`` is the peer gateway's base (``http://`` or ``https://``, a host, a port), no
  path, user, query or fragment: the gateway appends its fixed routes to it, and a
  password in a URL is shown to anyone who reads the config;
- ``name`` (default: the URL's host) names the peer in every log line, reply and listing
  (never its address: a client is not told where the servers are); names are unique,
  so a down peer is never confused with another;
- ``api_key_file`` is the key this gateway presents to the peer (one of the peer's
  client keys). Under loki-gateway.service it travels as the systemd credential
  ``peer-key.<name>`` (``LoadCredential=``, written by the generator), as external
  presets' keys do; the client's own key never goes to a peer;
- a url listed twice is an error (the same host twice would count its replicas twice);
- a key sent over plain ``http://`` to a host that is not loopback is warned about when
  the gateway loads its peers (:func:`cleartext_key`): anyone on the path reads the key
  and every prompt. ``https://`` is verified against the system's CAs (issue 45, item 3).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from ..config import secrets
from ..config.external import url_problem
from ..config.tomlread import Checker, tname

PEER_KEYS = ("name", "url", "api_key_file")
PEER_KEY_CREDENTIAL_PREFIX = "peer-key."
MAX_PEERS = 64
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_BASE = re.compile(r"(?P<scheme>https?)://(?P<authority>[^/?#@]+)/?", re.I)


@dataclass(frozen=True)
class Peer:
    name: str
    url: str                    # scheme://host[:port], no trailing slash
    api_key_file: str = ""      # "" = requests go there without a key


def peer_key_credential(name: str) -> str:
    """The credential id of peer ``name``'s key in loki-gateway.service."""
    return PEER_KEY_CREDENTIAL_PREFIX + name


def cleartext_key(peer: Peer) -> str | None:
    """The warning for ``peer`` when its key would cross a network in clear text (plain
    http:// to a host that is not 127.0.0.0/8, ::1 or localhost), else None."""
    if not peer.api_key_file or not peer.url.startswith("http://"):
        return None
    host = _host_of(peer.url)
    try:
        local = ipaddress.ip_address(host).is_loopback
    except ValueError:
        local = host.lower() == "localhost"
    if local:
        return None
    return (f"peer gateway {peer.name}: its key is sent over plain http:// to {host}, "
            "readable on the way with every prompt: use https:// (a TLS proxy in front of "
            "that gateway), or a network only these hosts reach")


def _host_of(url: str) -> str:
    authority = url.split("://", 1)[1].rstrip("/")
    if authority.startswith("["):
        return authority[1:].split("]", 1)[0]
    return authority.rsplit(":", 1)[0] if ":" in authority else authority


def parse_peers(t: Checker) -> tuple[Peer, ...]:
    """``[gateway] peers`` (the gateway table's checker): each peer checked, in order."""
    value = t.data.get("peers")
    if value is None:
        return ()
    if not isinstance(value, list):
        raise t.error("peers", f"must be a list of tables such as {{ url = "
                      f"\"http://gpu2:8000\" }}, not {tname(value)}")
    if len(value) > MAX_PEERS:
        raise t.error("peers", f"{len(value)} peers: at most {MAX_PEERS}")
    peers: list[Peer] = []
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise t.error("peers", f"item {i} must be a table such as {{ url = "
                          f"\"http://gpu2:8000\", api_key_file = \"/etc/loki/keys/gpu2\" }}, "
                          f"not {tname(item)}")
        peer = _peer(t, i, item)
        for other in peers:
            if other.name == peer.name:
                raise t.error("peers", f"item {i}: the name {peer.name!r} is taken by "
                              "another peer: give each a name of its own")
            if other.url == peer.url:
                raise t.error("peers", f"item {i}: {peer.url} is listed twice")
        peers.append(peer)
    return tuple(peers)


def _peer(t: Checker, i: int, item: dict[str, object]) -> Peer:
    def problem(message: str) -> Exception:
        return t.error("peers", f"item {i}: {message}")

    for key in item:
        if key not in PEER_KEYS:
            raise problem(f"unknown key {key!r}; a peer holds {', '.join(PEER_KEYS)}")
    for key in PEER_KEYS:
        if key in item and not isinstance(item[key], str):
            raise problem(f"{key} must be a string, not {tname(item[key])}")
    url = str(item.get("url") or "")
    if not url:
        raise problem("url is missing: the peer gateway's address, such as "
                      "\"http://gpu2:8000\"")
    why = url_problem(url)
    m = _BASE.fullmatch(url)
    if why or m is None:
        raise problem(why or f"url {url!r}: the peer gateway's base, scheme, host and port "
                      "only (no path, user, query or fragment), such as \"http://gpu2:8000\"")
    url = f"{m.group('scheme').lower()}://{m.group('authority')}"
    name = str(item.get("name") or _host_of(url))
    if not _NAME.fullmatch(name):
        raise problem(f"name {name!r}: 1 to 64 letters, digits, '.', '_' or '-', starting "
                      "with a letter or digit (it names the peer in logs and a systemd "
                      "credential)" + ("" if "name" in item else "; give the peer a name"))
    key_file = str(item.get("api_key_file") or "")
    if key_file:
        why = secrets.source_problem(key_file)
        if why:
            raise problem(f"api_key_file {why}")
    return Peer(name, url, key_file)
