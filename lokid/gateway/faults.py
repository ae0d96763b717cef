"""What the gateway's log says of requests that went wrong: a line, never a flood.

10,000 hostile requests wrote 4,155 tracebacks (3.1 MB) before issue 28: each bad body
was an unhandled exception, and each client gone mid-stream one more. Rules:

- a client's fault (an answer 4xx: a bad body, a wrong key, a page's origin refused) is
  one line without a traceback, and at most :data:`LINES_PER_WINDOW` such lines of one
  kind each :data:`WINDOW` seconds; the next line of that kind then says how many were
  not written. What a client sent is never written whole (the reply's message is
  bounded, and names no secret);
- a defect of the gateway's own (an exception no rule answers) is answered 500 in
  OpenAI's shape, and logged with its traceback, as rate-limited by kind (the
  exception's type) as the lines above: a defect a client can trigger at will must not
  fill the journal either;
- a client gone mid-answer is no fault at all: counted 499 (lokid.gateway.report), not
  logged.
"""

from __future__ import annotations

import logging
import time

log = logging.getLogger("lokid.gateway")

WINDOW = 60.0
LINES_PER_WINDOW = 5


class Throttle:
    """Lines by kind, at most LINES_PER_WINDOW per WINDOW seconds each."""

    def __init__(self, window: float = WINDOW, lines: int = LINES_PER_WINDOW):
        self.window = window
        self.lines = lines
        self.kinds: dict[str, tuple[float, int, int]] = {}   # kind → (since, written, held)

    def allow(self, kind: str, now: float | None = None) -> tuple[bool, int]:
        """Whether a line of ``kind`` may be written now, and how many were held back
        since the last one written (to say so in it)."""
        now = time.monotonic() if now is None else now
        since, written, held = self.kinds.get(kind, (now, 0, 0))
        if now - since >= self.window:
            since, written = now, 0
        if written >= self.lines:
            self.kinds[kind] = (since, written, held + 1)
            return False, 0
        if len(self.kinds) >= 1024 and kind not in self.kinds:   # bounded, whatever comes
            self.kinds.clear()
        self.kinds[kind] = (since, written + 1, 0)
        return True, held


class Faults:
    def __init__(self) -> None:
        self.throttle = Throttle()

    def client(self, status: int, code: str | None, method: str, path: str,
               message: str) -> None:
        """A request refused for the client's fault (4xx)."""
        kind = f"{status} {code}"
        ok, held = self.throttle.allow(kind)
        if ok:
            more = f" ({held} more like it not logged)" if held else ""
            log.info("refused %s %s: %d %s: %s%s", method[:16], path[:80], status, code,
                     message[:200], more)

    def defect(self, e: BaseException, method: str, path: str) -> None:
        """An exception no rule answered: the gateway's own defect."""
        ok, held = self.throttle.allow(f"defect {type(e).__name__}")
        if ok:
            more = f" ({held} more like it not logged)" if held else ""
            log.error("%s %s: the gateway failed: %s: %s%s", method[:16], path[:80],
                      type(e).__name__, str(e)[:200], more, exc_info=e)
