"""What the gateway's log says of requests that went wrong: a line, never a flood.

10,000 hostile requests wrote 4,155 tracebacks (3.1 MB) before issue 28: each bad body
was an unhandled exception, and each client gone mid-stream one more. Rules:

- a client's fault (an answer 4xx: a bad body, a wrong key, a page's origin refused) is
  one line without a traceback, and at most :data:`LINES_PER_WINDOW` such lines of one
  kind each :data:`WINDOW` seconds; the next line of that kind then says how many were
  not written. What a client sent is never written whole (the reply's message is
  bounded, and names no secret), and its control characters are escaped (a path's
  ``%0a`` is a line break once decoded);
- a defect of the gateway's own (an exception no rule answers) is answered 500 in
  OpenAI's shape, and logged with its traceback, as rate-limited by kind (the
  exception's type) as the lines above: a defect a client can trigger at will must not
  fill the journal either;
- a client gone mid-answer is no fault at all: counted 499 (lokid.gateway.report), not
  logged;
- a client that resets its connection while sending its body (or while its answer is
  written) is gone too, not a defect (issue 45, item 6: each was "the gateway failed"
  with a traceback, on aiohttp 3.8.4, 3.11.16 and 3.14 alike): a ``ConnectionError``
  with the client's connection closed (:func:`client_gone`) is said in one
  rate-limited line "client gone: … 499", without a traceback, and counted 499 in the
  report where its preset is known (not while its body is read: the model is in it).
  A ``ConnectionError`` while the client's connection is open is no client's doing:
  still a defect. From Python 3.12 (Debian 13's 3.13) ``asyncio.wait_for`` reads in the
  handler's own task, and aiohttp's cancel of a handler whose client left (3.9+ with
  ``handler_cancellation``; 3.8.4 cancels none) wins over the reset it set on the body: that
  cancel is said the same way when the body was cut short (:func:`reset_mid_body`);
  without it the reset was said on Debian 12 and not at all on Debian 13;
- aiohttp's own lines (a malformed request, answered 400 before any route) are made
  rate-limited lines the same way by :mod:`lokid.gateway.serverlog`.
"""

from __future__ import annotations

import logging
import time

from aiohttp import web

from ..core.errors import printable

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


def client_gone(request: web.Request, e: BaseException) -> bool:
    """Whether ``e`` is the client's connection lost: a ConnectionError (reset, broken
    pipe) once aiohttp has seen the connection close (its transport gone or closing)."""
    if not isinstance(e, ConnectionError):
        return False
    transport = request.transport
    return transport is None or transport.is_closing()


def reset_mid_body(request: web.Request) -> BaseException | None:
    """The ConnectionError aiohttp set on the body of a request whose client left before
    sending it whole, once the connection is closed; None otherwise (a body read whole:
    a client gone mid-answer, which is not logged)."""
    content = request.content
    lost = content.exception()
    if lost is None or content.is_eof() or not client_gone(request, lost):
        return None
    return lost


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
            log.info("refused %s %s: %d %s: %s%s", printable(method[:16]),
                     printable(path[:80]), status, code, printable(message[:200]), more)

    def defect(self, e: BaseException, method: str, path: str) -> None:
        """An exception no rule answered: the gateway's own defect."""
        ok, held = self.throttle.allow(f"defect {type(e).__name__}")
        if ok:
            more = f" ({held} more like it not logged)" if held else ""
            log.error("%s %s: the gateway failed: %s: %s%s", method[:16], path[:80],
                      type(e).__name__, str(e)[:200], more, exc_info=e)

    def gone(self, e: BaseException, method: str, path: str) -> None:
        """A client whose connection ended before its answer (499): no fault, one line."""
        ok, held = self.throttle.allow(f"gone {type(e).__name__}")
        if ok:
            more = f" ({held} more like it not logged)" if held else ""
            log.info("client gone: %s %s: 499: its connection ended before its answer "
                     "(%s)%s", method[:16], path[:80], type(e).__name__, more)
