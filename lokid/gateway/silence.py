"""An engine that stops answering in the middle of a request (issue 28, item 3).

An engine stopped (SIGSTOP, a driver hang) mid-stream or before its answer still holds
its connections open: the kernel keeps them, nothing arrives. Clients waited for their
own timeouts (45 s, 75 s) with no byte, and ``/v1/models`` kept calling it ready. But
silence alone is no fault: an answer that is not streamed comes whole at its end, and a
long prompt on a slow GPU is read before the first token. So, each rule for one of those:

- silence is bounded twice: ``first_byte_timeout`` from the request's relay to the
  answer's head (or its whole body when it is not streamed), ``stream_idle_timeout``
  between two chunks of a stream (lokid.toml ``[gateway]``; 10 and 5 minutes);
- an engine silent for :data:`CHECK_AFTER` seconds is asked ``/health`` (llama-server
  answers it from its HTTP threads while its slots are busy: any answer, 200 or 503, is
  a live engine). No answer in :data:`PROBE_TIMEOUT` seconds is a hung engine: its
  request ends at once (504 before its head; after it, a stream gets a last error event
  and any other answer is cut off), and the preset is shown ``unresponsive``;
- an unresponsive preset's next requests are answered 503 at once, not sent to wait;
  every :data:`RECHECK` seconds one of them asks ``/health`` again, and an answer
  clears the mark (systemd's watchdog restarts a hung engine: its next start answers);
- an external API has no ``/health`` of lokid's knowing: only the two bounds apply;
- nothing here runs per chunk beyond noting the time: a stream's watch is one timer,
  re-armed each :data:`CHECK_AFTER` seconds.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import aiohttp

from ..core.serve.tables import span_text
from .replies import UNAVAILABLE, GatewayError

log = logging.getLogger("lokid.gateway")

CHECK_AFTER = 15.0     # seconds of silence before /health is asked
PROBE_TIMEOUT = 5.0    # seconds /health has to answer
RECHECK = 5.0          # an unresponsive preset's /health is asked at most this often

T = TypeVar("T")
Probe = Callable[[], Awaitable[bool]]


class EngineSilent(Exception):
    """The other side said nothing for too long, or its /health did not answer."""


@dataclass(frozen=True)
class Patience:
    """How long a request waits on its engine, and how that engine's life is asked."""

    first_byte: float
    idle: float
    check_after: float = CHECK_AFTER
    probe: Probe | None = None        # None: an external API, bounds only
    hung: Callable[[str], None] = lambda reason: None   # told when the probe fails


async def within(aw: Awaitable[T], patience: Patience, what: str) -> T:
    """``aw``'s result, or EngineSilent when ``patience.first_byte`` passes without it or
    the engine's /health does not answer after ``check_after`` of silence."""
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(aw)
    start = loop.time()
    try:
        while True:
            left = start + patience.first_byte - loop.time()
            if left <= 0:
                raise EngineSilent(f"{what} sent no answer in "
                                   f"{span_text(patience.first_byte)} (first_byte_timeout)")
            done, _ = await asyncio.wait({task}, timeout=min(patience.check_after, left))
            if done:
                return task.result()
            if patience.probe is not None and loop.time() - start >= patience.check_after \
                    and not await patience.probe():
                reason = (f"{what} does not answer /health (silent for "
                          f"{loop.time() - start:.0f} s)")
                patience.hung(reason)
                raise EngineSilent(reason)
    finally:
        if not task.done():
            task.cancel()
        # its outcome, whatever it was, is not left unretrieved
        task.add_done_callback(lambda t: t.cancelled() or t.exception())


class Endable(Protocol):
    """What a stream's watch ends: aiohttp's reader, or the tunnel's engine side."""

    def set_exception(self, exc: BaseException) -> None: ...


