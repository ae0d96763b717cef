"""Whether an external preset's API answers: the daemon's ``Reachable`` property.

An external preset (:mod:`lokid.core.config.external`) has no engine whose state says whether
requests for it can be served; what an operator asks instead is whether its API
answers. :class:`Reachability` answers that for one preset, by asking the API's model
list (``GET <url>/models``, :data:`TIMEOUT` seconds, no key: an API that answers 401
without one still answers, which is the question; a key would have to cross into the
daemon, which never holds one).

Rules, each for a failure it prevents:

- a check at a load (the property is announced then) and then at most every
  :data:`CHECK_EVERY` seconds, and only while someone reads the property: a daemon
  nobody asks sends nothing to another host, and a client reading in a loop sends at
  most one request per period;
- one check in flight per preset, bounded by :data:`TIMEOUT`: a host that never
  answers holds nothing but one task for two seconds;
- a change is announced (``PropertiesChanged``), so the gateway and ``lokictl`` need not
  poll; a URL changed by a reload is checked again at once; a read that finds the last
  result due for a check gets it with its age ("…, checked 95 s ago: checking again"),
  not as if it were current (an API stopped since was otherwise shown reachable);
- the text says what was seen (an HTTP status, or why nothing answered), never a body:
  an API's answer is not the daemon's to repeat.

Under ``lokid.service`` the daemon's sandbox reaches loopback and the addresses the
generator allows (``IPAddressAllow=``: the presets' own, external presets' IP addresses
included); an API at a host *name* is then reported unreachable from the daemon even
when the gateway reaches it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from ..core.config.external import models_url

log = logging.getLogger("lokid.daemon")

CHECK_EVERY = 30.0
TIMEOUT = 2.0
NOT_CHECKED = "not checked yet"


async def check(url: str) -> str:
    """One look at ``url``'s model list: ``reachable (HTTP 200)`` or ``unreachable: why``."""
    import httpx

    target = models_url(url)
    try:
        # trust_env off: the gateway (aiohttp) takes no proxy from the environment either
        async with httpx.AsyncClient(timeout=TIMEOUT, trust_env=False) as client:
            response = await client.get(target)
    except httpx.TimeoutException:
        return f"unreachable: no answer from {target} in {TIMEOUT:g} s"
    except (httpx.HTTPError, OSError, ValueError) as e:
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        return f"unreachable: {target}: {why}"[:300]
    return f"reachable (GET {target}: HTTP {response.status_code})"


class Reachability:
    """One preset's last check; ``announce(text)`` is called when the text changes."""

    def __init__(self, announce: Callable[[str], None]):
        self.announce = announce
        self.url = ""
        self.text = NOT_CHECKED
        self.checked = float("-inf")   # monotonic time of the last check's start
        self.task: asyncio.Task[None] | None = None

    def look(self, url: str) -> str:
        """The last result for ``url``, starting a check when it is due."""
        if url != self.url:
            self.url, self.text, self.checked = url, NOT_CHECKED, float("-inf")
        busy = self.task is not None and not self.task.done()
        age = time.monotonic() - self.checked
        if not busy and age >= CHECK_EVERY:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:   # read outside the daemon's loop (introspection): no check
                return self.text
            self.checked = time.monotonic()
            self.task = loop.create_task(self._check(url))
            if self.text != NOT_CHECKED:
                # what a reader gets now is that old: said, not passed off as current
                # (the new result is announced when it comes)
                return f"{self.text}, checked {age:.0f} s ago: checking again"
        return self.text

    async def _check(self, url: str) -> None:
        try:
            text = await check(url)
        except Exception as e:   # a defect: this property only, said in the log
            log.warning("reachability of %s: %s: %s", url, type(e).__name__, e)
            text = f"unknown: the check failed ({type(e).__name__})"
        if url != self.url:   # a reload changed the URL meanwhile: this result is stale
            return
        if text != self.text:
            self.text = text
            self.announce(text)
