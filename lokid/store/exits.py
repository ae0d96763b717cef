"""How each start of a preset ended: the files behind the crash-loop rule.

``$LOKI_RUNTIME_DIR/<preset>.failures`` keeps the last failures (JSON, written
atomically; :mod:`lokid.core.launch.crashloop` judges them) and
``$LOKI_RUNTIME_DIR/<preset>.ready`` holds the ``INVOCATION_ID`` of the last
start whose engine answered. The runtime directory is a tmpfs: a reboot
forgets both, as it should.

Writers: ``lokid engine`` marks READY; ``lokid stopped`` (the unit's
ExecStopPost=) records a failure. Reader: ``lokid engine`` at its next
start. ``<preset>.started`` holds the start whose stop step has not ended yet
(:func:`begin_start`, :func:`end_start`): a stop step that systemd killed
(``systemctl kill -s KILL`` on systemd 257) is found, and its failure recorded, by
the next start's planning step. All run as the unit's user, one at a time per
preset (systemd runs a unit's commands in order), so no lock is needed.

Systemd's ``NRestarts`` property of the unit tells an automatic restart from
a start by hand (it counts the restarts since the last start by hand):
:func:`automatic_restarts` asks for it over the system bus, only when there is
a failure on record.
"""

from __future__ import annotations

import os

from ..core.launch.crashloop import KEEP, Failure

FAILURES_SUFFIX = ".failures"
READY_SUFFIX = ".ready"
# The INVOCATION_ID of the start whose stop step has not run yet (see begin_start).
STARTED_SUFFIX = ".started"


def _path(runtime_dir: str, preset: str, suffix: str) -> str:
    return os.path.join(runtime_dir, preset + suffix)


def read_failures(runtime_dir: str, preset: str) -> list[Failure]:
    """The failures on record, oldest first; a missing or damaged file is none."""
    try:
        with open(_path(runtime_dir, preset, FAILURES_SUFFIX), encoding="utf-8") as f:
            import json  # here: a start without failures on record never needs it

            rows = json.load(f)
        return [Failure(float(r["at"]), bool(r["ready"]), str(r["why"])) for r in rows]
    except (OSError, ValueError, TypeError, KeyError):
        return []


def _write_failures(runtime_dir: str, preset: str, failures: list[Failure]) -> None:
    path = _path(runtime_dir, preset, FAILURES_SUFFIX)
    if not failures:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        return
    import json

    os.makedirs(runtime_dir, exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump([{"at": x.at, "ready": x.ready, "why": x.why} for x in failures[-KEEP:]], f)
    os.replace(tmp, path)


def record_failure(runtime_dir: str, preset: str, failure: Failure) -> None:
    _write_failures(runtime_dir, preset, [*read_failures(runtime_dir, preset), failure])


def forget_failures(runtime_dir: str, preset: str) -> None:
    _write_failures(runtime_dir, preset, [])


def mark_ready(runtime_dir: str, preset: str, invocation: str) -> None:
    tmp = _path(runtime_dir, preset, f"{READY_SUFFIX}.tmp-{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(invocation)
    os.replace(tmp, _path(runtime_dir, preset, READY_SUFFIX))


def was_ready(runtime_dir: str, preset: str, invocation: str) -> bool:
    """Whether the start ``invocation`` had answered /health."""
    try:
        with open(_path(runtime_dir, preset, READY_SUFFIX), encoding="utf-8") as f:
            return bool(invocation) and f.read() == invocation
    except OSError:
        return False


def begin_start(runtime_dir: str, preset: str, invocation: str) -> str:
    """Note ``invocation`` as started; first, when the start before it is still noted
    (its ExecStopPost= step, :func:`end_start`, never ran to its end), record that start
    as a failure and return its line ("" otherwise).

    systemd 257 kills that step with the unit's cgroup after ``systemctl kill -s KILL``
    (:func:`lokid.core.launch.crashloop.unrecorded_reason`), and it restarts the unit, which
    only a failure does under ``Restart=on-failure``. A start by hand forgives the
    failure again (the crash-loop rule's NRestarts 0): the operator's own stops run the
    step."""
    why = ""
    try:
        with open(_path(runtime_dir, preset, STARTED_SUFFIX), encoding="utf-8") as f:
            before = f.read()
    except FileNotFoundError:
        before = ""
    if before and before != invocation:
        import time

        from ..core.launch.crashloop import unrecorded_reason

        ready = was_ready(runtime_dir, preset, before)
        why = unrecorded_reason(ready)
        record_failure(runtime_dir, preset, Failure(time.time(), ready, why))
    _write_started(runtime_dir, preset, invocation)
    return why


def _write_started(runtime_dir: str, preset: str, invocation: str) -> None:
    os.makedirs(runtime_dir, exist_ok=True)
    tmp = _path(runtime_dir, preset, f"{STARTED_SUFFIX}.tmp-{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(invocation)
    os.replace(tmp, _path(runtime_dir, preset, STARTED_SUFFIX))


def end_start(runtime_dir: str, preset: str) -> None:
    """The stop step ran to its end: the start it ended is no longer noted."""
    try:
        os.unlink(_path(runtime_dir, preset, STARTED_SUFFIX))
    except FileNotFoundError:
        pass


def automatic_restarts(unit: str, timeout: float = 3.0) -> int | None:
    """The unit's ``NRestarts``: systemd's automatic restarts since the last start by hand
    (0 for a start by hand). None when systemd cannot be asked."""
    import asyncio

    async def ask() -> int:
        from dbus_fast import BusType
        from dbus_fast.aio import MessageBus

        from ..core.names import unit_object_path
        from ..host.buscall import call

        bus = await MessageBus(bus_type=BusType.SYSTEM).connect()
        try:
            (value,) = await call(bus, "org.freedesktop.systemd1", unit_object_path(unit),
                                  "org.freedesktop.DBus.Properties", "Get", "ss",
                                  ["org.freedesktop.systemd1.Service", "NRestarts"])
            return int(value.value)
        finally:
            bus.disconnect()

    try:
        return asyncio.run(asyncio.wait_for(ask(), timeout))
    except Exception:  # no bus, no systemd, a refusal: the caller says it could not tell
        return None
