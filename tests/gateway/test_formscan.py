"""A transcription's multipart form read for its ``model`` (issue 48,
lokid.gateway.formscan): the fields as a client library writes them, the file never the
model, and each bound fed past."""

from __future__ import annotations

import httpx
import pytest

from lokid.gateway.bodyscan import BodyError
from lokid.gateway.formscan import MAX_HEAD, MAX_MODEL, MAX_PARTS, Form, is_form, scan_form


def encoded(data: dict[str, str], files: dict[str, tuple[str, bytes, str]]) -> tuple[bytes, str]:
    """A form as httpx (the openai client's library) writes it: body and Content-Type."""
    request = httpx.Request("POST", "http://x/v1/audio/transcriptions", data=data, files=files)
    return request.read(), request.headers["Content-Type"]


def form(*parts: bytes, boundary: str = "b0und", end: bytes = b"--\r\n") -> tuple[bytes, str]:
    body = b"".join(b"--" + boundary.encode() + b"\r\n" + p + b"\r\n" for p in parts)
    return body + b"--" + boundary.encode() + end, f"multipart/form-data; boundary={boundary}"


def field(name: str, value: bytes) -> bytes:
    return f'Content-Disposition: form-data; name="{name}"\r\n\r\n'.encode() + value


def test_the_model_of_a_form_as_clients_send_it() -> None:
    # the file before the field, holding what looks like a model field and the boundary's
    # start: only the parts' heads decide
    audio = b"RIFF" + b'name="model"\r\n\r\nwrong\r\n--' * 1000 + bytes(range(256)) * 100
    body, ctype = encoded({"model": "whisper", "response_format": "json"},
                          {"file": ("a.wav", audio, "audio/wav")})
    assert is_form(ctype) and not is_form("application/json")
    assert scan_form(body, ctype) == Form("whisper", False)
    body, ctype = encoded({"model": "ünï", "stream": "true"},
                          {"file": ("model", b"x", "audio/wav")})
    assert scan_form(body, ctype) == Form("ünï", True)
    body, ctype = encoded({"language": "en"}, {"file": ("a.wav", b"x", "audio/wav")})
    assert scan_form(body, ctype) == Form(None, False)   # the default model then


def test_odd_but_valid_forms() -> None:
    body, ctype = form(field("model", b"m"), boundary="a b")
    assert scan_form(body, 'multipart/form-data; boundary="a b"').model == "m"
    body, ctype = form(field("model", b"m"))
    assert scan_form(b"a preamble\r\n" + body, ctype).model == "m"
    assert scan_form(*form(b"\r\nno head", field("model", b""))).model == ""
    # a file part named model is a file, not the model
    file_part = (b'Content-Disposition: form-data; name="model"; filename="m.wav"\r\n'
                 b"Content-Type: audio/wav\r\n\r\nRIFF")
    assert scan_form(*form(file_part)).model is None


@pytest.mark.parametrize(("body", "ctype", "status", "says"), [
    (b"{}", "multipart/form-data", 400, "no boundary"),
    (b"{}", "multipart/form-data; boundary=" + "x" * 71, 400, "no boundary"),
    (b"{}", "multipart/form-data; boundary=b0und", 400, "not in the body"),
    (*form(field("model", b"m"), end=b""), 400, "line end"),
    (b"--b0und\r\n" + field("model", b"m"), "multipart/form-data; boundary=b0und", 400,
     "ends inside a part"),
    (*form(b"Content-Disposition: form-data" + b"; x=y" * MAX_HEAD + b"\r\n\r\nv"), 400,
     "head does not end"),
    (*form(field("model", b"a"), field("model", b"b")), 400, 'names "model" twice'),
    (*form(field("model", b"m" * (MAX_MODEL + 1))), 400, "over 1024 bytes"),
    (*form(field("model", b"\xff")), 400, "not UTF-8"),
    (*form(*[field("f", b"")] * (MAX_PARTS + 1)), 413, "over 256 parts"),
])
def test_what_is_no_form_or_too_much_to_route(body: bytes, ctype: str, status: int,
                                               says: str) -> None:
    with pytest.raises(BodyError) as e:
        scan_form(body, ctype)
    assert e.value.status == status and says in str(e.value), str(e.value)
