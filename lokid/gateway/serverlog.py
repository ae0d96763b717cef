"""aiohttp's own log lines in the gateway's process: one rate-limited line per kind, never a
flood (issue 45, item 6).

aiohttp answers a malformed request (a bad request line, a header that is no header, a
line too long, a broken chunk) 400 itself, before any route or key check, and logs it
with its traceback: 2,000 such requests wrote 22,000 lines (1.5 MB) in 0.9 s, and
journald's rate limit then dropped the gateway's real lines. Anyone who reaches the port
could do it, without a key. Rules, each for that failure:

- a filter on aiohttp's loggers (``aiohttp.server``: ``RequestHandler.handle_error`` and
  ``log_exception``, the same name in 3.8.4 of Debian 12, 3.11.16 of Debian 13 and the
  venv's 3.14, whose messages differ: "Error handling request" with or without "from
  ADDRESS", the exception's message on one line or several; ``aiohttp.internal``,
  ``aiohttp.web``) and on ``asyncio``'s (a socket a client closed under a write) turns
  each record into one line through :class:`lokid.gateway.faults.Throttle`, by kind: at
  most LINES_PER_WINDOW a WINDOW for each, the next saying how many were not written;
- a client's doing (aiohttp's HTTP errors, a connection reset or cut, a timeout) is
  that line at INFO, without a traceback: the exception's type, its HTTP status and its
  message's first line up to the first colon or quote, so what a client sent is never
  written (aiohttp quotes the bad line, or puts it after a colon: "Invalid HTTP Header:
  NAME" in 3.8.4, "Invalid header token:" then the line in the C parser), and no secret
  a client put in a malformed header reaches the journal (a message of one word is such
  bytes themselves: 3.14's pure-Python parser says a bad chunk size as it came); the
  line's kind is the exception's type, never its text, so a client cannot make kinds
  without end (each new kind would have its own lines);
- anything else (a defect of aiohttp's or of ours that reached aiohttp) keeps its level
  and its traceback, rate-limited by kind as :meth:`lokid.gateway.faults.Faults.defect`;
- debug records pass untouched (they are not written at the gateway's INFO level).

:func:`install` is called once by the gateway's process (:func:`lokid.gateway.server
.serve`); it returns what removes the filter again.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable

from aiohttp import http_exceptions, web

from .faults import Throttle

LOGGERS = ("aiohttp.server", "aiohttp.internal", "aiohttp.web", "asyncio")
SAID = 120   # characters of an exception's message written, at most
# a client's doing: aiohttp's HTTP errors (a body's, such as a bad chunk, reach the
# handler as RequestPayloadError), a connection cut or reset, a timeout
CLIENTS = (http_exceptions.HttpProcessingError, web.RequestPayloadError, ConnectionError,
           TimeoutError, asyncio.CancelledError, asyncio.IncompleteReadError)

_WRAPPED = re.compile(r"(\d{3}), message[=:]\s*(.*)", re.S)


def summary(exc: BaseException) -> str:
    """"400 BadStatusLine: Invalid method encountered": no byte the client sent."""
    message = getattr(exc, "message", None)
    text = str(message if isinstance(message, str) else exc).strip()
    code = getattr(exc, "code", None)
    wrapped = _WRAPPED.match(text)   # RequestPayloadError: an HTTP error's text inside
    if wrapped:
        code, text = int(wrapped.group(1)), wrapped.group(2)
    first = text.splitlines()[0] if text else ""
    for start in (":", "'", '"', "bytearray("):   # what the client sent starts there
        first = first.split(start, 1)[0]
    first = "".join(c if c.isprintable() else "?" for c in first).strip(" :")[:SAID]
    if len(first.split()) < 2:   # one word: the client's bytes themselves ("zz"), no text
        first = ""
    status = f"{code} " if isinstance(code, int) and 100 <= code <= 599 else ""
    return f"{status}{type(exc).__name__}" + (f": {first}" if first else "")


class ServerLog(logging.Filter):
    """aiohttp's and asyncio's records, one throttled line each (rules above)."""

    def __init__(self, throttle: Throttle | None = None):
        super().__init__()
        self.throttle = throttle or Throttle()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.INFO:
            return True
        exc = record.exc_info[1] if record.exc_info else None
        client = isinstance(exc, CLIENTS)
        if exc is not None:   # by type: a message may hold what the client sent
            said, kind = summary(exc), f"{record.name} {type(exc).__name__}"
        else:   # aiohttp's and asyncio's messages are constant formats
            kind, said = f"{record.name} {str(record.msg)[:60]}", ""
        ok, held = self.throttle.allow(kind)
        if not ok:
            return False
        more = f" ({held} more like it not logged)" if held else ""
        if client:
            what = ("refused a malformed request" if isinstance(exc, (
                http_exceptions.HttpProcessingError, web.RequestPayloadError))
                else "a client's connection ended")
            record.levelno, record.levelname = logging.INFO, "INFO"
            record.msg, record.args = "%s: %s%s", (what, said, more)
            record.exc_info = record.exc_text = None
            record.stack_info = None
        elif more:
            record.msg = f"{record.getMessage()}{more}"
            record.args = ()
        return True


def install(throttle: Throttle | None = None) -> Callable[[], None]:
    """The filter on aiohttp's and asyncio's loggers; the function that removes it."""
    f = ServerLog(throttle)
    loggers = [logging.getLogger(name) for name in LOGGERS]
    for logger in loggers:
        logger.addFilter(f)

    def remove() -> None:
        for logger in loggers:
            logger.removeFilter(f)
    return remove
