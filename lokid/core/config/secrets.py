"""Secrets: how a preset hands the engine a key without showing it to anyone else.

A preset names its secrets by the file that holds each, never by value::

    api_key_file = "/etc/loki/keys/chat.key"   # the keys clients must send, one per line
    [secrets]                                  # environment variables read from files
    HF_TOKEN = "/etc/loki/keys/hf-token"

Where each value travels, and why:

- Under systemd the generator gives the preset's unit one ``LoadCredential=<id>:<file>``
  per secret (:func:`credential_id`). systemd, as root, reads the file at each start
  and gives the unit a private copy under ``$CREDENTIALS_DIRECTORY``
  (``/run/credentials/<unit>/``, readable by the unit's user alone). The file itself
  may therefore stay ``0600 root``.
- The API key reaches the engine as ``--api-key-file <that copy>``: the argv, which
  every local user reads in ``ps``, holds a path. A ``[secrets]`` variable is read from
  its copy by ``lokid engine`` into the engine's environment only: not the unit's
  ``Environment=`` (``systemctl show`` prints it to anyone), not the runtime plan, not
  the journal.
- Without systemd (``lokid run``, the daemon's local runner) the files are read where
  they are, by the user running lokid.

Masking. A value typed on the command line anyway (``--api-key sk-…`` in
``extra_args``) is still in ``ps``: the plan says so, and :func:`mask_argv` hides
it, with the values of every flag of :data:`lokid.core.launch.flags.SECRET_FLAGS`, from
the logs and from D-Bus callers without the right to edit presets (who also see
no ``env`` value: :func:`mask_env`). A flag that names a file (``--api-key-file``)
shows its path; lokid never reads such a file to show it.

Pure: names, paths and strings only; :mod:`lokid.host.credentials` reads the files.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from functools import cache

from ..launch import flags
from ..record import record

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing; mypy knows the name
if TYPE_CHECKING:
    import re

MASK = "***"
API_KEY_TARGET = flags.API_KEY_FILE[0][0]     # --api-key-file
API_KEY_CREDENTIAL = "api-key"
ENV_CREDENTIAL_PREFIX = "env."
# systemd's own location of a system unit's credentials ($CREDENTIALS_DIRECTORY, and the
# unit specifier %d): the plan of a unit, made outside it, points there.
SYSTEM_CREDENTIALS = "/run/credentials"
# What the unit sets (Environment=LOKI_CREDENTIALS_DIR=%d): where its credentials are,
# even when it has none yet (a preset given a secret before the generator ran again).
CREDENTIALS_DIR_ENV = "LOKI_CREDENTIALS_DIR"
# A secret file holds a key or a token: anything larger is a mistake (a model?).
MAX_SECRET_BYTES = 64 * 1024

# Variables whose values the logs never show (the engine reads the first two; the
# pattern catches the operator's own, e.g. OPENAI_API_KEY or S3_SECRET).
_SECRET_VARS = frozenset(var for _, var in flags.SECRET_FLAGS)
_SECRET_NAME = r"(TOKEN|SECRET|PASSWORD|PASSWD|API_?KEY|CREDENTIAL)"
# A path systemd's LoadCredential= takes as written: no whitespace, quotes, backslashes,
# control characters or specifiers (% would need escaping, and nobody names keys so).
_PLAIN_PATH = r"/[^\s\"'\\%\x00-\x1f\x7f]*"


@cache
def _pattern(text: str, ignore_case: bool = False) -> re.Pattern[str]:
    """Compiled on first use: the runtime plan, on the unit's start path, imports this
    module for :class:`Secret` alone."""
    import re

    return re.compile(text, re.I if ignore_case else 0)


@record
class Secret:
    """One secret of a plan: what it becomes (``--api-key-file`` or a variable name),
    the file it comes from, its systemd credential, and the path read at start (the
    credential's copy under systemd, else the file itself)."""

    target: str
    source: str
    credential: str
    path: str

    @property
    def is_env(self) -> bool:
        return not self.target.startswith("-")

    def describe(self) -> str:
        """Where it comes from, for ``lokid plan``: never its value."""
        what = "the API keys (--api-key-file)" if not self.is_env else \
            f"environment variable {self.target}"
        if self.path != self.source:
            return (f"{what}: from {self.source}, loaded by systemd as credential "
                    f"{self.credential} ({self.path})")
        return f"{what}: read from {self.source} at start"

    def to_json(self) -> dict[str, str]:
        return {"target": self.target, "source": self.source, "credential": self.credential,
                "path": self.path}

    @classmethod
    def from_json(cls, data: object) -> Secret:
        if not isinstance(data, dict) or not all(
                isinstance(data.get(k), str) for k in ("target", "source", "credential",
                                                       "path")):
            raise ValueError(f"not a secret: {data!r}")
        return cls(data["target"], data["source"], data["credential"], data["path"])


def credential_id(target: str) -> str:
    """The systemd credential a secret travels as: ``api-key``, or ``env.<NAME>``."""
    return API_KEY_CREDENTIAL if target == API_KEY_TARGET else ENV_CREDENTIAL_PREFIX + target


def secret(target: str, source: str, credentials_dir: str | None) -> Secret:
    cred = credential_id(target)
    path = f"{credentials_dir.rstrip('/')}/{cred}" if credentials_dir else source
    return Secret(target=target, source=source, credential=cred, path=path)


def unit_credentials_dir(unit: str) -> str:
    return f"{SYSTEM_CREDENTIALS}/{unit}"


def source_problem(path: str) -> str | None:
    """Why ``path`` cannot name a secret file, or None."""
    if not path.startswith("/"):
        return f"{path!r} is not an absolute path"
    if not _pattern(_PLAIN_PATH).fullmatch(path) or path.endswith("/"):
        return (f"{path!r}: a file's absolute path without spaces, quotes, backslashes, "
                "'%' or control characters (systemd's LoadCredential= reads it as written)")
    return None


def secret_name(name: str) -> bool:
    """Whether an environment variable's name says it holds a secret."""
    return name in _SECRET_VARS or bool(_pattern(_SECRET_NAME, True).search(name))


def _secret_spellings() -> tuple[str, ...]:
    return tuple(s for spellings, _ in flags.SECRET_FLAGS for s in spellings)


def secret_flags_in(args: Sequence[str]) -> list[str]:
    """The secret flags given a value on this command line (``--api-key`` …), in order."""
    found = []
    for spelling in _secret_spellings():
        if flags.has_flag(args, spelling) and spelling not in found:
            found.append(spelling)
    return found


def mask_argv(argv: Iterable[str]) -> list[str]:
    """``argv`` with the value of every secret flag replaced by :data:`MASK`, both
    spellings (``--api-key K``, ``--api-key=K``)."""
    spellings = _secret_spellings()
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(MASK)
            hide_next = False
            continue
        if arg in spellings:
            out.append(arg)
            hide_next = True
            continue
        flag = next((s for s in spellings if arg.startswith(s + "=")), None)
        out.append(f"{flag}={MASK}" if flag else arg)
    return out


def mask_env(env: Mapping[str, str]) -> dict[str, str]:
    """Every value hidden: for a caller who may not read the preset's file."""
    return {key: MASK for key in env}


def log_env(env: Mapping[str, str]) -> dict[str, str]:
    """For a log line: the values of variables named as secrets hidden, the rest kept
    (CUDA_VISIBLE_DEVICES in the journal is what an operator debugging wants)."""
    return {key: MASK if secret_name(key) else value for key, value in env.items()}


def command_line(env: Mapping[str, str], argv: Sequence[str]) -> str:
    """The environment lokid adds and the argv, as one shell-quoted line for logs: the
    values of secret flags and of variables named as secrets masked."""
    import shlex

    added = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(log_env(env).items()))
    return (added + " " if added else "") + shlex.join(mask_argv(argv))
