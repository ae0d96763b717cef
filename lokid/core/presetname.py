"""What a preset may be called: the rule every command checks before any file named
after a preset is read.

Apart from :mod:`lokid.core.config` so that ``lokid engine`` can refuse a bad
instance name (``loki-engine@../x``) without importing the TOML reader first: a
restart that reuses its plan never needs it.
"""

from __future__ import annotations

import re

from .errors import ConfigError

PRESET_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def valid_preset_name(name: str) -> bool:
    return PRESET_NAME_RE.fullmatch(name) is not None


def check_preset_name(name: str) -> None:
    if not valid_preset_name(name):
        raise ConfigError(
            f"invalid preset name {name!r}: use 1 to 64 characters from A-Z a-z 0-9 _ . -, "
            "starting with a letter or a digit"
        )
