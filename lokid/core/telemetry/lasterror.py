"""The engine's own last error line of each preset's start: what a failed start quotes.

A start that fails is reported with systemd's result and lokid's status line, and that
status line is often the load's progress ("loading crash (llama.gguf): 0 s, 15 MiB
resident"), true when it was sent and stale by the failure. What the operator needs is
what the engine said: ``error: invalid argument: --no-such-flag``. The daemon feeds
every engine line here (journal or pipe) and quotes the start's last error line.

An error line is one the engine marks as such: llama.cpp's log level ``E`` (after its
optional ``0.00.010.624`` timestamp), its argument parser's ``error…`` lines
(``error: invalid argument: …``, ``error while handling argument "--spec-type": …``), or
a ``GGML_ASSERT`` abort. Bounded: one line per preset, cut to :data:`MAX_CHARS`.
"""

from __future__ import annotations

import re

MAX_CHARS = 300
_LEVELLED = re.compile(r"(?:\d+\.\d+\.\d+\.\d+ )?E ")


def is_error_line(line: str) -> bool:
    head = line.lstrip()[:40]
    if head[:5].lower() == "error":
        return True
    if "E " in head and _LEVELLED.match(head):
        return True
    return "GGML_ASSERT" in line[:200]


def shown(line: str) -> str:
    """The line as quoted: its timestamp and level dropped, cut to MAX_CHARS."""
    text = line.strip()
    m = _LEVELLED.match(text)
    if m:
        text = text[m.end():].strip()
    return text if len(text) <= MAX_CHARS else text[:MAX_CHARS - 1] + "…"


class LastErrors:
    """Per preset, the last error line of its latest start (by invocation id)."""

    def __init__(self) -> None:
        self.lines: dict[str, tuple[str, str]] = {}   # preset → (invocation, line)

    def feed(self, preset: str, invocation: str, line: str) -> None:
        found = self.lines.get(preset)
        if found is not None and found[0] != invocation:
            del self.lines[preset]   # a line of the next start: the last one's is no reason
        if is_error_line(line):
            self.lines[preset] = (invocation, line)

    def forget(self, preset: str) -> None:
        """A new start begins: what the last one said is no reason for this one's end."""
        self.lines.pop(preset, None)

    def of(self, preset: str) -> str:
        """The start's last error line as quoted, or ""."""
        found = self.lines.get(preset)
        return shown(found[1]) if found is not None else ""
