"""Tasks the daemon starts and does not wait for: tracked, logged, cancelled at the end.

A signal from systemd or the bus often asks for work that takes its own round
trips (read a unit's properties again, plan a preset again). Such work runs as
a task of its own. :class:`Background` keeps each one until it ends, so that:

- an exception it raises is logged as one line with what the task was doing,
  never as asyncio's "Task exception was never retrieved" traceback;
- when the daemon stops, the tasks still running are cancelled and awaited
  *before* the bus is closed, so that none of them writes to a closed socket.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any


class Background:
    def __init__(self, log: logging.Logger):
        self.log = log
        self.tasks: dict[asyncio.Task[Any], str] = {}
        self.closing = False

    def spawn(self, coro: Coroutine[Any, Any, Any], what: str) -> asyncio.Task[Any] | None:
        """Run ``coro`` as a task; ``what`` names it in the log if it fails."""
        if self.closing:
            coro.close()
            return None
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks[task] = what
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[Any]) -> None:
        what = self.tasks.pop(task, "a background task")
        if task.cancelled():
            return
        e = task.exception()
        if e is not None and not self.closing:
            self.log.warning("%s failed: %s: %s", what, type(e).__name__, e)

    async def close(self) -> None:
        """Cancel what still runs and wait for it to end (its errors are not logged)."""
        self.closing = True
        tasks = list(self.tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
