"""The gateway's settings: ``lokid.toml``'s ``[gateway]`` table, ``--listen`` over it.

Rules, each for a failure it prevents:

- off unless set: no ``listen`` address and no ``--listen``, and ``lokid gateway`` says so
  and exits 2, rather than open a port nobody asked for;
- an address beyond loopback needs client keys, ``api_keys_file`` or named keys (the
  file ``[gateway] keys_file`` holding a key at start, :mod:`lokid.gateway.keys`): an
  engine on a GPU server is not for anyone on the network by default;
- the keys file is read once at start, one key a line (``#`` comments and blank lines
  skipped); a missing, unreadable or empty file is an error naming it, never "no keys
  needed". A key never appears in a log line or an error;
- under systemd (loki-gateway.service) the keys are systemd's private copy of the file
  (credential ``gateway-api-keys``, :func:`keys_path`), and the listening sockets are
  systemd's (``LISTEN_FDS``, :func:`inherited_sockets`), held to the rules above by the
  addresses they are bound to: a socket unit edited to listen on 0.0.0.0 without keys
  is refused as ``--listen 0.0.0.0:…`` would be.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..core.config.secrets import CREDENTIALS_DIR_ENV
from ..core.errors import ConfigError
from ..core.fleet.peers import Peer
from ..core.place.settings import PlacementConfig
from ..core.serve.fairshare import DEFAULT_MAX_QUEUE, DEFAULT_MAX_QUEUE_PER_KEY
from ..core.serve.tables import (
    DEFAULT_FIRST_BYTE_TIMEOUT,
    DEFAULT_MAX_BODY,
    DEFAULT_STREAM_IDLE_TIMEOUT,
    KEYS_CREDENTIAL,
    GatewayConfig,
    loopback,
    split_listen,
)
from .keys import named_keys_held

MAX_KEYS_FILE = 1024 * 1024


@dataclass(frozen=True)
class Settings:
    listen: tuple[tuple[str, int], ...]
    api_keys_file: str = ""
    max_body: int = DEFAULT_MAX_BODY
    default_model: str = ""
    cors_origins: tuple[str, ...] = ()
    first_byte_timeout: float = DEFAULT_FIRST_BYTE_TIMEOUT
    stream_idle_timeout: float = DEFAULT_STREAM_IDLE_TIMEOUT
    # lokid.toml's [placement]: whether starts wait for room, and how long at most
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    # other lokid gateways this one routes to ([gateway] peers, lokid.gateway.peers)
    peers: tuple[Peer, ...] = ()
    # names a keyless gateway answers to beyond its own ([gateway] allowed_hosts,
    # lokid.gateway.hosts)
    allowed_hosts: tuple[str, ...] = ()
    # the named keys file ([gateway] keys_file, lokid.gateway.keys); "" for none
    keys_file: str = ""
    # requests waiting for an engine's slots, per preset and per key ([gateway] max_queue,
    # max_queue_per_key, lokid.gateway.admission)
    max_queue: int = DEFAULT_MAX_QUEUE
    max_queue_per_key: int = DEFAULT_MAX_QUEUE_PER_KEY
    # SSE comments to a streaming client that waits ([gateway] wait_comments,
    # lokid.gateway.waitnotes)
    wait_comments: bool = False


def settings_of(gateway: GatewayConfig, listen: list[str] | None = None,
                placement: PlacementConfig | None = None) -> Settings:
    """Settings from lokid.toml's ``[gateway]`` (validated by :mod:`lokid.core.serve.tables`) and
    ``--listen``, which is held to the same rules (one home: that module)."""
    addresses = listen if listen else list(gateway.listen)
    if not addresses:
        raise ConfigError("the gateway is off: set [gateway] listen = [\"127.0.0.1:8000\"] "
                          "in lokid.toml (or give --listen HOST:PORT)", key="listen")
    parsed = []
    for text in addresses:
        try:
            parsed.append(split_listen(text))
        except ValueError as e:
            raise ConfigError(f"--listen {e}", key="listen") from None
    wide = [f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in parsed if not loopback(h)]
    if wide and not gateway.api_keys_file and not named_keys_held(gateway.keys_file):
        raise ConfigError(f"the gateway would listen beyond loopback ({', '.join(wide)}) "
                          "without client keys: set [gateway] api_keys_file, or add a named "
                          f"key to {gateway.keys_file or 'the keys file'} (lokictl keys add "
                          "NAME)", key="listen")
    return Settings(tuple(parsed), gateway.api_keys_file, gateway.max_body,
                    gateway.default_model, gateway.cors_origins, gateway.first_byte_timeout,
                    gateway.stream_idle_timeout, placement or PlacementConfig(), gateway.peers,
                    gateway.allowed_hosts, gateway.keys_file, gateway.max_queue,
                    gateway.max_queue_per_key, gateway.wait_comments)


def inherited_sockets() -> list[socket.socket]:
    """The listening sockets systemd handed this process (sd_listen_fds(3)), or [] when it
    was not socket-activated. ConfigError for one that is not a listening TCP socket (a
    ``ListenStream=`` path, a datagram socket): the rules above need an address."""
    from systemd import daemon

    found = []
    for fd in daemon.listen_fds():   # checks LISTEN_PID, and unsets the variables
        for family in (socket.AF_INET, socket.AF_INET6):
            if daemon.is_socket(fd, family, socket.SOCK_STREAM, 1):
                found.append(socket.socket(fileno=fd))
                break
        else:
            raise ConfigError(f"the socket systemd passed as fd {fd} is not a listening TCP "
                              "socket: give loki-gateway.socket ListenStream=ADDRESS:PORT "
                              "lines only (lokid.toml [gateway] listen)", key="listen")
    return found


def socket_address(sock: socket.socket) -> str:
    """``"127.0.0.1:8000"`` or ``"[::1]:8000"``: where ``sock`` listens, as listen says it."""
    host, port = sock.getsockname()[:2]
    return f"[{host}]:{port}" if sock.family == socket.AF_INET6 else f"{host}:{port}"


def keys_path(configured: str, env: Mapping[str, str] = os.environ) -> str:
    """Where the keys are read: under loki-gateway.service (which sets
    LOKI_CREDENTIALS_DIR=%d) systemd's copy, the credential the generator gives it;
    otherwise ``configured`` itself."""
    directory = env.get(CREDENTIALS_DIR_ENV)
    return f"{directory.rstrip('/')}/{KEYS_CREDENTIAL}" if directory else configured


def read_keys(path: str, configured: str = "") -> frozenset[str]:
    """The client keys in ``path``; ConfigError naming the file when there are none.
    ``configured``: the file lokid.toml names, when ``path`` is systemd's copy of it."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_KEYS_FILE + 1)
    except OSError as e:
        hint = ""
        if configured and configured != path:
            hint = (f" (systemd's copy of {configured}, credential {KEYS_CREDENTIAL}: run "
                    "`systemctl daemon-reload` after setting [gateway] api_keys_file, then "
                    "restart loki-gateway.service)")
        raise ConfigError(f"{path}: cannot read the gateway's api_keys_file: {e.strerror}"
                          + hint, key="api_keys_file") from None
    if len(data) > MAX_KEYS_FILE:
        raise ConfigError(f"{path}: the api_keys_file is over {MAX_KEYS_FILE} bytes",
                          key="api_keys_file")
    keys = frozenset(line.strip() for line in data.decode("utf-8", "replace").splitlines()
                     if line.strip() and not line.strip().startswith("#"))
    if not keys:
        raise ConfigError(f"{path}: the api_keys_file holds no key", key="api_keys_file")
    return keys
