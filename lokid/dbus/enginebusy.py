"""Whether an engine serves a request now, asked of the engine itself (its ``/slots``):
the daemon's check of a drain that its log's count holds (issue 47).

The daemon counts an engine's requests in flight from its log lines
(:mod:`lokid.watch.meter`), which under systemd reach it through the journal: late, and
stale until the engine's next line. A roll's drain waited for that count to reach 0, and
in the operator walk waited its whole drain (20 s) for "1 requests in flight" after the
request had ended. The gateway's placement met the same figure and asks the engine
(:mod:`lokid.gateway.staleflight`); this is the daemon's side of that question.

Rules, each for a failure it prevents:

- one ``GET /slots``, bounded by :data:`TIMEOUT`: an engine that hangs holds a drain no
  longer than it held it before;
- the answer is read by :func:`lokid.core.bench.slot.slots_of`, the one reader of that
  shape: a slot ``is_processing`` is a request served; no such slot, none;
- every failure answers None ("it does not say"): no answer, a status other than 200
  (``--no-slots``: 501; an engine started with an API key: 401, the daemon holds no
  key), another shape. The caller then waits as before: only an engine that says it
  serves nothing ends a drain early;
- no proxy from the environment (``trust_env`` off), as :mod:`lokid.dbus.reach`: the
  engine is on this host.
"""

from __future__ import annotations

from ..core.bench.slot import slots_of

TIMEOUT = 2.0   # seconds for one engine's /slots


async def serving(url: str) -> bool | None:
    """Whether the engine at ``url`` serves a request now; None when it does not say."""
    import httpx

    try:
        async with httpx.AsyncClient(timeout=TIMEOUT, trust_env=False) as client:
            response = await client.get(url + "/slots")
        if response.status_code != 200:
            return None
        slots = slots_of(response.json())
    except (httpx.HTTPError, OSError, ValueError):
        return None
    if slots is None:
        return None
    return any(s.processing for s in slots)
