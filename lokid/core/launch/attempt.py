"""Attempt marks and verdicts: the pure half of the attempt token (see :mod:`lokid.store.state`).

A *mark* names one combination of preset configuration and engine binary;
:func:`verdict` says whether automatic speculation may be tried for it, given
the token left by the last launch and the marks recorded as failed.
"""

from __future__ import annotations

from ..record import record

NEVER_ANSWERED = "the last automatic launch with this configuration never answered"
LOADING_NOW = ("an automatic launch of this configuration is loading now: if it never "
               "answers, the next start runs without automatic speculation")


@record
class Mark:
    """One combination of preset configuration and engine binary."""

    fingerprint: str
    engine: str
    build: int

    def key(self) -> str:
        return f"{self.fingerprint}|{self.engine}|{self.build}"


@record
class Verdict:
    """Why automatic speculation is cut for a mark ("" = allowed), and whether
    settling must record that as a new failure."""

    why: str = ""
    record: bool = False
    pending: str = ""    # allowed, but the token's launch is still loading: what that means


def verdict(mark: str, attempt: str | None, failed: dict[str, str],
            loading: bool = False) -> Verdict:
    """Pure: the verdict for ``mark`` given the current token and the failed marks.

    ``loading``: an engine of this preset runs now and has not answered yet, so a
    token of ``mark`` is its own, not a launch that never answered (a read-only
    look: the next start would find the port taken before it settles anything).
    """
    if mark in failed:
        return Verdict(failed[mark], False)
    if attempt == mark:
        if loading:
            return Verdict(pending=LOADING_NOW)
        return Verdict(NEVER_ANSWERED, True)
    return Verdict()
