"""The audit record of a request (issue 46, item 2): one journal entry per answer, with
fields an operator filters on (``journalctl LOKID_KEY=alice``, ``LOKID_STATUS=429``).

Fields: ``LOKID_KEY`` (the key's name), ``LOKID_PRESET``, ``LOKID_ROUTE``,
``LOKID_STATUS`` (499: the client went away), ``LOKID_PROMPT_TOKENS``,
``LOKID_CACHED_TOKENS``, ``LOKID_GENERATED_TOKENS`` (the engine's own figures,
:mod:`lokid.gateway.figures`; empty when the answer had none), ``LOKID_WAIT_MS``,
``LOKID_TTFB_MS`` (empty when nothing was answered), ``LOKID_DURATION_MS``,
``LOKID_WHERE`` (``local``, ``external``, ``peer:<host>``), ``LOKID_HOP`` (1: sent by a
peer gateway, counted where it entered), and a short ``MESSAGE``.

Rules, each for a failure it prevents:

- never the prompt, the answer or the key: the record is built from the key's name,
  the preset, the route and counts only (a journal is read by more people than the
  keys' owners, and kept longer);
- one entry per request, written with ``journal.send`` (systemd-python) when the
  gateway's stderr is the journal (:func:`lokid.host.journallog.stderr_is_journal`):
  structured fields, no line to parse. Elsewhere (a terminal, a test) nothing but a
  debug line: a line per request on a terminal drowns the gateway's own lines;
- a failure to write (journald gone, its socket full) loses that record, is said once,
  and never fails or delays the request (the counts that matter are the usage report's,
  :mod:`lokid.gateway.usage`, which keeps what the daemon does not take). journald may
  rate-limit a unit's entries: the audit is a trail, never the count;
- off the request's path: a ``journal.send`` took 45-60 us to a real journald
  (benchmarks/usage_cost.py), spent before the answer went out. :meth:`Audit.post`
  queues the record and the event loop writes it after the answer is sent
  (``call_soon``: the handler has written its answer before the loop runs it), at most
  :data:`BATCH` a turn of the loop so that a burst does not hold the other requests;
  at most :data:`MAX_QUEUED` wait: past it a record is dropped, counted
  (:attr:`Audit.dropped`) and said, once per burst, with the count when the queue
  drains (never lost silently); :meth:`Audit.flush` writes what waits at the
  gateway's stop.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..core.names import SYSLOG_IDENTIFIER
from ..host.journallog import stderr_is_journal
from .figures import Figures

log = logging.getLogger("lokid.gateway")

IDENTIFIER = SYSLOG_IDENTIFIER + "-gateway"
BATCH = 64            # records written in one turn of the event loop
MAX_QUEUED = 8192     # records waiting to be written; past it, dropped and counted


@dataclass(frozen=True)
class Record:
    """What is said of one request at its answer's end."""
    key: str
    preset: str
    route: str
    status: int
    figures: Figures
    wait_ms: float
    ttfb_ms: float | None     # None: no answer's head went out
    duration_ms: float
    where: str
    hop: bool

    def fields(self) -> dict[str, str]:
        f = self.figures
        counts = (str(f.prompt_tokens), str(f.cached_tokens), str(f.generated_tokens)) \
            if f.known else ("", "", "")
        return {"LOKID_KEY": self.key, "LOKID_PRESET": self.preset, "LOKID_ROUTE": self.route,
                "LOKID_STATUS": str(self.status), "LOKID_PROMPT_TOKENS": counts[0],
                "LOKID_CACHED_TOKENS": counts[1], "LOKID_GENERATED_TOKENS": counts[2],
                "LOKID_WAIT_MS": f"{self.wait_ms:.0f}",
                "LOKID_TTFB_MS": "" if self.ttfb_ms is None else f"{self.ttfb_ms:.0f}",
                "LOKID_DURATION_MS": f"{self.duration_ms:.0f}", "LOKID_WHERE": self.where,
                "LOKID_HOP": "1" if self.hop else "0"}

    def message(self) -> str:
        f = self.figures
        tokens = f"{f.prompt_tokens}+{f.generated_tokens} tokens" if f.known else \
            "no figures"
        hop = ", from a peer" if self.hop else ""
        return (f"{self.key} {self.route} {self.preset or '-'} {self.status} ({tokens}, "
                f"{self.duration_ms:.0f} ms, {self.where}{hop})")


def journal_sender() -> Callable[..., Any] | None:
    """systemd-python's ``journal.send`` when stderr is the journal; else None."""
    if not stderr_is_journal():
        return None
    try:
        from systemd import journal
    except ImportError:
        return None
    return journal.send   # type: ignore[no-any-return]


class Audit:
    """Writes each :class:`Record`; ``send``: ``journal.send`` or None (a debug line)."""

    def __init__(self, send: Callable[..., Any] | None = None):
        self.send = send
        self.failed = False
        self.queued: deque[Record] = deque()
        self.scheduled = False   # a write of the queue is due in the event loop
        self.dropped = 0         # records dropped with the queue full, since the start
        self.said_dropped = 0    # dropped when the last drop was said

    def post(self, record: Record) -> None:
        """``record``, written by the event loop once the request's answer went out (now
        where no loop runs); dropped and counted past :data:`MAX_QUEUED`."""
        if len(self.queued) >= MAX_QUEUED:
            self.dropped += 1
            if self.said_dropped == 0 or self.dropped - self.said_dropped > MAX_QUEUED:
                log.warning("audit: %d records wait to be written: new ones are dropped "
                            "(counted) until they are", MAX_QUEUED)
                self.said_dropped = self.dropped
            return
        self.queued.append(record)
        if not self.scheduled:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                self.flush()
                return
            loop.call_soon(self._drain)
            self.scheduled = True

    def _drain(self) -> None:
        self.scheduled = False
        for _ in range(min(BATCH, len(self.queued))):
            self.write(self.queued.popleft())
        if self.queued:   # the rest at the next turn: the loop's other work between
            asyncio.get_running_loop().call_soon(self._drain)
            self.scheduled = True
        elif self.said_dropped:
            log.warning("audit: %d records were dropped in all, the queue being full",
                        self.dropped)
            self.said_dropped = 0

    def flush(self) -> None:
        """Every queued record written now (the gateway's stop)."""
        while self.queued:
            self.write(self.queued.popleft())

    @property
    def quiet(self) -> bool:
        """Whether a record would go nowhere (not built then)."""
        return self.send is None and not log.isEnabledFor(logging.DEBUG)

    def write(self, record: Record) -> None:
        if self.send is None:
            if log.isEnabledFor(logging.DEBUG):
                log.debug("audit: %s", record.message())
            return
        try:
            # CODE_FILE and CODE_FUNC given: journal.send otherwise reads the stack
            # (traceback.extract_stack), two thirds of its cost
            self.send(record.message(), CODE_FILE=__file__, CODE_FUNC="Audit.write",
                      SYSLOG_IDENTIFIER=IDENTIFIER, PRIORITY=6, **record.fields())
        except OSError as e:
            if not self.failed:
                log.warning("the audit record could not be written to the journal (%s): "
                            "records are lost until it takes them again", e)
                self.failed = True
            return
        self.failed = False
