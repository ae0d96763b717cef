"""A start's wait for the engines its GPU group is stopping, in its engine step.

The daemon starts a group's new member while the old one is still being stopped, and
leaves a note of the old one's processes (:mod:`lokid.store.holds`): the new start plans
meanwhile. Its engine step calls :func:`held` just before it spawns its engine: the
teardown and the start overlap up to the point where memory is needed, and no further.
"""

from __future__ import annotations

from ..host.journallog import journal_log

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ..host.notify import Notifier


def held(runtime_dir: str, name: str, notifier: Notifier) -> tuple[str, bool]:
    """The daemon's note that this start waits for engines being stopped (a GPU group's
    swap, :mod:`lokid.store.holds`), waited for just before the spawn: the line to log
    once the engine loads ("" when nothing was waited for), and True when they were
    still running at the note's time (said as STATUS= and in the journal: this start
    ends there, status 78, rather than load next to them)."""
    from ..store.holds import take_hold

    hold = take_hold(runtime_dir, name)
    if hold is None or not hold.pids:
        return "", False
    import time

    from ..host.gone import wait_gone

    since = time.monotonic()
    who = ", ".join(hold.names)
    left = wait_gone(hold.pids, since)   # a look: often they are gone already
    if left:
        notifier.send(f"STATUS=waiting for {who} to stop: one engine of its GPU group at a "
                      "time")
        left = wait_gone(left, hold.until)
    took = time.monotonic() - since
    if left:
        message = (f"{who} still running after this start waited {took:.0f} s for it to "
                   f"stop (pid {', '.join(map(str, left))}): not loading next to it, one "
                   "engine of a GPU group at a time; start it again once they are gone")
        notifier.send(f"STATUS={message}")
        journal_log(name, message, priority=3)
        return "", True
    return f"waited {took * 1000:.0f} ms for {who} to stop (its GPU group's swap)", False
