"""The rule of :mod:`lokid.gateway.serverlog` on aiohttp's own exceptions, without a
process (the real gateway process: test_serverlog.py): what a client sent is never
written, lines are bounded by kind, and a defect keeps its traceback."""

from __future__ import annotations

import logging

import pytest
from aiohttp import http_exceptions, web

from lokid.gateway.faults import LINES_PER_WINDOW, Throttle
from lokid.gateway.serverlog import ServerLog, summary


@pytest.mark.parametrize("exc", [
    http_exceptions.BadStatusLine("GET /sk-secret HTTP/1.1"),            # pure-Python parser
    http_exceptions.BadHttpMessage("Invalid header token:\n\n  b'X sk-secret'\n    ^"),  # C
    http_exceptions.LineTooLong("bytearray(b'sk-secret...')", "8190"),
    http_exceptions.BadHttpMessage("Invalid HTTP Header: sk-secret"),     # 3.8.4's, unquoted
    web.RequestPayloadError("400, message='sk-secret'"),   # a bad chunk, as 3.8.4 wraps it
    http_exceptions.TransferEncodingError("sk-secret"),   # 3.14's pure-Python parser
])
def test_what_a_client_sent_is_never_said(exc: Exception) -> None:
    said = summary(exc)
    assert said.startswith(f"400 {type(exc).__name__}") and "sk-secret" not in said, said
    assert "\n" not in said and len(said) < 200


def record(exc: BaseException) -> logging.LogRecord:
    return logging.LogRecord("aiohttp.server", logging.ERROR, __file__, 1,
                             "Error handling request from %s", ("127.0.0.1",),
                             (type(exc), exc, exc.__traceback__))


def test_lines_of_a_kind_are_bounded_and_the_next_says_how_many_were_not() -> None:
    throttle = Throttle()
    f = ServerLog(throttle)
    passed = [f.filter(r) for r in (record(http_exceptions.BadHttpMessage("Invalid header"))
                                    for _ in range(1000))]
    assert sum(passed) == LINES_PER_WINDOW
    # the kind is the type, not the text (which a client may vary without end)
    assert not f.filter(record(http_exceptions.BadHttpMessage("Duplicate Content-Length")))
    # (one argument: 3.8.4's BadStatusLine takes no ``error``; its text is the same)
    other = record(http_exceptions.BadStatusLine(""))
    assert f.filter(other)   # another kind has lines of its own
    assert other.levelno == logging.INFO and other.exc_info is None
    assert other.getMessage() == ("refused a malformed request: 400 BadStatusLine: "
                                  "Bad status line")
    # a window later, the first line says how many were held back
    kind = next(k for k in throttle.kinds if k.endswith("BadHttpMessage"))
    since, written, held = throttle.kinds[kind]
    throttle.kinds[kind] = (since - throttle.window, written, held)
    again = record(http_exceptions.BadHttpMessage("Invalid header"))
    assert f.filter(again)
    assert again.getMessage().endswith(f"({1001 - LINES_PER_WINDOW} more like it not logged)")


def test_a_defect_keeps_its_traceback() -> None:
    try:
        raise KeyError("ours")
    except KeyError as e:
        r = record(e)
    assert ServerLog().filter(r)
    assert r.levelno == logging.ERROR and r.exc_info is not None
