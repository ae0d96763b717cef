"""The planning step (``lokid prestart``, ExecStartPre=) of a restart that nothing changed,
decided before anything heavy is imported.

A start under systemd of a preset whose last ready start kept its plan
(:mod:`lokid.store.plancache`), a plan *settled alone* (no speculation that an
attempt verdict could cut, no token to set, no GPUs to choose, no RPC worker to find:
:meth:`~lokid.core.launch.runtimeplan.RuntimePlan.settled_alone`), has one question for its
planning step: does that plan still stand? It does when nothing it came from changed
(its key: ``stat`` calls), no failure is on record (the crash-loop rule has nothing to
say), no token is noted as cleared, and the engine listens where it did (the socket
systemd may hold the port for). Such a start is handed over as ``kept``
(:mod:`lokid.store.handoff`): ``lokid engine`` takes the plan, checks that its port is
free and writes its runtime plan once the engine is spawned, as it does under the
daemon's local runner.

What this path imports is its reason to exist: lokid's small modules and CPython's
builtin ``_signal`` and SHA-256; not ``json``, nor the ``re``, ``enum`` and ``signal``
that come with it, which took ~10 ms of each restart's planning step under the unit's
sandbox (``benchmarks/deb_install.py``). Anything else (no kept plan, one of another
kind, a failure on record, a changed file, an invocation that is not systemd's hex)
takes the whole planning step (:func:`lokid.unit.steps.prestart_step`), which decides
as it always did.
"""

from __future__ import annotations

import os

from ..core.launch.portunit import marked_socket
from ..core.serve.replicas import split_instance
from ..host.journallog import journal_log
from ..store import handoff, plancache
from ..store.cleared import CLEARED_SUFFIX
from ..store.exits import FAILURES_SUFFIX, STARTED_SUFFIX, begin_start

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing; mypy knows the name
if TYPE_CHECKING:
    from collections.abc import Mapping


class _Stopped(BaseException):
    """SIGTERM or SIGINT while deciding: systemd stops or restarts the unit."""


def _on_term(_signum: int, _frame: object) -> None:
    raise _Stopped


def kept_start(runtime_dir: str, name: str, environ: Mapping[str, str]) -> bool:
    """Hand this start over as ``kept`` when its kept plan stands, and say so (True;
    also for a stop that landed while deciding, which ends the step cleanly); False:
    the whole planning step must run. SIGTERM's and SIGINT's handlers are put back as
    they were either way: a stop after this returns is the caller's."""
    import _signal  # type: ignore[import-not-found]  # signal's C half (signal imports enum)

    invocation = environ.get("INVOCATION_ID", "")
    if not handoff.plain_invocation(invocation) or split_instance(name) is None:
        return False
    handlers = [(s, _signal.signal(s, _on_term)) for s in (_signal.SIGTERM, _signal.SIGINT)]
    try:
        if _stands(runtime_dir, name, environ):
            begin_start(runtime_dir, name, invocation)   # none noted before it: _stands
            handoff.write_kept(runtime_dir, name, invocation)
            return True
    except _Stopped:
        journal_log(name, "stopped while planning: a clean stop")
        return True
    except OSError:
        pass   # the runtime directory: the whole step says what is wrong
    finally:
        for signum, handler in handlers:
            _signal.signal(signum, handler)
    return False


def _stands(runtime_dir: str, name: str, environ: Mapping[str, str]) -> bool:
    """Whether ``name``'s kept plan can run as it is, with nothing to decide."""
    # STARTED_SUFFIX: the start before this one ended without its stop step, a failure
    # the whole step records (lokid.store.exits.begin_start) before the crash-loop rule
    for suffix in (FAILURES_SUFFIX, CLEARED_SUFFIX, STARTED_SUFFIX):
        if os.path.lexists(os.path.join(runtime_dir, name + suffix)):
            return False
    record = plancache.kept(runtime_dir, name)
    return (record is not None and record.settled_alone
            and record.socket == marked_socket(name, environ)
            and plancache.unchanged(record, name, environ))
