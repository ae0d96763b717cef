"""A child's output pipe read by the event loop in batches of lines.

The local runner reads its engines' output itself (under systemd, journald does).
An engine serving 50 requests a second writes a few lines per request in as many
writes; waking the daemon for each, through asyncio's stream machinery, cost it
more CPU than all it does with the lines. So :class:`PipeLines` watches the
pipe's fd with a plain reader callback and reads at most once every
:data:`COALESCE` seconds: what comes within that time after a read waits for the
next one, with the rest of its burst (one wake-up and one batch of lines, to
``on_lines``, per burst, at most ``1 / COALESCE`` a second however fast the engine
writes). What comes after a quiet spell is read at once: the line that says a
request ended moves the engine's count of requests in flight, which a GPU group's
swap waits for (20 ms of each swap, issue 31). A line longer than ``limit`` bytes
is dropped whole; nothing beyond it is ever held.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable

COALESCE = 0.02          # seconds a burst may take to arrive whole (Stats are ≤ 1/s anyway)
READ_CHUNK = 1 << 16


class PipeLines:
    """Reads ``fd`` (the parent's end of the pipe, owned from now on) until every writer
    has closed it; ``on_lines`` gets each batch of complete lines (without their "\\n"),
    the last unterminated one at the end. ``done`` ends then (or when :meth:`close`d)."""

    def __init__(self, fd: int, on_lines: Callable[[list[bytes]], None], limit: int,
                 coalesce: float = COALESCE) -> None:
        self.loop = asyncio.get_running_loop()
        self.fd = fd
        self.on_lines = on_lines
        self.limit = limit
        self.coalesce = coalesce
        self.rest = b""
        self.skipping = False  # inside a line over the limit
        self.timer: asyncio.TimerHandle | None = None
        self.read_at = float("-inf")   # the last read (the loop's clock)
        self.done: asyncio.Future[None] = self.loop.create_future()
        os.set_blocking(fd, False)
        self.loop.add_reader(fd, self._readable)

    def _readable(self) -> None:
        self.loop.remove_reader(self.fd)
        wait = self.read_at + self.coalesce - self.loop.time()
        if wait <= 0:   # after a quiet spell: at once
            self._read()
        else:
            self.timer = self.loop.call_later(wait, self._read)

    def _read(self, to_the_end: bool = False) -> None:
        self.timer = None
        self.read_at = self.loop.time()
        eof = False
        while True:
            try:
                data = os.read(self.fd, READ_CHUNK)
            except BlockingIOError:
                break
            except OSError:  # EIO and the like: as the end of the output
                eof = True
                break
            if not data:
                eof = True
                break
            self._feed(data)
            if len(data) < READ_CHUNK and not to_the_end:
                break  # drained (a burst bigger than the pipe: the reader fires again)
        if eof:
            if self.rest and not self.skipping:
                self.on_lines([self.rest])
            self.close()
        else:
            self.loop.add_reader(self.fd, self._readable)

    def read_now(self) -> None:
        """Read what is there now, without the burst's wait: the child exited, and its
        output's end is at hand (a stop is over once it is read, not 20 ms later)."""
        if self.fd < 0:
            return
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        else:
            self.loop.remove_reader(self.fd)
        self._read(to_the_end=True)   # until EOF, or until nothing more is there yet

    def _feed(self, data: bytes) -> None:
        *lines, self.rest = (self.rest + data).split(b"\n") if self.rest else data.split(b"\n")
        if self.skipping and lines:
            self.skipping = False
            lines = lines[1:]
        if lines:
            self.on_lines(lines)
        if len(self.rest) > self.limit:
            self.rest, self.skipping = b"", True

    def close(self) -> None:
        """Stop reading and close the fd (idempotent); ``done`` ends."""
        if self.fd < 0:
            return
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.loop.remove_reader(self.fd)
        os.close(self.fd)
        self.fd = -1
        if not self.done.done():
            self.done.set_result(None)
