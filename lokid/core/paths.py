"""Where lokid looks for its files: defaults, and the environment overrides.

``LOKI_CONFIG_DIR``, ``LOKI_STATE_DIR`` and ``LOKI_RUNTIME_DIR`` exist so tests
and developers can run lokid without touching /etc, /var or /run.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing; mypy knows the name
if TYPE_CHECKING:
    from collections.abc import Mapping

DEFAULT_CONFIG_DIR = "/etc/loki"
DEFAULT_STATE_DIR = "/var/lib/loki"
DEFAULT_RUNTIME_DIR = "/run/loki"


def _pick(env: Mapping[str, str] | None, name: str, default: str) -> str:
    source = os.environ if env is None else env
    value = source.get(name, "").strip()
    return value or default


def config_dir(env: Mapping[str, str] | None = None) -> str:
    return _pick(env, "LOKI_CONFIG_DIR", DEFAULT_CONFIG_DIR)


def state_dir(env: Mapping[str, str] | None = None) -> str:
    return _pick(env, "LOKI_STATE_DIR", DEFAULT_STATE_DIR)


def runtime_dir(env: Mapping[str, str] | None = None) -> str:
    return _pick(env, "LOKI_RUNTIME_DIR", DEFAULT_RUNTIME_DIR)
