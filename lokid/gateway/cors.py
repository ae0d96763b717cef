"""The gateway's own CORS policy: which web pages may call it (issue 28, item 8).

llama-server answers any ``Origin`` with ``Access-Control-Allow-Origin`` set to it, and
the gateway relayed that header: a ``text/plain`` POST from a page at
``http://evil.example`` (a "simple" request, sent without a preflight) was served and
its answer readable, so any site a user visits could chat, start engines and force swaps
through a keyless gateway on loopback. Rules:

- no engine's or external API's ``Access-Control-*`` header reaches a client
  (:meth:`Cors.on_prepare`, on every answer, streamed ones too);
- a request with an ``Origin`` (a browser's, from a page) is served only when the origin
  is in ``[gateway] cors_origins`` (``"*"``: any); any other is refused, 403 in OpenAI's
  shape, before it is routed: a page's request must not start an engine even if the
  page cannot read the answer. Clients that are not browsers send no ``Origin`` and are
  not concerned;
- an allowed origin gets ``Access-Control-Allow-Origin`` (itself, with ``Vary: Origin``),
  and its preflight (``OPTIONS`` with ``Access-Control-Request-Method``) is answered by
  the gateway, 204, for GET and POST with the headers asked (``Authorization``,
  ``Content-Type``...); credentials (cookies) are never allowed: the gateway's keys are
  bearer keys;
- every refusal reaches the gateway's log (issue 48, item 2: answered here, outside the
  handler that logs refusals, a desktop or webview client sending ``Origin: app://...``,
  ``vscode-webview://...`` or ``null`` was refused without a word to the operator): one
  line naming the origin and the setting that allows it, through
  :meth:`lokid.gateway.faults.Faults.client` (its own: :attr:`Cors.faults`), so
  rate-limited as every 4xx is (the origin is the client's to choose: a page sending
  thousands must not fill the journal), the origin shown escaped and cut (:func:`shown`);
- the allowed origins are one frozen :class:`Policy`, replaced whole by a reload
  (:mod:`lokid.gateway.reload`), and a request keeps the one it was let in by: a stream
  allowed before ``systemctl reload`` still gets its ``Access-Control-Allow-Origin``
  when its answer begins after (a browser would not let its page read it otherwise).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from ..core.errors import printable
from .faults import Faults
from .replies import error_body

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
PREFLIGHT_MAX_AGE = "600"
ALLOWED_METHODS = "GET, POST, OPTIONS"
SHOWN = 80   # characters of a refused origin shown, at most
# The policy a request was let in by (set by the middleware): a typed key where aiohttp
# has them.
POLICY_KEY: Any = web.RequestKey("lokid_cors", object) if hasattr(web, "RequestKey") \
    else "lokid_cors"


def shown(origin: str) -> str:
    """A refused origin as the answer and the log show it: control characters escaped,
    at most :data:`SHOWN` characters of it (a client writes it)."""
    text = printable(origin[:SHOWN])
    return text if len(text) <= SHOWN and len(origin) <= SHOWN else text[:SHOWN] + "..."


@dataclass(frozen=True)
class Policy:
    """The origins allowed: any (``"*"``), or those named."""

    any: bool
    origins: frozenset[str]

    @classmethod
    def of(cls, origins: tuple[str, ...]) -> Policy:
        return cls("*" in origins, frozenset(o for o in origins if o != "*"))

    def allows(self, origin: str) -> bool:
        return self.any or origin in self.origins


class Cors:
    def __init__(self, origins: tuple[str, ...]):
        self.policy = Policy.of(origins)
        self.faults = Faults()   # its refusals' lines, rate-limited

    def allows(self, origin: str) -> bool:
        return self.policy.allows(origin)

    def set(self, origins: tuple[str, ...]) -> None:
        """The allowed origins from now on (a reload): requests already let in keep theirs."""
        self.policy = Policy.of(origins)

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        policy = request[POLICY_KEY] = self.policy
        origin = request.headers.get("Origin")
        if origin is None:
            return await handler(request)
        if not policy.allows(origin):
            page = shown(origin)
            self.faults.client(403, "origin_not_allowed", request.method, request.path,
                               f"a page at origin {page}: allow it in lokid.toml's "
                               "[gateway] cors_origins")
            return web.json_response(error_body(
                f"requests from web pages at {page} are not allowed here: the operator "
                "lists the pages that may call this gateway in lokid.toml's [gateway] "
                "cors_origins", "permission_error", "origin_not_allowed"), status=403)
        if request.method == "OPTIONS" and "Access-Control-Request-Method" in request.headers:
            return web.Response(status=204)   # its headers: on_prepare()
        return await handler(request)

    async def on_prepare(self, request: web.Request, response: web.StreamResponse) -> None:
        """Every answer, before its head is sent: the other side's CORS headers gone, the
        gateway's own for an allowed origin."""
        for key in [k for k in response.headers if k.lower().startswith("access-control-")]:
            del response.headers[key]
        origin = request.headers.get("Origin")
        policy = request.get(POLICY_KEY)
        if origin is not None and (policy if isinstance(policy, Policy)
                                   else self.policy).allows(origin):
            response.headers["Access-Control-Allow-Origin"] = origin
            response.headers.add("Vary", "Origin")
            if request.method == "OPTIONS":
                response.headers["Access-Control-Allow-Methods"] = ALLOWED_METHODS
                response.headers["Access-Control-Max-Age"] = PREFLIGHT_MAX_AGE
                asked = request.headers.get("Access-Control-Request-Headers")
                if asked:
                    response.headers["Access-Control-Allow-Headers"] = asked[:1024]
