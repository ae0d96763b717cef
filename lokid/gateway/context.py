"""What the gateway's parts note on a request for one another (aiohttp request keys).

- :data:`IDENTITY_KEY`: who sent it (:class:`lokid.core.serve.keys.Identity`), set once its key
  is checked (:mod:`lokid.gateway.keys`); absent for a request refused before (a 401);
- :data:`ROUTE_KEY`: the route asked, as the gateway offers it (``/v1/chat/completions``);
- :data:`WAITED_KEY`: seconds it waited before it was sent on (a cold start, a swap, a
  busy engine's queue: :mod:`lokid.gateway.admission`);
- :data:`FIGURES_KEY`: the engine's own figures read from its answer
  (:class:`lokid.gateway.usage.Figures`), for usage and the audit record;
- :data:`WHERE_KEY`: where it ran: ``"local"``, ``"external"``, or ``"peer:<host>"``;
- :data:`FIRST_BYTE_KEY`: the loop's time when its answer's first byte went out;
- :data:`TICKET_KEY`: its ticket at its engine's gate (:mod:`lokid.gateway.admission`),
  read for its place by :mod:`lokid.gateway.waitnotes`.

Typed keys where aiohttp has them (3.12; a plain string warns there), strings on
Debian's 3.8 and 3.11.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web


def _key(name: str, kind: type) -> Any:
    return web.RequestKey(name, kind) if hasattr(web, "RequestKey") else name


IDENTITY_KEY: Any = _key("lokid_identity", object)
ROUTE_KEY: Any = _key("lokid_route", str)
WAITED_KEY: Any = _key("lokid_waited", float)
FIGURES_KEY: Any = _key("lokid_figures", object)
WHERE_KEY: Any = _key("lokid_where", str)
FIRST_BYTE_KEY: Any = _key("lokid_first_byte", float)
TICKET_KEY: Any = _key("lokid_ticket", object)
