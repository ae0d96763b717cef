"""A streaming client that waits is told so (issue 46, item 4; ``[gateway] wait_comments``,
off by default): SSE comment lines, which every SSE parser ignores (the WHATWG rule: a
line that starts with ``:`` is skipped), so that a proxy in between that cuts a silent
connection (nginx's ``proxy_read_timeout``, 60 s; a load balancer's idle timeout) does
not cut a request that waits for a cold start or for a slot.

Rules, each for the failure it prevents:

- **only a request that asks to stream and waits longer than** :data:`FIRST` **seconds**:
  a request served at once gets the engine's own answer, head and all, as before;
- **then the gateway's head is the answer's**: 200, ``text/event-stream``, chunked, sent
  when the first comment is; the engine's own head cannot follow it. Its events follow
  in the same response (carried as bytes, :func:`lokid.gateway.tunnel.carry`, which
  frames them as chunks of this response); an engine that answers an error (a status
  other than 200) once the head is sent gives a last SSE ``error`` event holding its
  error, as an engine failing mid-stream does (:mod:`lokid.gateway.relay`), and the
  request is counted with the engine's status, not 200;
- **a comment every** :data:`EVERY` **seconds**, saying where the request waits:
  ``: waiting, 3 ahead (slots busy (4/4)), about 12 s`` at an engine's gate (its place
  as :meth:`lokid.core.serve.fairshare.FairShare.position` counts it), ``: waiting (loading
  qwen, 40 s)`` for its engine (:meth:`lokid.gateway.waiting.Waiting.engine_why`);
  never a key or a prompt;
- **a write is never cut in two**: the teller is stopped by a flag it reads between two
  comments, never cancelled inside a write, so the engine's first chunk cannot land in
  the middle of a comment.

Not for an API elsewhere (an external preset: its answer is renamed as it passes, on
the relay's path) nor an HTTP/1.0 client (no chunks): those wait silent as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web

from .context import TICKET_KEY
from .replies import GatewayError
from .report import STATUS_KEY

FIRST = 2.0     # seconds a streaming request waits before its first comment
EVERY = 5.0     # seconds between two comments
HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
           "X-Accel-Buffering": "no"}   # nginx: pass each comment on, do not buffer


class Teller:
    """The comments to one waiting request, from :data:`FIRST` seconds on."""

    def __init__(self, request: web.Request, name: str, share: Any, waiting: Any):
        self.request = request
        self.name = name
        self.share = share        # lokid.core.serve.fairshare.FairShare: a ticket's place
        self.waiting = waiting    # lokid.gateway.waiting.Waiting: why the engine waits
        self.since = time.monotonic()
        self.response: web.StreamResponse | None = None
        self.stopping = asyncio.Event()
        self.task = asyncio.get_running_loop().create_task(self._run())
        # a client gone mid-comment fails the task: retrieved, said by stop() if asked
        self.task.add_done_callback(lambda t: t.cancelled() or t.exception())

    def say(self) -> str:
        """Where the request waits now, in a comment's words."""
        ticket = self.request.get(TICKET_KEY)
        if ticket is not None and not ticket.admitted and not ticket.done:
            q = self.share.presets.get(ticket.preset)
            ahead = self.share.position(ticket)
            why = self.waiting.gate_why(q, ticket.key, ticket.batch, ticket.limit) \
                if q is not None else "its turn"
            about = self.share.estimate(ticket.preset, ahead)
            return f"waiting, {ahead} ahead ({why}), about {about:.0f} s"
        why = self.waiting.engine_why(self.name)
        if why == "loading":
            why = f"loading {self.name}"
        return f"waiting ({why}, {time.monotonic() - self.since:.0f} s)"

    async def _run(self) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stopping.wait(), FIRST)
            return
        response = web.StreamResponse(status=200, headers=HEADERS)
        await response.prepare(self.request)
        self.response = response
        while not self.stopping.is_set():
            await response.write(f": {self.say()}\n\n".encode())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), EVERY)

    async def stop(self) -> web.StreamResponse | None:
        """No more comments: the response the head went out with, None if none did. A
        client gone meanwhile raises ConnectionResetError."""
        self.stopping.set()
        try:
            await asyncio.shield(self.task)
        except asyncio.CancelledError:
            self.task.cancel()
            raise
        return self.response

    def close(self) -> None:
        if not self.task.done():
            self.task.cancel()


class Answered(Exception):
    """A request whose answer went out already (its head told it waited, then it failed:
    its error the last event): the handler returns ``response``."""

    def __init__(self, response: web.StreamResponse):
        super().__init__("answered")
        self.response = response


@contextlib.asynccontextmanager
async def telling(request: web.Request, name: str, share: Any,
                  waiting: Any) -> AsyncIterator[Teller]:
    """A :class:`Teller` for ``request`` (for preset ``name``) until the block ends. A
    GatewayError once the head went out (a 503 of a start that failed, a 429, a 504) is
    its last event, in OpenAI's error shape, and :class:`Answered`; before, it is
    raised as it is (answered with its status)."""
    teller = Teller(request, name, share, waiting)
    try:
        yield teller
    except GatewayError as e:
        response = await teller.stop()
        if response is None:
            raise
        request[STATUS_KEY] = e.status   # counted as it would have been answered
        await response.write(b"data: " + json.dumps(e.body()).encode() + b"\n\n")
        await response.write_eof()
        raise Answered(response) from None
    finally:
        teller.close()
