"""What ``lokid prestart`` (ExecStartPre=) leaves for ``lokid engine`` (ExecStart=) of one start.

``$LOKI_RUNTIME_DIR/<preset>.prestart`` (JSON, written atomically) names the
start it speaks for (systemd's ``INVOCATION_ID``) and holds one of

- ``refused``: the exit status and the one line of a start that must not run
  (the preset cannot start as it is: 78; the crash-loop rule: 69). The
  prestart step logs it and exits 0, and ``lokid engine``, the unit's main
  process, sends the line as STATUS= and exits with the status. Two things
  only the main process has: systemd applies ``RestartPreventExitStatus=`` to
  the main process's status alone (a failed ExecStartPre= is restarted every
  RestartSec= until a start limit), and with ``NotifyAccess=main`` only its
  STATUS= reaches ``systemctl status``;
- ``planned``: the runtime plan of this start is written
  (:mod:`lokid.store.runtimedir`), and, when it was planned afresh rather
  than reused, what :func:`lokid.store.plancache.record` needs once the engine
  answers (the paths the plan was made from, the attempt verdict, when
  planning began): a start that never becomes ready records nothing;
- ``kept``: the kept plan of the last ready start stands and is settled alone
  (:mod:`lokid.unit.keptstart`: a restart nobody edited); ``lokid engine`` takes it
  from :mod:`lokid.store.plancache` and writes the runtime plan itself. Written
  without the JSON module (its text is fixed but for the invocation, which is
  checked to need no escape).

No record for this invocation (the daemon's local runner, which runs
``lokid engine`` alone, or a start by hand): ``lokid engine`` plans itself.
Writer and reader run as the unit's user, one after the other (systemd runs a
unit's commands in order): no lock. Kept light (json, os): ``lokid engine``
reads it before the engine spawns.
"""

from __future__ import annotations

import os

SUFFIX = ".prestart"
# Not a refusal: the model is a hub reference not pulled yet (issue 48), and the engine
# step, the unit's main process, pulls it (its progress is STATUS=), then plans itself.
PULL_FIRST = 1000


class Planned:
    """A start whose runtime plan is written; ``paths`` empty when it was reused. ``kept``:
    not written; the kept plan stands (the engine step takes it and writes it)."""

    __slots__ = ("paths", "verdict", "planned_at", "kept")

    def __init__(self, paths: list[str], verdict: str, planned_at: int, kept: bool = False):
        self.paths, self.verdict, self.planned_at = paths, verdict, planned_at
        self.kept = kept


class Refused:
    """A start that must not run: the unit's exit status and the line saying why."""

    __slots__ = ("status", "message")

    def __init__(self, status: int, message: str):
        self.status, self.message = status, message


def _path(runtime_dir: str, preset: str) -> str:
    return os.path.join(runtime_dir, preset + SUFFIX)


def _write(runtime_dir: str, preset: str, data: dict[str, object]) -> None:
    import json

    _write_text(runtime_dir, preset, json.dumps(data))


def _write_text(runtime_dir: str, preset: str, text: str) -> None:
    path = _path(runtime_dir, preset)
    os.makedirs(runtime_dir, exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def plain_invocation(invocation: str) -> bool:
    """Whether ``invocation`` is written in JSON as it is (systemd's are 32 hex digits)."""
    return invocation.isascii() and invocation.isalnum()


def write_kept(runtime_dir: str, preset: str, invocation: str) -> None:
    """The ``kept`` record, for an invocation :func:`plain_invocation` accepts."""
    if not plain_invocation(invocation):
        raise ValueError(f"invocation {invocation!r} needs escaping")
    _write_text(runtime_dir, preset, f'{{"invocation": "{invocation}", "kept": true}}')


def write_planned(runtime_dir: str, preset: str, invocation: str, planned: Planned) -> None:
    _write(runtime_dir, preset, {"invocation": invocation, "planned": {
        "paths": planned.paths, "verdict": planned.verdict, "planned_at": planned.planned_at}})


def write_refused(runtime_dir: str, preset: str, invocation: str, refused: Refused) -> None:
    _write(runtime_dir, preset, {"invocation": invocation, "refused": {
        "status": refused.status, "message": refused.message}})


def read(runtime_dir: str, preset: str, invocation: str) -> Planned | Refused | None:
    """What the prestart step of ``invocation`` left; None when it left nothing for it
    (no prestart ran for this start, or the file is another start's, or damaged)."""
    if not invocation:
        return None
    import json

    try:
        with open(_path(runtime_dir, preset), encoding="utf-8") as f:
            data = json.load(f)
        if data["invocation"] != invocation:
            return None
        if data.get("kept") is True:
            return Planned([], "", 0, kept=True)
        if "refused" in data:
            r = data["refused"]
            return Refused(int(r["status"]), str(r["message"]))
        p = data["planned"]
        return Planned([str(x) for x in p["paths"]], str(p["verdict"]), int(p["planned_at"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None
