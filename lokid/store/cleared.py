"""What the state DB could not record: a cleared attempt token, noted in the runtime
directory.

A token whose launch answered, or was stopped while loading, but that the database
could not clear then (the disk filled while the engine loaded) is noted as
``$LOKI_RUNTIME_DIR/<preset>.cleared`` instead (a tmpfs, another file system).
:meth:`lokid.store.state.StateDB.peek`, given that note, counts the token as cleared,
and the next settle that succeeds forgets the note. A token is told apart from a later
one of the same mark by when it was set, so a note that outlived its token never excuses
another launch.
"""

from __future__ import annotations

import os

from ..core.record import record

CLEARED_SUFFIX = ".cleared"   # $LOKI_RUNTIME_DIR/<preset>.cleared


@record
class Token:
    """An attempt token: the mark it was set for, and when (which tells it from a later
    token of the same mark)."""

    mark: str
    since: float


def _cleared_path(runtime_dir: str, preset: str) -> str:
    return os.path.join(runtime_dir, preset + CLEARED_SUFFIX)


def note_cleared(runtime_dir: str, preset: str, token: Token) -> str:
    """Note that ``token`` counts as cleared (its launch answered, or was stopped while
    loading) although the state DB could not clear it; return the note's path.

    Written atomically; OSError when the runtime directory cannot be written either.
    """
    import json

    path = _cleared_path(runtime_dir, preset)
    os.makedirs(runtime_dir, exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"mark": token.mark, "since": token.since}, f)
    os.replace(tmp, path)
    return path


def read_cleared(runtime_dir: str, preset: str) -> Token | None:
    """The token noted by :func:`note_cleared`; None when there is none (a missing or
    damaged note is none: the token then counts as never answered, the safe side)."""
    try:
        with open(_cleared_path(runtime_dir, preset), encoding="utf-8") as f:
            import json  # here: a start without a note never needs it

            data = json.load(f)
        return Token(str(data["mark"]), float(data["since"]))
    except (OSError, ValueError, TypeError, KeyError):
        return None


def forget_cleared(runtime_dir: str, preset: str) -> None:
    """Remove the note (OSError when it cannot be)."""
    try:
        os.unlink(_cleared_path(runtime_dir, preset))
    except FileNotFoundError:
        pass
