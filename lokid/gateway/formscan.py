"""A multipart form's ``model`` field, found in the body the gateway already holds (issue 48).

OpenAI's ``/v1/audio/transcriptions`` (llama-server b11434 serves it, and
``/audio/transcriptions``) takes a ``multipart/form-data`` body: the audio file and text
fields, ``model`` among them. The JSON walk (:mod:`lokid.gateway.bodyscan`) cannot read
it, so such a request was refused 400 ("must be a JSON object") before it could be routed.
Rules, each for the failure it prevents:

- the body is read once, bounded as any other (:func:`lokid.gateway.body.read_body`:
  ``max_body``, inflated), and relayed as it came: the parts are found with
  ``bytes.find`` of the delimiter (one pass at C speed over an upload of megabytes) and
  only a part's head and a text field's value are copied, never the file; aiohttp's
  form reader would have read the stream a second time, or built every part. That pass
  holds the event loop: 28 ms for a 60 MiB upload (max_body's default is 64 MiB; one
  run on this 2-core machine), an upload that takes seconds to arrive;
- what is looked at is bounded: :data:`MAX_PARTS` parts, a part's head at most
  :data:`MAX_HEAD` bytes, the ``model`` value at most :data:`MAX_MODEL` (400 past any):
  a body of 100,000 empty parts costs no more than one pass;
- a form that names ``model`` twice is refused (400): llama-server turns a repeated
  field into an array, and a router reading its ``model`` would pick neither;
- a body that is no form (no boundary, a delimiter missing, a part whose head does not
  end) is refused 400, never relayed half-understood;
- ``stream`` is read as the engine reads it (the text ``true``), so that a streamed
  transcription is carried as one (:mod:`lokid.gateway.tunnel`).

Pure: no I/O, no aiohttp.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .bodyscan import BodyError

FORM_ROUTES = frozenset({"/v1/audio/transcriptions", "/audio/transcriptions"})
MAX_PARTS = 256        # a transcription's form: a file and a dozen fields
MAX_HEAD = 8 * 1024    # bytes of one part's head (its Content-Disposition and Type)
MAX_MODEL = 1024       # bytes of the model field's value (a preset's name or alias)
MAX_BOUNDARY = 70      # RFC 2046's bound

_BOUNDARY = re.compile(r';\s*boundary=(?:"([^"]{1,200})"|([^\s;]{1,200}))', re.I)
_NAME = re.compile(rb';\s*name=(?:"([^"]*)"|([^\s;]+))', re.I)
_FILENAME = re.compile(rb';\s*filename\*?=', re.I)


@dataclass(frozen=True)
class Form:
    """What the form asks: its ``model`` (None: no such field) and whether it streams."""

    model: str | None
    stream: bool = False


def is_form(content_type: str) -> bool:
    """Whether ``content_type`` says ``multipart/form-data``."""
    return content_type.split(";", 1)[0].strip().lower() == "multipart/form-data"


def _invalid(message: str) -> BodyError:
    return BodyError(400, f"the request body is not a valid multipart form: {message}",
                     "invalid_form")


def boundary_of(content_type: str) -> bytes:
    """The delimiter's boundary from ``Content-Type``; BodyError 400 for none or a bad one."""
    m = _BOUNDARY.search(content_type)
    value = (m.group(1) or m.group(2)) if m else ""
    if not value or len(value) > MAX_BOUNDARY or not value.isascii():
        raise _invalid("its Content-Type names no boundary (of 1 to 70 ASCII characters)")
    return value.encode("ascii")


def scan_form(body: bytes, content_type: str) -> Form:
    """The ``model`` and ``stream`` fields of the form ``body`` (its ``Content-Type``
    ``content_type``); BodyError 400 for a body that is no such form."""
    delimiter = b"--" + boundary_of(content_type)
    if body.startswith(delimiter):
        pos = len(delimiter)
    else:   # a preamble before the first delimiter
        first = body.find(b"\r\n" + delimiter)
        if first < 0:
            raise _invalid("its boundary is not in the body")
        pos = first + 2 + len(delimiter)
    model: str | None = None
    stream = False
    parts = 0
    while True:
        if body.startswith(b"--", pos):   # the close delimiter
            return Form(model, stream)
        if not body.startswith(b"\r\n", pos):
            raise _invalid("a delimiter is not followed by a line end")
        parts += 1
        if parts > MAX_PARTS:
            raise BodyError(413, f"the request's form has over {MAX_PARTS} parts: too many to "
                            "route", "request_too_large")
        head_at = pos + 2
        if body.startswith(b"\r\n", head_at):   # a part with no header
            head_end = head_at - 2
        else:
            head_end = body.find(b"\r\n\r\n", head_at, head_at + MAX_HEAD)
        if head_end < 0:
            raise _invalid(f"a part's head does not end within {MAX_HEAD} bytes")
        value_at = head_end + 4
        end = body.find(b"\r\n" + delimiter, value_at)
        if end < 0:
            raise _invalid("it ends inside a part (no close delimiter)")
        name = _field_name(body[head_at:head_end])
        if name == b"model":
            if model is not None:
                raise _invalid('it names "model" twice')
            model = _text(body, value_at, end)
        elif name == b"stream":
            stream = body[value_at:end].strip().lower() == b"true"
        pos = end + 2 + len(delimiter)


def _field_name(head: bytes) -> bytes | None:
    """The ``name`` of a text field's Content-Disposition; None for a file or no name."""
    for line in head.split(b"\r\n"):
        key, _, value = line.partition(b":")
        if key.strip().lower() != b"content-disposition":
            continue
        if _FILENAME.search(value):
            return None   # a file: never the model
        m = _NAME.search(value)
        return (m.group(1) if m.group(1) is not None else m.group(2)) if m else None
    return None


def _text(body: bytes, start: int, end: int) -> str:
    if end - start > MAX_MODEL:
        raise _invalid(f'its "model" is over {MAX_MODEL} bytes')
    try:
        return body[start:end].decode("utf-8")
    except UnicodeDecodeError:
        raise _invalid('its "model" is not UTF-8') from None
