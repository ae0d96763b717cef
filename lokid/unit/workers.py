"""Before an engine split with RPC workers starts (issue 30, item 2): every worker its
command line names (``--rpc``, from the preset's ``rpc``) must answer now, or the start
is refused naming each one that does not and why (:mod:`lokid.host.rpcprobe`), with
:data:`EXIT_WORKERS`, which the unit restarts (``Restart=on-failure``, the crash-loop
rule bounding it): a worker host that reboots is waited for, never blamed on the
preset. The check runs before the attempt token is settled, so a worker down never
counts against an automatic launch's configuration.
"""

from __future__ import annotations

from ..core.errors import WorkersDown

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing on a start's path
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

__all__ = ["EXIT_WORKERS", "WorkersDown", "check_workers", "workers_after_exit"]

EXIT_WORKERS = 75   # EX_TEMPFAIL: a worker down; not in RestartPreventExitStatus=


def check_workers(rpc: Sequence[str], argv: Sequence[str]) -> None:
    """WorkersDown naming each worker that does not answer, of the preset's ``rpc`` and
    of ``argv``'s --rpc (a plan's command line, or the preset's extra_args)."""
    if not rpc and not names_workers(argv):
        return   # the common case, on every start's path: nothing of the RPC code imported
    from ..core.fleet.rpc import rpc_args, workers_of, workers_problem

    workers = workers_of([*rpc_args(rpc), *argv])
    if not workers:
        return
    from ..host.rpcprobe import probe_all

    problem = workers_problem(probe_all(workers))
    if problem:
        raise WorkersDown(f"cannot start: {problem}")


def workers_after_exit(name: str, argv: Sequence[str], rc: int, notifier: Any) -> int:
    """An engine with RPC workers that exited with a failure (``rc``): the workers that do
    not answer now named in its STATUS= and the journal (llama.cpp aborts when a worker's
    connection drops, and its own line names no worker); ``rc`` returned as it is, so
    systemd's restart logic and the crash-loop rule apply."""
    from ..core.launch.crashloop import EXIT_CONFIG

    if rc in (0, EXIT_CONFIG) or not names_workers(argv):
        return rc
    from ..core.fleet.rpc import workers_of, workers_problem

    workers = workers_of(argv)
    if not workers:
        return rc
    from ..host.journallog import journal_log
    from ..host.rpcprobe import probe_all

    problem = workers_problem([v for v in probe_all(workers) if not v.busy])
    if problem:
        said = f"the engine exited with status {rc}: {problem}"
        notifier.send(f"STATUS={said}")
        journal_log(name, said, priority=3)
    return rc


def names_workers(argv: Sequence[str]) -> bool:
    """Whether ``argv`` may name RPC workers: ``--rpc`` or ``--rpc=…`` in it (what
    :func:`lokid.core.fleet.rpc.workers_of` reads)."""
    return any(a == "--rpc" or a.startswith("--rpc=") for a in argv)
