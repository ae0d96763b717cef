"""Clearing a launch's attempt token: the engine step at READY, the stop step for a stop
while loading. Where the state DB cannot clear it, the token is noted in the runtime
directory instead (:mod:`lokid.store.cleared`), so the next start counts it as cleared
all the same.
"""

from __future__ import annotations

from ..host.journallog import journal_log

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing; mypy knows the name
if TYPE_CHECKING:
    from ..core.launch.attempt import Mark
    from ..store.cleared import Token


def clear_token(state_dir: str, runtime_dir: str, name: str, mark: Mark,
                 token: Token | None, what: str) -> bool:
    """Clear this launch's attempt token (``what``: why it counts as cleared); when the
    state DB cannot, note the token in the runtime directory so that the next start
    counts it as cleared all the same. ``token``: the one this launch set, None to read
    it. Whether it was cleared or noted. Never raises: each failure is one journal line.
    """
    from ..core.errors import StateError
    from ..store.state import StateDB, StateReader, note_cleared

    try:
        with StateDB(state_dir) as db:
            return db.clear(name, mark)
    except StateError as e:
        failed = e
    if token is None:
        with StateReader(state_dir) as reader:
            token = reader.token(name)
        if token is not None and token.mark != mark.key():
            return False  # not this configuration's token: not ours to excuse
    if token is None:
        journal_log(name, f"{what}, but its attempt token was not cleared: {failed}; if it "
                    "is still there, the next start runs without automatic speculation",
                    priority=4)
        return False
    try:
        path = note_cleared(runtime_dir, name, token)
    except OSError as e:
        journal_log(name, f"{what}, but its attempt token was not cleared: {failed}, nor "
                    f"noted in {runtime_dir} ({e}); the next start runs without automatic "
                    "speculation", priority=4)
        return False
    journal_log(name, f"{what}, but its attempt token was not cleared: {failed}; noted in "
                f"{path}, the next start counts it as cleared", priority=4)
    return True
