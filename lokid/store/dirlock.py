"""Waiting, a bounded time, for a directory's ``flock``: how lokid's writers of files an
operator may also edit (presets, :mod:`lokid.store.presetstore`; the gateway's keys,
:mod:`lokid.store.keystore`) take turns with each other and with a script holding
the same lock (``flock DIR …``).

Never a blocking ``flock``: a script that holds the lock for ever would hang the
daemon's worker, and a stopping daemon must be able to give up. The caller says what
the refusal says; this only answers whether the lock was taken.
"""

from __future__ import annotations

import fcntl
import time
from collections.abc import Callable


def flock_within(fd: int, seconds: float, pause: float,
                 give_up: Callable[[], bool] = lambda: False) -> bool:
    """Whether ``fd``'s exclusive flock was taken within ``seconds``, tried every
    ``pause`` seconds; False as well once ``give_up()`` says so."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() > deadline or give_up():
                return False
            time.sleep(pause)
