"""lokid's own lines: one journal entry each under systemd, else a line on stderr.

The unit helpers (``lokid prestart``, ``lokid engine``) and the CLI's errors
use it. Under the unit, the engine's own output carries
SYSLOG_IDENTIFIER=llama-server (the unit's SyslogIdentifier=), so lokid's
entries (SYSLOG_IDENTIFIER=lokid, LOKI_PRESET=) stay told apart from it.
"""

from __future__ import annotations

import os
import sys

from ..core.names import SYSLOG_IDENTIFIER

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing on a start's path
if TYPE_CHECKING:
    from typing import TextIO


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
    preset is given) when stderr is the journal; else a line on stderr."""
    if stderr_is_journal():
        try:
            from systemd import journal

            fields = {"LOKI_PRESET": preset} if preset else {}
            journal.send(message, PRIORITY=priority, SYSLOG_IDENTIFIER=SYSLOG_IDENTIFIER,
                         **fields)
            return
        except (ImportError, OSError):
            pass
    say(message)


def say(message: str, out: TextIO | None = None) -> None:
    """``lokid: <message>`` on stderr (or ``out``) in one write: lokid's lines share
    a pipe with the engine's, and ``print`` writes the text and its newline apart
    when Python runs unbuffered (PYTHONUNBUFFERED, as the local runner's children
    do), so an engine line could land inside ours (seen in CI: "ready at
    http://127.0.0.1:365610.00.011.895 I srv  llama_server: model loaded")."""
    stream = sys.stderr if out is None else out
    stream.write(f"lokid: {message}\n")
    stream.flush()
