"""The helpers ``loki-engine@.service`` runs: ``lokid prestart`` and ``lokid engine``.

``prestart`` (ExecStartPre) plans the launch, refuses a busy port before
touching any attempt token (peek, then settle), writes the plan of this
invocation to ``$LOKI_RUNTIME_DIR/<preset>.json`` and logs each note as its
own journal entry. ``engine`` (ExecStart) reads that plan and supervises
llama-server (:mod:`lokid.supervisor`); on READY it clears its own attempt
token, so the next start of the same configuration is allowed again.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from .errors import LokiError
from .gather import gather
from .plan import Plan, build_plan, fingerprint
from .run import check_port_free, describe
from .state import Mark, StateDB
from .supervisor import Launch, Notifier, supervise

RUNTIME_SUFFIX = ".json"


class StalePlanError(LokiError):
    """The runtime plan is missing or belongs to another invocation."""


@dataclass(frozen=True)
class RuntimePlan:
    """The plan of one invocation, as prestart wrote it for the engine helper."""

    plan: dict[str, Any]
    host: str
    port: int
    mark: Mark
    invocation: str

    @property
    def auto(self) -> bool:
        return bool(self.plan["spec"]["auto"])


def runtime_path(runtime_dir: str, preset: str) -> str:
    return os.path.join(runtime_dir, preset + RUNTIME_SUFFIX)


def _atomic_write(path: str, text: str) -> None:
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def journal_log(preset: str, message: str, priority: int = 5) -> None:
    """One journal entry (with LOKI_PRESET=) when stderr is the journal, else a line."""
    if os.environ.get("JOURNAL_STREAM"):
        try:
            from systemd import journal

            journal.send(message, PRIORITY=priority, LOKI_PRESET=preset,
                         SYSLOG_IDENTIFIER="lokid")
            return
        except (ImportError, OSError):
            pass
    print(f"lokid: {message}", file=sys.stderr, flush=True)


def prestart(config_dir: str, state_dir: str, runtime_dir: str, name: str,
             environ: Mapping[str, str] | None = None) -> Plan:
    """Plan the launch of ``name``, settle its attempt token, write the runtime plan."""
    environ = dict(os.environ if environ is None else environ)
    inputs = gather(config_dir, name, environ)
    allowed = build_plan(inputs)
    mark = Mark(fingerprint(allowed, inputs.model), inputs.caps.path, inputs.caps.build)
    with StateDB(state_dir) as db:
        found = db.peek(name, mark)
        plan = build_plan(replace(inputs, auto_blocked=found.why)) if found.why else allowed
        # Before any token moves: a second start refused because the first is
        # still loading must not count the first one's token as a failure.
        check_port_free(plan.host, plan.port)
        db.settle(name, mark, found, attempt=plan.spec.auto)
    data = {
        **plan.to_json(),
        "host": plan.host,
        "port": plan.port,
        "mark": {"fingerprint": mark.fingerprint, "engine": mark.engine, "build": mark.build},
        "invocation": environ.get("INVOCATION_ID", ""),
    }
    _atomic_write(runtime_path(runtime_dir, name), json.dumps(data, indent=2) + "\n")
    for note in plan.notes:
        journal_log(name, note)
    journal_log(name, f"plan: {describe(plan)}", priority=6)
    return plan


def read_runtime_plan(runtime_dir: str, name: str,
                      invocation: str | None = None) -> RuntimePlan:
    path = runtime_path(runtime_dir, name)
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        mark = Mark(**data["mark"])
        rp = RuntimePlan(plan=data, host=data["host"], port=int(data["port"]), mark=mark,
                         invocation=data.get("invocation", ""))
    except FileNotFoundError:
        raise StalePlanError(f"no plan for preset {name!r} in {path}: `lokid prestart "
                             f"{name}` must run first (ExecStartPre)") from None
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise StalePlanError(f"unreadable plan {path}: {e}") from None
    if invocation and rp.invocation and rp.invocation != invocation:
        raise StalePlanError(f"the plan in {path} belongs to another start "
                             f"(invocation {rp.invocation}, this is {invocation})")
    return rp


def engine(state_dir: str, runtime_dir: str, name: str) -> int:
    """Supervise the engine of this invocation; the exit status for systemd."""
    rp = read_runtime_plan(runtime_dir, name, os.environ.get("INVOCATION_ID"))
    launch = Launch.of(name, rp.plan["argv"], rp.plan["env"], rp.host, rp.port)

    def on_ready(url: str) -> None:
        if rp.auto:
            with StateDB(state_dir) as db:
                db.clear(name, rp.mark)

    def log(message: str) -> None:
        journal_log(name, message)

    return supervise(launch, notifier=Notifier(), log=log, on_ready=on_ready,
                     unexpected_exit_fails=True)
