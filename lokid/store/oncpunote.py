"""The daemon's word to a start whose GPU engine runs on the CPU: ``<runtime dir>/<preset>.oncpu``.

Only the unit's main process (``lokid engine``) may send STATUS= (``NotifyAccess=main``),
and it never sees the engine's lines: they go straight to the journal, which the unit's
user cannot read. The daemon reads them and finds a start on the CPU
(:mod:`lokid.dbus.oncpu`); it leaves this note, and the engine step, which looks for it
once a second while its engine serves (:mod:`lokid.unit.oncpu`), says it in the unit's
STATUS= or, where the preset says ``cpu_fallback = "fail"``, ends the start failed with
the reason as its status (issue 44, item 3). The rules, each for the failure it prevents:

- A note names its start (systemd's ``INVOCATION_ID``) and is read only by that start: a
  note left by an earlier start (its engine died before it read it) would otherwise call
  the next start, on a GPU this time, a CPU start, or fail it.
- A note is taken (read, then removed) once: the daemon, finding it still there a while
  later, knows the engine step did not act on it (one of a release before notes) and
  stops that start itself.
- A note is bounded: at most :data:`MAX_BYTES` are read, the reason is cut to
  :data:`MAX_REASON` characters and its control characters become spaces, whatever wrote
  the file (the engine runs as the same user as its step). A newline in a STATUS= line
  would be a second notification (``READY=1``, ``MAINPID=``) in systemd's eyes.
- Reading never raises: a missing, damaged or foreign note is no note (None), so that a
  serving engine is never stopped, nor its step killed by a traceback, for a file.
- Written atomically, and given to the runtime directory's owner where the daemon writes
  as root (as the plans it keeps ahead): the engine step runs as the unit's user, and
  must be able to remove it.

Text, not JSON: four lines, each ended by a newline (the format's name, the invocation,
``run`` or ``fail``, the reason), read without importing anything, in a step that reads
it once a second.
"""

from __future__ import annotations

import os

SUFFIX = ".oncpu"       # $LOKI_RUNTIME_DIR/<preset>.oncpu
MAGIC = "lokid-oncpu 1"
RUN, FAIL = "run", "fail"   # the preset's cpu_fallback
MAX_REASON = 300        # characters of the reason kept (enginelog's texts are shorter)
MAX_BYTES = 2048        # read of a note at most: one that is longer is damaged


class Note:
    """The daemon found the start ``invocation`` on the CPU, for ``reason``; ``fail``:
    the preset says ``cpu_fallback = "fail"``."""

    __slots__ = ("invocation", "fail", "reason")

    def __init__(self, invocation: str, fail: bool, reason: str):
        self.invocation = invocation
        self.fail = fail
        self.reason = reason

    def __repr__(self) -> str:
        return f"Note({self.invocation!r}, fail={self.fail}, {self.reason!r})"


def note_path(runtime_dir: str, preset: str) -> str:
    return os.path.join(runtime_dir, preset + SUFFIX)


def clean(reason: str) -> str:
    """One line of at most :data:`MAX_REASON` characters: control characters become
    spaces (a newline would end the STATUS= line), the rest is cut with "…"."""
    text = "".join(" " if ord(c) < 32 or ord(c) == 127 else c for c in reason[:MAX_REASON + 1])
    text = " ".join(text.split())
    return text if len(text) <= MAX_REASON else text[:MAX_REASON - 1] + "…"


def write_note(runtime_dir: str, preset: str, note: Note,
               owner: tuple[int, int] | None = None) -> None:
    """Leave ``note`` for its start (atomic; ``owner``: (uid, gid) to give the file, the
    daemon writing as root). An invocation that is not one word is refused (ValueError):
    it could never match. OSError to the caller."""
    if not note.invocation or note.invocation != "".join(note.invocation.split()):
        raise ValueError(f"not an invocation id: {note.invocation!r}")
    path = note_path(runtime_dir, preset)
    tmp = f"{path}.{os.getpid()}.tmp"
    text = f"{MAGIC}\n{note.invocation}\n{FAIL if note.fail else RUN}\n{clean(note.reason)}\n"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            if owner is not None:
                os.fchown(f.fileno(), *owner)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def read_note(runtime_dir: str, preset: str, invocation: str) -> Note | None:
    """The note left for the start ``invocation``; None when there is none, when it is
    another start's, damaged, or cannot be read. Never raises."""
    if not invocation:
        return None   # a start without an id (lokid run) is never told anything
    try:
        fd = os.open(note_path(runtime_dir, preset),
                     os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        try:
            data = os.read(fd, MAX_BYTES + 1)
        finally:
            os.close(fd)
    except OSError:
        return None
    if len(data) > MAX_BYTES:
        return None
    lines = data.decode("utf-8", "replace").split("\n")
    if len(lines) != 5 or lines[4] or lines[0] != MAGIC or lines[1] != invocation or \
            lines[2] not in (RUN, FAIL):
        return None
    return Note(invocation, lines[2] == FAIL, clean(lines[3]) or "no reason given")


def take_note(runtime_dir: str, preset: str, invocation: str) -> Note | None:
    """:func:`read_note`, and the note removed when it is this start's (a note of another
    start stays: the daemon may be writing this start's over it). Never raises."""
    note = read_note(runtime_dir, preset, invocation)
    if note is not None:
        drop_note(runtime_dir, preset)
    return note


def drop_note(runtime_dir: str, preset: str) -> None:
    try:
        os.unlink(note_path(runtime_dir, preset))
    except OSError:
        pass
