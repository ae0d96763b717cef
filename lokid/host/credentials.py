"""Reading a start's ``[secrets]`` variables from their files, for the engine alone.

The plan says where each secret is read at start (:mod:`lokid.core.config.secrets`):
under systemd a credential's copy in ``$CREDENTIALS_DIRECTORY``, else the file
itself. ``lokid engine`` (and ``lokid run``) read the variables' files here,
just before the engine spawns, into the engine's environment only; the API
key file is the engine's to read (``--api-key-file``). A file that cannot be
read ends the start with a :class:`~lokid.core.errors.ConfigError` naming the
variable and the file, never with its content. Kept light (os only): this runs
between ``systemctl start`` and the engine's spawn.
"""

from __future__ import annotations

import os

from ..core.config.secrets import MAX_SECRET_BYTES, Secret
from ..core.errors import ConfigError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence


def secret_env(secrets: Iterable[Secret]) -> dict[str, str]:
    """The values of the environment secrets, by variable name.

    One trailing newline is dropped (``echo token > file`` writes one), nothing
    else: a token is taken as its file holds it.
    """
    out = {}
    for s in secrets:
        if not s.is_env:
            continue
        try:
            with open(s.path, "rb") as f:
                data = f.read(MAX_SECRET_BYTES + 1)
        except OSError as e:
            raise ConfigError(f"secret {s.target}: cannot read {s.path}: {e.strerror}"
                              + _hint(s)) from None
        if len(data) > MAX_SECRET_BYTES:
            raise ConfigError(f"secret {s.target}: {s.path} is larger than "
                              f"{MAX_SECRET_BYTES} bytes: not a token")
        if data.endswith(b"\n"):
            data = data[:-1]
            if data.endswith(b"\r"):
                data = data[:-1]
        if b"\0" in data:
            raise ConfigError(f"secret {s.target}: {s.path} holds a NUL byte, which no "
                              "environment variable can")
        out[s.target] = os.fsdecode(data)
    return out


def _hint(s: Secret) -> str:
    if s.path != s.source:
        return (f" (systemd's copy of {s.source}: `systemctl daemon-reload` after giving a "
                "preset a secret)")
    return ""


def api_key(secrets: Iterable[Secret], argv: Sequence[str]) -> str | None:
    """A key the engine accepts, for lokid's own requests to it (the benchmark): the
    first key of its ``--api-key-file`` (read where the preset names it: lokid's
    processes are not the unit), else of an ``--api-key`` typed into its command line;
    None when it asks for none. EngineError when the file cannot be read."""
    from ..core.config.secrets import API_KEY_TARGET
    from ..core.errors import EngineError
    from ..core.launch.flags import API_KEY, flag_value

    for s in secrets:
        if s.target != API_KEY_TARGET:
            continue
        try:
            with open(s.source, "rb") as f:
                data = f.read(MAX_SECRET_BYTES)
        except OSError as e:
            raise EngineError(f"the engine asks for an API key, and lokid cannot read "
                              f"{s.source}: {e.strerror} (run it as root, or use lokictl, "
                              "whose daemon can)") from None
        for line in os.fsdecode(data).splitlines():
            if line.strip() and not line.lstrip().startswith("#"):
                return line.strip()
        raise EngineError(f"the engine asks for an API key, and {s.source} holds none")
    typed = flag_value(argv, *API_KEY[0])
    return typed.split(",")[0].strip() or None if typed else None
