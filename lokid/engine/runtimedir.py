"""The runtime plan: what ``lokid prestart`` decided for one start, read by ``lokid engine``
and the journal watcher, in ``$LOKI_RUNTIME_DIR/<preset>.json``.

Kept light (json, os): ``lokid engine`` reads it between ``systemctl start``
and the engine's own start, where every imported module delays readiness.
"""

from __future__ import annotations

import json
import os
import sys

from ..core.errors import LokiError
from ..core.names import SYSLOG_IDENTIFIER

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing; mypy knows the name
if TYPE_CHECKING:
    from typing import Any

    from ..core.attempt import Mark

RUNTIME_SUFFIX = ".json"


class StalePlanError(LokiError):
    """The runtime plan is missing or belongs to another invocation."""


class RuntimePlan:
    """The plan of one invocation, as prestart wrote it."""

    __slots__ = ("plan", "host", "port", "invocation", "_mark")

    def __init__(self, plan: dict[str, Any], host: str, port: int, invocation: str,
                 mark: dict[str, Any]):
        self.plan = plan
        self.host = host
        self.port = port
        self.invocation = invocation
        self._mark = mark

    @property
    def auto(self) -> bool:
        return bool(self.plan["spec"]["auto"])

    @property
    def mark(self) -> Mark:
        from ..core.attempt import Mark

        return Mark(str(self._mark["fingerprint"]), str(self._mark["engine"]),
                    int(self._mark["build"]))


def runtime_path(runtime_dir: str, preset: str) -> str:
    return os.path.join(runtime_dir, preset + RUNTIME_SUFFIX)


def write_runtime_plan(runtime_dir: str, preset: str, data: dict[str, Any]) -> str:
    """Write atomically (a reader never sees half a file); return the path."""
    import tempfile

    path = runtime_path(runtime_dir, preset)
    os.makedirs(runtime_dir, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=runtime_dir, prefix=".tmp-")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(data, indent=2) + "\n")
        os.chmod(tmp, 0o640)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    return path


def read_runtime_plan(runtime_dir: str, name: str,
                      invocation: str | None = None) -> RuntimePlan:
    path = runtime_path(runtime_dir, name)
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        rp = RuntimePlan(plan=data, host=str(data["host"]), port=int(data["port"]),
                         invocation=str(data.get("invocation", "")), mark=dict(data["mark"]))
        rp.mark  # noqa: B018 - validates the mark's fields now, not at READY
    except FileNotFoundError:
        raise StalePlanError(f"no plan for preset {name!r} in {path}: `lokid prestart "
                             f"{name}` must run first (ExecStartPre)") from None
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise StalePlanError(f"unreadable plan {path}: {e}") from None
    if invocation and rp.invocation and rp.invocation != invocation:
        raise StalePlanError(f"the plan in {path} belongs to another start "
                             f"(invocation {rp.invocation}, this is {invocation})")
    return rp


def stderr_is_journal() -> bool:
    """Whether stderr is the journal (systemd sets JOURNAL_STREAM to its dev:inode)."""
    stream = os.environ.get("JOURNAL_STREAM", "")
    if ":" not in stream:
        return False
    try:
        st = os.fstat(sys.stderr.fileno())
    except (OSError, ValueError):
        return False
    return stream == f"{st.st_dev}:{st.st_ino}"


def journal_log(preset: str, message: str, priority: int = 5) -> None:
    """One journal entry from lokid (SYSLOG_IDENTIFIER=lokid, and LOKI_PRESET= when a
    preset is given) when stderr is the journal; else a line on stderr.

    Under the unit, the engine's own output carries SYSLOG_IDENTIFIER=llama-server
    (the unit's SyslogIdentifier=), so lokid's entries stay told apart from it.
    """
    if stderr_is_journal():
        try:
            from systemd import journal

            fields = {"LOKI_PRESET": preset} if preset else {}
            journal.send(message, PRIORITY=priority, SYSLOG_IDENTIFIER=SYSLOG_IDENTIFIER,
                         **fields)
            return
        except (ImportError, OSError):
            pass
    print(f"lokid: {message}", file=sys.stderr, flush=True)