class StreamWatch:
    """One stream's silence, watched by a timer; :meth:`touch` at each chunk. When it is
    over, the stream's reader is given EngineSilent, which the relay's read raises."""

    def __init__(self, reader: aiohttp.StreamReader | Endable, patience: Patience, what: str):
        self.loop = asyncio.get_running_loop()
        self.reader = reader
        self.patience = patience
        self.what = what
        self.last = self.loop.time()
        self.verdict = ""
        self.probing: asyncio.Task[None] | None = None
        self.timer: asyncio.TimerHandle | None = self.loop.call_later(
            min(patience.check_after, patience.idle), self._tick)

    def touch(self) -> None:
        self.last = self.loop.time()

    def close(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.probing is not None:
            self.probing.cancel()

    def _tick(self) -> None:
        self.timer = None
        now = self.loop.time()
        silent = now - self.last
        if silent >= self.patience.idle:
            self._end(f"{self.what} sent nothing for {span_text(self.patience.idle)} "
                      "mid-answer (stream_idle_timeout)")
            return
        if self.patience.probe is not None and silent >= self.patience.check_after \
                and self.probing is None:
            self.probing = self.loop.create_task(self._probe())
        due = self.last + self.patience.check_after
        if due <= now:
            due = now + self.patience.check_after
        self.timer = self.loop.call_at(min(due, self.last + self.patience.idle), self._tick)

    async def _probe(self) -> None:
        assert self.patience.probe is not None
        alive = await self.patience.probe()
        self.probing = None
        silent = self.loop.time() - self.last
        if not alive and silent >= self.patience.check_after and not self.verdict:
            reason = f"{self.what} does not answer /health (silent for {silent:.0f} s mid-answer)"
            self.patience.hung(reason)
            self._end(reason)

    def _end(self, verdict: str) -> None:
        if self.verdict:
            return
        self.verdict = verdict
        self.close()
        self.reader.set_exception(EngineSilent(verdict))


class HeadWatch:
    """:func:`within`'s bounds for a future that another's callback completes (the byte
    tunnel's answer head), kept by a timer that fails it (``target.set_exception``)
    rather than by a task and :func:`asyncio.wait` around it: its awaiter then wakes one
    turn of the loop after the head came, not three (shield, wait, task), each turn behind
    every other request's steps (issue 47: with 16 simultaneous streams, ~1 ms a turn).
    The same verdicts: ``first_byte`` passed, or the probe failing after ``check_after``
    of silence (told to ``patience.hung``); :meth:`close` once the head came."""

    def __init__(self, target: Endable, patience: Patience, what: str):
        self.loop = asyncio.get_running_loop()
        self.target, self.patience, self.what = target, patience, what
        self.start = self.loop.time()
        self.probing: asyncio.Task[None] | None = None
        self.timer: asyncio.TimerHandle | None = self.loop.call_later(
            min(patience.check_after, patience.first_byte), self._tick)

    def close(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.probing is not None:
            self.probing.cancel()
            self.probing = None

    def _tick(self) -> None:
        self.timer = None
        now = self.loop.time()
        left = self.start + self.patience.first_byte - now
        if left <= 0:
            self._end(f"{self.what} sent no answer in {span_text(self.patience.first_byte)} "
                      "(first_byte_timeout)")
            return
        if self.patience.probe is not None and now - self.start >= self.patience.check_after \
                and self.probing is None:
            self.probing = self.loop.create_task(self._probe())
        self.timer = self.loop.call_later(min(self.patience.check_after, left), self._tick)

    async def _probe(self) -> None:
        assert self.patience.probe is not None
        alive = await self.patience.probe()
        self.probing = None
        if not alive and self.timer is not None:   # not closed meanwhile
            reason = (f"{self.what} does not answer /health (silent for "
                      f"{self.loop.time() - self.start:.0f} s)")
            self.patience.hung(reason)
            self._end(reason)

    def _end(self, verdict: str) -> None:
        self.close()
        self.target.set_exception(EngineSilent(verdict))


class Liveness:
    """The presets whose engine did not answer /health, and the probe itself."""

    def __init__(self, client: Callable[[], aiohttp.ClientSession | None]):
        self.client = client
        self.marks: dict[str, tuple[float, str, float]] = {}   # name → (since, reason, asked)

    async def alive(self, url: str) -> bool:
        """Whether the engine at ``url`` answers /health within PROBE_TIMEOUT (any status)."""
        client = self.client()
        if client is None:
            return True
        try:
            async with client.get(f"{url}/health",
                                  timeout=aiohttp.ClientTimeout(total=PROBE_TIMEOUT)) as r:
                await r.read()
                return True
        except (aiohttp.ClientError, OSError, TimeoutError):
            return False

    def patience(self, name: str, url: str, first_byte: float, idle: float) -> Patience:
        def hung(reason: str) -> None:
            self.mark(name, reason)
        return Patience(first_byte, idle, CHECK_AFTER, lambda: self.alive(url), hung)

    def mark(self, name: str, reason: str) -> None:
        if name not in self.marks:
            log.warning("preset %s: %s; shown unresponsive until it answers again", name,
                        reason)
        now = time.monotonic()
        since = self.marks[name][0] if name in self.marks else now
        self.marks[name] = (since, reason, now)

    def state(self, name: str) -> str:
        """The mark's reason with its age, or "" when ``name`` is not marked."""
        mark = self.marks.get(name)
        if mark is None:
            return ""
        return f"{mark[1]}, {time.monotonic() - mark[0]:.0f} s ago"

    async def check(self, name: str, url: str) -> None:
        """Before a request is sent to ``name``: GatewayError 503 while it is marked and
        its /health still does not answer (asked at most every RECHECK seconds)."""
        mark = self.marks.get(name)
        if mark is None:
            return
        if time.monotonic() - mark[2] >= RECHECK:
            self.marks[name] = (mark[0], mark[1], time.monotonic())
            if await self.alive(url):
                log.info("preset %s: its engine answers /health again", name)
                self.marks.pop(name, None)
                return
        raise GatewayError(503, f"preset {name!r}: its engine does not answer (the gateway "
                           "asked its /health); systemd's watchdog restarts a hung engine",
                           UNAVAILABLE, "model_unresponsive")

    def forget(self, name: str, state: Any) -> None:
        """A preset no longer ready (stopped, restarting): its mark goes with that run."""
        if state != "ready":
            self.marks.pop(name, None)
