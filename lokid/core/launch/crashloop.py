"""The crash-loop rule: when automatic restarts of an engine stop.

systemd's own start limit (``StartLimitBurst=``) counts every start, the
operator's included: tuning a preset with a few ``systemctl restart`` tripped
it and left the unit failed. So the unit has none, and lokid counts only what
is a failure: an engine that exited, was killed, hung (watchdog) or did not
load in time. An operator's stop is no failure, and a start by hand (not one
of systemd's automatic restarts) forgets the failures before it.

Automatic restarts stop (the unit stays failed, and says why) after either

- :data:`BURST` failures within :data:`WINDOW` seconds, or
- :data:`BURST` failures in a row of starts that never became ready (a big
  model that takes minutes to fail would never reach the first rule).

Pure: the failures are given, with the time; :mod:`lokid.store.exits` keeps them.
"""

from __future__ import annotations

from ..record import record

BURST = 5
WINDOW = 600.0
KEEP = 2 * BURST          # failures remembered per preset, oldest dropped first

# The unit's exit statuses that mean "do not restart" (its RestartPreventExitStatus=),
# with the names systemd shows for them (sysexits.h).
EXIT_CONFIG = 78          # the preset cannot be started as it is: planning failed, port busy
EXIT_CRASH_LOOP = 69      # this rule stopped the restarts ("UNAVAILABLE")
NO_RESTART = (EXIT_CONFIG, EXIT_CRASH_LOOP)


@record
class Failure:
    """One start that ended badly."""

    at: float        # seconds since the epoch
    ready: bool      # whether that start's engine had answered /health
    why: str         # one line: what systemd or the runner saw


def recent(failures: list[Failure], now: float) -> list[Failure]:
    """The failures still inside the window, oldest first."""
    return [f for f in failures if now - f.at <= WINDOW]


def never_ready_streak(failures: list[Failure]) -> int:
    """How many of the last failures, in a row, never became ready."""
    count = 0
    for f in reversed(failures):
        if f.ready:
            break
        count += 1
    return count


def stop_reason(failures: list[Failure], now: float) -> str:
    """Why automatic restarts must stop now, or "" while they may go on."""
    if not failures:
        return ""
    last = failures[-1].why
    inside = recent(failures, now)
    if len(inside) >= BURST:
        return (f"{len(inside)} failures in {WINDOW / 60:.0f} min (the last: {last}): "
                "not restarted again")
    streak = never_ready_streak(failures)
    if streak >= BURST:
        return (f"{streak} starts in a row never became ready (the last: {last}): "
                "not restarted again")
    return ""


def progress(failures: list[Failure], now: float) -> str:
    """Where a restart stands against the rule, for its STATUS= line ("" if no failure)."""
    inside = len(recent(failures, now))
    streak = never_ready_streak(failures)
    if not inside and not streak:
        return ""
    return (f"restart after a failure ({max(inside, streak)} of {BURST} before lokid stops "
            f"restarting; the last: {failures[-1].why})")


def exit_reason(result: str, code: str, status: str, *, ready: bool) -> str:
    """One line for a start systemd ended with ``$SERVICE_RESULT``/``$EXIT_CODE``/
    ``$EXIT_STATUS`` (as ExecStopPost= sees them); "" when it is no failure.

    ``success`` is a clean stop: the operator's, or the system's (shutdown, apt remove).
    A start lokid refused on purpose (:data:`NO_RESTART`) is not an engine failure.
    """
    if result in ("", "success"):
        return ""
    if code == "exited" and status.isdigit() and int(status) in NO_RESTART:
        return ""
    stage = "after it was ready" if ready else "while loading"
    if result == "watchdog":
        return f"the engine stopped answering /health {stage} (watchdog)"
    if result == "timeout":
        return "the engine did not load within the start timeout" if not ready else \
            "the engine did not stop in time"
    if code == "exited":
        return f"the engine helper exited with status {status} {stage}"
    if code in ("killed", "dumped"):
        return f"the engine was killed by signal {status} {stage}" + \
            (" (core dumped)" if code == "dumped" else "")
    return f"{result} {stage}"


def unrecorded_reason(ready: bool) -> str:
    """One line for a start whose ExecStopPost= step never said how it ended, read by the
    next automatic restart's planning step (systemd restarts only a start that failed).

    systemd 257 (Debian 13) kills the unit's cgroup with the kernel's ``cgroup.kill`` on
    ``systemctl kill -s KILL`` (the default ``--kill-whom=all``), and the stop step it
    then spawns into that cgroup dies by SIGKILL before its first line (seen on Linux
    6.18: a child cloned into a cgroup after its ``cgroup.kill`` dies, one moved in
    after its fork does not; systemd 252 runs the step). Without this line such kills
    never counted, and the crash-loop rule never stopped their restarts.
    """
    stage = "after it was ready" if ready else "while loading"
    return (f"the engine was killed {stage}, its stop step with it (the unit's cgroup "
            "killed, as `systemctl kill -s KILL` does)")


def crashloop_message(name: str, why: str) -> str:
    """The stopped unit's word: why, and how to try again."""
    from ..names import engine_unit

    return (f"{why}; `systemctl start {engine_unit(name)}` (or `lokictl start {name}`) "
            "tries again")
