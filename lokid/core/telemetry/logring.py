"""The last lines of an engine's output, kept where there is no journal (the local runner).

Under systemd, ``lokictl logs`` is answered from the journal. The daemon's own children
(the local runner) write to the daemon's stderr, which may go nowhere readable: the
runner keeps each preset's last :data:`KEEP_LINES` lines (at most :data:`KEEP_BYTES`)
here, and answers from them, with the same cursor protocol as the journal's: a cursor
names the last line a reader has; the lines after it are the next read. The cursor is
``local:<start>:<number>``: a number per line, counted from this ring's start, so a
cursor from before a daemon restart (another ring) reads from the oldest line kept.
"""

from __future__ import annotations

import uuid
from collections import deque

KEEP_LINES = 2000
KEEP_BYTES = 1 << 20
LINE_CHARS = 4096

Line = tuple[int, str, str]   # (time in µs since the epoch, identifier, text)


class LogRing:
    def __init__(self, keep_lines: int = KEEP_LINES, keep_bytes: int = KEEP_BYTES):
        self.keep_lines = keep_lines
        self.keep_bytes = keep_bytes
        self.start = uuid.uuid4().hex[:12]
        self.lines: deque[tuple[int, Line]] = deque()
        self.count = 0     # lines ever added: the number of the next one
        self.size = 0

    def add(self, at: float, identifier: str, text: str) -> None:
        text = text if len(text) <= LINE_CHARS else text[:LINE_CHARS - 1] + "…"
        self.lines.append((self.count, (int(at * 1e6), identifier, text)))
        self.count += 1
        self.size += len(text)
        while len(self.lines) > 1 and (len(self.lines) > self.keep_lines
                                       or self.size > self.keep_bytes):
            self.size -= len(self.lines.popleft()[1][2])

    def cursor(self, number: int) -> str:
        return f"local:{self.start}:{number}"

    def read(self, cursor: str, count: int) -> tuple[list[Line], str]:
        """The last ``count`` lines (no cursor), or up to ``count`` lines after
        ``cursor``; and the cursor of the last line given (the same when none)."""
        if not cursor:
            chosen = list(self.lines)[-count:] if count else []
        else:
            _, start, number = (cursor.split(":") + ["", ""])[:3]
            after = int(number) if start == self.start and number.isdigit() else -1
            chosen = [(n, line) for n, line in self.lines if n > after][:count]
        if not chosen:
            return [], cursor or (self.cursor(self.count - 1) if self.count else "")
        return [line for _, line in chosen], self.cursor(chosen[-1][0])
