"""Waiting for processes that are not one's children to be gone (a GPU group's swap).

A start held by :mod:`lokid.store.holds` waits for the processes of the engines being
stopped. They are not its children (another unit's, or the daemon's), so ``waitpid`` is
not for them: each is watched by a pidfd (Linux 5.3), readable as soon as the process
has exited, reaped or not (a zombie holds no memory any more). Where a pidfd cannot be
had, ``/proc/<pid>/stat`` says whether it still runs, asked every :data:`POLL` seconds.
"""

from __future__ import annotations

import os
import time

POLL = 0.002   # seconds between two looks at /proc, without pidfds


def _running(pid: int) -> bool:
    """The process runs (a zombie does not: it has exited, only its status is left)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2:][:1] not in (b"Z", b"X")


def wait_gone(pids: tuple[int, ...] | list[int], until: float) -> list[int]:
    """Wait until every process of ``pids`` has exited, or until ``until``
    (``time.monotonic()``); the ones still running then (empty: all gone)."""
    import select

    fds: dict[int, int] = {}
    left: set[int] = set()
    try:
        for pid in pids:
            try:
                fds[os.pidfd_open(pid)] = pid
            except ProcessLookupError:
                continue   # gone already
            except (AttributeError, OSError):
                left.add(pid)   # no pidfd here: its /proc entry is watched instead
        poller = select.poll()
        for fd in fds:
            poller.register(fd, select.POLLIN)
        watched = dict(fds)
        while watched or left:
            left = {pid for pid in left if _running(pid)}
            now = time.monotonic()
            if now >= until or not (watched or left):
                break
            wait = until - now if not left else min(POLL, until - now)
            for fd, _ in poller.poll(max(1, int(wait * 1000)) if wait > 0 else 0):
                poller.unregister(fd)
                watched.pop(fd, None)
        return sorted({*watched.values(), *left})
    finally:
        for fd in fds:
            os.close(fd)
