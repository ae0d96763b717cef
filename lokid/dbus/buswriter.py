"""The daemon's writes to the bus: a full socket buffer is a wait, never the end of the bus.

dbus-fast's asyncio writer (``_MessageWriter.write_callback``, the same code in
Debian 12's 1.84.2, Debian 13's 2.44.1 and PyPI's 5.2.0) sends on a non-blocking
socket and takes any exception as fatal. When the bus daemon reads slower than
lokid writes (a stalled or busy dbus-daemon while a reload sends one
PropertiesChanged per preset: 200 presets and a 2 s stall were enough), the
socket's buffer fills and ``send`` raises ``BlockingIOError`` (EAGAIN) with nothing
sent. dbus-fast then closes the connection: lokid lost ``org.lokid.Lokid1`` and lived
on without it (issue 28, item 14). The rules here:

- EAGAIN (and EINTR) means "nothing sent yet": the writer waits for the socket to be
  writable, as it already did after a partial write, and goes on where it stopped.
- Messages leave in the order they were sent. 1.84.2 took the *newest* queued
  message first (``deque.pop()``), which only showed once messages queued up: what
  the fix above makes common under a slow bus (a property's old value arriving after
  its new one).
- What waits is bounded (:data:`MAX_QUEUED` bytes): a bus that takes nothing for so
  long is lost. The writer says so (``on_lost``) and shuts the connection down, which
  the daemon turns into its exit (:mod:`lokid.dbus.serving`), rather than growing
  without end.

Anything else a send raises stays fatal, as in dbus-fast. The writer is dbus-fast's
own class with ``write_callback`` and ``buffer_message`` replaced (both private, and
unchanged in shape from 1.84 to 5.2; tests/dbus/test_bus_loss.py runs the real
thing against a stalled real dbus-daemon). The report for dbus-fast's maintainers is
in issue 28's closing note.
"""

from __future__ import annotations

import array
import asyncio
import socket
from collections.abc import Callable
from typing import Any

from dbus_fast import Message
from dbus_fast.aio.message_bus import _MessageWriter

# What may wait for a bus that reads nothing: far above a reload's burst (one
# PropertiesChanged per preset, ~2 KB each: 0.4 MB for 200 presets), far below what
# would matter to the host. dbus-daemon's own queue of a connection's unread
# messages (max_incoming_bytes) is 127 MiB on the system bus; it is not what fills here.
MAX_QUEUED = 32 * 1024 * 1024


def _done(fut: asyncio.Future[Any] | None, error: BaseException | None = None) -> None:
    if fut is not None and not fut.done():
        if error is None:
            fut.set_result(None)
        else:
            fut.set_exception(error)
            # A send's future is dropped by its caller (every signal's is): asyncio
            # would log the error at collection as "Future exception was never
            # retrieved", traceback and all. The loss is SafeMessageBus.lost's to say.
            fut.exception()


class PatientWriter(_MessageWriter):
    """dbus-fast's writer, waiting out a full socket buffer (see the module's rules).

    Installed on an existing writer by :func:`adopt`: dbus-fast 1.84 and 2.44 make it
    when the bus is made, 5.x when it connects.
    """

    queued: int   # bytes waiting, the message being written included
    on_lost: Callable[[str], None]
    given_up: bool

    def buffer_message(self, msg: Message, future: asyncio.Future[Any] | None = None) -> None:
        super().buffer_message(msg, future)
        self.queued += len(self.messages[-1][0])
        if self.queued > MAX_QUEUED and not self.given_up:
            # Not dbus-fast's own ending (_finalize) from here: schedule_write goes on
            # to write after this returns. A shutdown ends the connection through its
            # reader, as a disconnect() does.
            self.given_up = True
            self.on_lost(f"the bus took nothing while {self.queued // 1024} KiB of "
                         "messages waited for it")
            self.bus.disconnect()

    def write_callback(self, remove_writer: bool = True) -> None:
        sock = self.sock
        assert sock is not None and self.fd is not None   # made for a connected socket
        try:
            while True:
                if self.buf is None:
                    if not self.messages:
                        if remove_writer:
                            self.loop.remove_writer(self.fd)
                        return
                    buf, unix_fds, fut = self.messages.popleft()   # oldest first
                    self.unix_fds = unix_fds
                    self.buf = memoryview(buf)
                    self.offset = 0
                    self.fut = fut
                rest = self.buf[self.offset:]
                try:
                    if self.unix_fds and self.negotiate_unix_fd:
                        sent = sock.sendmsg([rest], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                                      array.array("i", self.unix_fds))])
                        self.unix_fds = None   # sent with the first byte that went
                    else:
                        sent = sock.send(rest)
                except (BlockingIOError, InterruptedError):
                    # Nothing sent: the writer stays registered (schedule_write adds
                    # it while a buffer is pending), and the loop calls again once
                    # the socket is writable.
                    return
                self.offset += sent
                self.queued -= sent
                if self.offset < len(self.buf):
                    return   # a partial write: wait for writable
                self.buf = None
                _done(self.fut)
        except Exception as e:   # as dbus-fast ends a connection whose write failed
            # Nothing is left to write: schedule_write, back from this call, would
            # otherwise register the closed socket's writer and raise EBADF into the
            # sender. What waited fails with the write's error, not for ever.
            error = None if self.bus._user_disconnect else e
            waiting = [self.fut, *(m[2] for m in self.messages)]
            self.buf = None
            self.messages.clear()
            self.queued = 0
            for fut in waiting:
                _done(fut, error)
            self.bus._finalize(e)


def adopt(writer: _MessageWriter | None, on_lost: Callable[[str], None]) -> None:
    """Make dbus-fast's ``writer`` (if there is one yet) a :class:`PatientWriter`,
    keeping whatever it has queued; ``on_lost`` hears why it gave the bus up."""
    if writer is None or isinstance(writer, PatientWriter):
        return
    writer.__class__ = PatientWriter
    assert isinstance(writer, PatientWriter)
    writer.on_lost = on_lost
    writer.given_up = False
    writer.queued = sum(len(m[0]) for m in writer.messages) + (
        len(writer.buf) - writer.offset if writer.buf is not None else 0)
