"""A request body's top-level ``model``, found without parsing the body (issue 28, item 9).

The gateway needs one field of a body it relays as it is. Parsed whole with
``json.loads``, a 64 KB gzip body that inflates to 63 MiB of ``[{},{},...]`` took the
gateway to 1.7 GB and held its event loop for seconds; a body nested 1,000 deep raised
``RecursionError`` (a 500 and a traceback). So the body is walked, not parsed:

- only its structure is visited: the next bracket or quote is found by a regular
  expression (C speed over numbers, commas and spaces), a string is skipped whole by
  another (C speed over its characters), so a long prompt or a base64 image costs a
  scan of its bytes and nothing is built;
- keys are decoded only at the top level (``json.loads`` of the key alone: an escaped
  ``"mod\\u0065l"`` is ``model`` too, as the engine will read it);
- every top-level ``model`` whose value is a string is found with its place
  (:attr:`Scan.spans`): an external preset's request gets each one replaced, in the
  bytes, by its ``upstream_model``; nothing else of the body is re-encoded (an unpaired
  surrogate stays the client's and the API's business, not a ``UnicodeEncodeError``);
- what is visited is bounded: :data:`MAX_TOKENS` brackets and strings (413 past it) and
  :data:`MAX_DEPTH` levels of nesting (400 past it; llama.cpp's JSON values are freed
  recursively, a deep enough body would overflow the engine's stack);
- a body that is not one JSON object, ends inside one or closes a bracket it did not
  open is refused (400); other defects (a bad number, a missing comma) are the engine's
  to find: checking them would mean parsing;
- the walk is a generator that yields every :data:`TOKENS_PER_STEP` tokens, so that
  its caller can let the event loop serve others in between.

Pure: no I/O, no aiohttp.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field

MAX_TOKENS = 200_000     # brackets and strings visited, at most (a chat of 500 turns: ~3,000)
MAX_DEPTH = 128          # levels of nesting (a tool's JSON schema: ~10)
TOKENS_PER_STEP = 20_000

_NEXT = re.compile(rb'[\[\]{}"]')
_STRING_REST = re.compile(rb'[^"\\]*(?:\\.[^"\\]*)*"', re.S)   # after the opening quote
_SPACE = re.compile(rb"[ \t\r\n]*")
_PLAIN = re.compile(rb'"[^"\\\x00-\x1f]*"')   # a string token with nothing to unescape
_OPEN, _CLOSE, _QUOTE = b"[{", b"]}", ord('"')


class BodyError(ValueError):
    """The body cannot be routed: ``status`` 400 (what it is not) or 413 (too big to walk)."""

    def __init__(self, status: int, message: str, code: str):
        super().__init__(message)
        self.status = status
        self.code = code


@dataclass
class Scan:
    """What the walk found: the top-level ``model`` (the last one, as ``json.loads``
    reads duplicates), where each top-level string ``model`` value is, where the
    object opens; ``model_kind`` names a ``model`` that is not a string; ``stream``:
    whether the request asks to stream (:mod:`lokid.gateway.tunnel` carries it)."""

    model: str | None = None
    spans: list[tuple[int, int]] = field(default_factory=list)
    opens_at: int = 0
    model_kind: str = ""
    stream: bool = False   # a top-level "stream": true (the last one): the answer streams


def _invalid(message: str) -> BodyError:
    return BodyError(400, f"the request body is not valid JSON: {message}", "invalid_json")


def _string_end(body: bytes, start: int) -> int:
    """Where the string token opening at ``start`` ends (after its closing quote)."""
    m = _STRING_REST.match(body, start + 1)
    if m is None:
        raise _invalid("a string does not end")
    return m.end()


def _text(token: bytes) -> str:
    if _PLAIN.fullmatch(token):   # no escape, no control character: its bytes are its text
        try:   # as json.loads reads bytes (UTF-8, surrogatepass), without its decoder
            return token[1:-1].decode("utf-8", "surrogatepass")
        except UnicodeDecodeError:
            pass   # json.loads says what is wrong
    try:
        text = json.loads(token)
    except ValueError as e:   # a bad escape, invalid UTF-8
        raise _invalid(f"a key or model name cannot be read ({e})") from None
    assert isinstance(text, str)
    return text


def walk(body: bytes, max_tokens: int = MAX_TOKENS,
         max_depth: int = MAX_DEPTH) -> Iterator[Scan | None]:
    """Walk ``body``: yields None every :data:`TOKENS_PER_STEP` tokens, then the
    :class:`Scan` last; BodyError for a body that cannot be routed."""
    start = _SPACE.match(body).end()   # type: ignore[union-attr]
    if body[start:start + 1] != b"{":
        raise BodyError(400, "the request body must be a JSON object", "invalid_json")
    scan = Scan(opens_at=start)
    stack = [ord("{")]
    pos = start + 1
    tokens = 0
    while stack:
        m = _NEXT.search(body, pos)
        if m is None:
            raise _invalid("it ends inside an object or array")
        c = body[m.start()]
        tokens += 1
        if tokens > max_tokens:
            raise BodyError(413, f"the request body holds over {max_tokens} JSON objects, "
                            "arrays and strings: too many to route", "request_too_large")
        if tokens % TOKENS_PER_STEP == 0:
            yield None
        if c == _QUOTE:
            end = _string_end(body, m.start())
            pos = end
            if len(stack) == 1:   # a key (or a stray string) of the top-level object
                colon = _SPACE.match(body, end).end()   # type: ignore[union-attr]
                key = _text(body[m.start():end]) if body[colon:colon + 1] == b":" else ""
                if key == "stream":
                    value = _SPACE.match(body, colon + 1).end()   # type: ignore[union-attr]
                    scan.stream = body[value:value + 4] == b"true"
                elif key == "model":
                    value = _SPACE.match(body, colon + 1).end()   # type: ignore[union-attr]
                    if body[value:value + 1] == b'"':
                        value_end = _string_end(body, value)
                        scan.model = _text(body[value:value_end])
                        scan.spans.append((value, value_end))
                        scan.model_kind = ""
                        pos = value_end
                    else:
                        scan.model_kind = "not a string"
                        scan.model = None
        elif c in _OPEN:
            stack.append(c)
            if len(stack) > max_depth:
                raise BodyError(400, f"the request body is nested over {max_depth} levels "
                                "deep", "invalid_json")
            pos = m.end()
        else:
            opener = stack.pop()
            if _OPEN.index(opener) != _CLOSE.index(c):
                raise _invalid(f"a {chr(c)} closes a {chr(opener)} at byte {m.start()}")
            pos = m.end()
    if _SPACE.match(body, pos).end() != len(body):   # type: ignore[union-attr]
        raise _invalid("something follows the object")
    yield scan


def scan_body(body: bytes, **limits: int) -> Scan:
    """:func:`walk` at once (no yielding to anyone)."""
    result = list(walk(body, **limits))[-1]   # Nones, one per step, then the scan
    assert result is not None
    return result


def with_model(body: bytes, scan: Scan, model: str) -> bytes:
    """``body`` asking for ``model``: each top-level ``model`` value replaced in place,
    or one added first in the object when it has none. An empty body stays empty."""
    if not body:
        return body
    value = json.dumps(model).encode()   # ASCII: any model name, escaped
    if not scan.spans:
        inside = _SPACE.match(body, scan.opens_at + 1).end()   # type: ignore[union-attr]
        sep = b"" if body[inside:inside + 1] == b"}" else b","
        return body[:scan.opens_at + 1] + b'"model":' + value + sep + body[scan.opens_at + 1:]
    out = []
    last = 0
    for start, end in scan.spans:
        out += [body[last:start], value]
        last = end
    out.append(body[last:])
    return b"".join(out)
