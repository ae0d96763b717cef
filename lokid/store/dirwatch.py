"""Tell the daemon when its configuration files change: inotify on the config directories.

The daemon watches ``$LOKI_CONFIG_DIR`` (``lokid.toml``) and its ``presets/``
directory, and reads the presets again shortly after a change (an editor
saves in several steps: :data:`SETTLE` seconds without a new event first).
inotify (Linux's, through libc; no extra package) wakes the event loop only
when something changed; where it is not available the directories' and
files' modification times are compared every :data:`POLL` seconds instead.

The daemon says when it reads the files (:meth:`DirWatch.reading`): a change it
has read already (its own write of a preset, which it reads again at once) is
not announced a second time.
"""

from __future__ import annotations

import asyncio
import logging
import os
import struct
from collections.abc import Callable

log = logging.getLogger("lokid.daemon")

SETTLE = 0.2
POLL = 1.0
# IN_MODIFY, IN_ATTRIB, IN_CLOSE_WRITE, IN_MOVED_FROM, IN_MOVED_TO, IN_CREATE, IN_DELETE,
# IN_DELETE_SELF, IN_MOVE_SELF
_MASK = 0x2 | 0x4 | 0x8 | 0x40 | 0x80 | 0x100 | 0x200 | 0x400 | 0x800
_IN_NONBLOCK = 0o4000
_IN_CLOEXEC = 0o2000000
_EVENT = struct.Struct("iIII")


class DirWatch:
    """Calls ``on_change`` (on the event loop) once the files under ``dirs`` settle."""

    def __init__(self, dirs: list[str], on_change: Callable[[], None]):
        self.dirs = dirs
        self.on_change = on_change
        self.fd = -1
        self.watched: set[str] = set()
        self.pending: asyncio.TimerHandle | None = None
        self.poller: asyncio.Task[None] | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.read: dict[str, tuple[int, int, int]] | None = None  # as the daemon last read
        self._libc: object = None

    def attach(self, loop: asyncio.AbstractEventLoop) -> str:
        """Start watching; says how (for the daemon's log)."""
        self.loop = loop
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            fd = int(libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC))
            if fd < 0:
                raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
            self._libc, self.fd = libc, fd
            self._add_watches()
            loop.add_reader(fd, self._on_readable)
            return "inotify"
        except (OSError, AttributeError) as e:
            log.info("no inotify (%s): polling the configuration every %.0f s", e, POLL)
            self.poller = loop.create_task(self._poll())
            return "polling"

    def detach(self) -> None:
        if self.pending is not None:
            self.pending.cancel()
        if self.poller is not None:
            self.poller.cancel()
        if self.fd >= 0 and self.loop is not None:
            self.loop.remove_reader(self.fd)
            os.close(self.fd)
            self.fd = -1

    def _add_watches(self) -> None:
        """Watch each directory that exists (a presets/ made later is added then)."""
        for d in self.dirs:
            if d in self.watched or not os.path.isdir(d):
                continue
            wd = self._libc.inotify_add_watch(self.fd, os.fsencode(d), _MASK)  # type: ignore[attr-defined]
            if wd >= 0:
                self.watched.add(d)

    def _on_readable(self) -> None:
        try:
            data = os.read(self.fd, 65536)
        except BlockingIOError:
            return
        # The events themselves do not matter: any change reads every preset again.
        offset = 0
        while offset + _EVENT.size <= len(data):
            _, mask, _, length = _EVENT.unpack_from(data, offset)
            offset += _EVENT.size + length
            if mask & (0x400 | 0x800 | 0x8000):  # a watched directory went (IN_IGNORED)
                self.watched.clear()
        self._add_watches()
        self._changed()

    def _changed(self) -> None:
        assert self.loop is not None
        if self.pending is not None:
            self.pending.cancel()
        self.pending = self.loop.call_later(SETTLE, self._fire)

    def reading(self) -> None:
        """The daemon reads the files now: what they are is known to it (any thread)."""
        self.read = self._snapshot()

    def _fire(self) -> None:
        self.pending = None
        if self.read is not None and self._snapshot() == self.read:
            return  # nothing the daemon has not read since
        self.on_change()

    def _snapshot(self) -> dict[str, tuple[int, int, int]]:
        seen = {}
        for d in self.dirs:
            try:
                names = [""] + sorted(os.listdir(d))
            except OSError:
                continue
            for name in names:
                try:
                    st = os.stat(os.path.join(d, name))
                except OSError:
                    continue
                seen[os.path.join(d, name)] = (st.st_mtime_ns, st.st_size, st.st_ino)
        return seen

    async def _poll(self) -> None:
        before = self._snapshot()
        while True:
            await asyncio.sleep(POLL)
            now = self._snapshot()
            if now != before:
                before = now
                self._changed()
