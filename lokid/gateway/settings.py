"""The gateway's settings: ``lokid.toml``'s ``[gateway]`` table, ``--listen`` over it.

Rules, each for a failure it prevents:

- off unless set: no ``listen`` address and no ``--listen``, and ``lokid gateway`` says so
  and exits 2, rather than open a port nobody asked for;
- an address beyond loopback needs ``api_keys_file``: an engine on a GPU server is not
  for anyone on the network by default;
- the keys file is read once at start, one key a line (``#`` comments and blank lines
  skipped); a missing, unreadable or empty file is an error naming it, never "no keys
  needed". A key never appears in a log line or an error.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core.errors import ConfigError
from ..core.serve import DEFAULT_MAX_BODY, GatewayConfig, loopback, split_listen

MAX_KEYS_FILE = 1024 * 1024


@dataclass(frozen=True)
class Settings:
    listen: tuple[tuple[str, int], ...]
    api_keys_file: str = ""
    max_body: int = DEFAULT_MAX_BODY
    default_model: str = ""


def settings_of(gateway: GatewayConfig, listen: list[str] | None = None) -> Settings:
    """Settings from lokid.toml's ``[gateway]`` (validated by :mod:`lokid.core.serve`) and
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
    wide = [f"{h}:{p}" for h, p in parsed if not loopback(h)]
    if wide and not gateway.api_keys_file:
        raise ConfigError(f"the gateway would listen beyond loopback ({', '.join(wide)}) "
                          "without client keys: set [gateway] api_keys_file", key="listen")
    return Settings(tuple(parsed), gateway.api_keys_file, gateway.max_body,
                    gateway.default_model)


def read_keys(path: str) -> frozenset[str]:
    """The client keys in ``path``; ConfigError naming the file when there are none."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_KEYS_FILE + 1)
    except OSError as e:
        raise ConfigError(f"{path}: cannot read the gateway's api_keys_file: {e.strerror}",
                          key="api_keys_file") from None
    if len(data) > MAX_KEYS_FILE:
        raise ConfigError(f"{path}: the api_keys_file is over {MAX_KEYS_FILE} bytes",
                          key="api_keys_file")
    keys = frozenset(line.strip() for line in data.decode("utf-8", "replace").splitlines()
                     if line.strip() and not line.strip().startswith("#"))
    if not keys:
        raise ConfigError(f"{path}: the api_keys_file holds no key", key="api_keys_file")
    return keys
