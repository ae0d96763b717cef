"""What a preset may be called: the rule every command checks before any file named
after a preset is read.

Apart from :mod:`lokid.core.config.files` so that ``lokid engine`` can refuse a bad
instance name (``loki-engine@../x``) without importing the TOML reader first: a
restart that reuses its plan never needs it.
"""

from __future__ import annotations

from ..errors import ConfigError

# 1 to 64 of these, the first a letter or a digit. Checked without ``re``: the name is
# the first thing a unit step reads, and ``re`` (with the ``enum`` it imports) is not
# on a restart's path otherwise (lokid.unit.keptstart).
_FIRST = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789")
_REST = _FIRST | frozenset("_.-")
# Replicas a preset may have, ``[serve] replicas``/``max_replicas`` (lokid.core.serve.replicas,
# whose instance names ``NAME:2`` to ``NAME:16`` are checked on a unit step's path too):
# a typo (replicas = 80) on a one-GPU host must not become 80 units and 80 ports.
MAX_REPLICAS = 16


def valid_preset_name(name: str) -> bool:
    return (0 < len(name) <= 64 and name[0] in _FIRST
            and all(c in _REST for c in name[1:]))


def check_preset_name(name: str) -> None:
    if not valid_preset_name(name):
        raise ConfigError(
            f"invalid preset name {name!r}: use 1 to 64 characters from A-Z a-z 0-9 _ . -, "
            "starting with a letter or a digit"
        )
