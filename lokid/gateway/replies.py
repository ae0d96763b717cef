"""What the gateway itself answers, in OpenAI's shapes: an error, the list of models.

Clients of an OpenAI endpoint (the ``openai`` libraries, Open WebUI) read an error's
``{"error": {"message", "type", "code"}}`` and show its message, so every refusal of the
gateway says there what to do; :class:`GatewayError` carries one to the route that answers.
"""

from __future__ import annotations

import json
import re
from typing import Any

# OpenAI's error types
INVALID_REQUEST = "invalid_request_error"
AUTHENTICATION = "authentication_error"
UNAVAILABLE = "service_unavailable_error"
SERVER = "server_error"


class GatewayError(Exception):
    """A request the gateway answers itself: its HTTP status and OpenAI error."""

    def __init__(self, status: int, message: str, kind: str = INVALID_REQUEST,
                 code: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind
        self.code = code

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.kind, self.code)


def error_body(message: str, kind: str, code: str | None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "code": code}}


def sse_error(message: str) -> bytes:
    """An error as one server-sent event: how a stream already under way says it failed
    (the ``openai`` clients raise on an event holding ``error``)."""
    return b"data: " + json.dumps(error_body(message, SERVER, "upstream_failed")).encode() \
        + b"\n\n"


def model_entry(name: str, state: str, on_demand: bool, status: str,
                in_flight: int | None = None, fits: bool | None = None) -> dict[str, Any]:
    """One preset as ``GET /v1/models`` lists it; lokid's own facts under ``lokid``: for
    an engine also its requests in flight and whether a start fits now (null: unknown),
    what a peer gateway routes by (issue 30)."""
    facts: dict[str, Any] = {"state": state, "on_demand": on_demand, "status": status}
    if in_flight is not None:
        facts.update(in_flight=in_flight, fits=fits)
    return {"id": name, "object": "model", "created": 0, "owned_by": "lokid", "lokid": facts}


# An absolute path (not a URL's: not after a word character, ':' or '/'), and a URL.
_PATH = re.compile(r"(?<![\w.:/~-])(?:/[^\s'\"(),;:/]+)+/?")
_URL = re.compile(r"\b(?:https?|unix)://[^\s'\"(),;]+")


def public(text: str) -> str:
    """``text`` (a reason of the daemon's, an engine's Status) as a client may read it:
    a server path is shown by its last part only (``/srv/models/x.gguf`` → ``x.gguf``),
    an address as ``<address>``. The whole text stays for the operator: lokictl, the
    journal (issue 28, item 12)."""
    text = _URL.sub("<address>", text)
    return _PATH.sub(lambda m: m.group(0).rstrip("/").rsplit("/", 1)[-1] or "/", text)
