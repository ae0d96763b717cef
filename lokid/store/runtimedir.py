"""Where runtime plans live: ``$LOKI_RUNTIME_DIR/<preset>.json``, written atomically.

The value and its JSON form are :class:`lokid.core.launch.runtimeplan.RuntimePlan`;
this module only puts it in its file and reads it back, checking that it
belongs to the start asking for it (systemd's ``INVOCATION_ID``). Kept light
(json, os): ``lokid engine`` reads it between ``systemctl start`` and the
engine's own start, where every imported module delays readiness.
"""

from __future__ import annotations

import json
import os
from _thread import get_ident

from ..core.errors import StalePlanError
from ..core.launch.runtimeplan import RuntimePlan

RUNTIME_SUFFIX = ".json"


def runtime_path(runtime_dir: str, preset: str) -> str:
    return os.path.join(runtime_dir, preset + RUNTIME_SUFFIX)


def write_runtime_plan(runtime_dir: str, rp: RuntimePlan) -> str:
    """Write atomically (a reader never sees half a file); return the path."""
    path = runtime_path(runtime_dir, rp.preset)
    os.makedirs(runtime_dir, exist_ok=True)
    # O_EXCL on a name of this process's own (tempfile.mkstemp would cost the start
    # the import of tempfile, random and hashlib: ~3 ms before the engine spawns)
    tmp = os.path.join(runtime_dir, f".tmp-{rp.preset}.{os.getpid()}.{get_ident()}")
    try:
        os.unlink(tmp)  # left by a thread of a killed process with the same ids
    except FileNotFoundError:
        pass
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(rp.to_json(), indent=2) + "\n")
        os.chmod(tmp, 0o640)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    return path


def read_runtime_plan(runtime_dir: str, name: str,
                      invocation: str | None = None) -> RuntimePlan:
    path = runtime_path(runtime_dir, name)
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        rp = RuntimePlan.from_json(data)
    except FileNotFoundError:
        raise StalePlanError(f"no plan for preset {name!r} in {path}: `lokid prestart "
                             f"{name}` must run first (ExecStartPre)") from None
    except (OSError, ValueError) as e:  # json's errors are ValueErrors
        raise StalePlanError(f"unreadable plan {path}: {e}") from None
    if invocation and rp.invocation and rp.invocation != invocation:
        raise StalePlanError(f"the plan in {path} belongs to another start "
                             f"(invocation {rp.invocation}, this is {invocation})")
    return rp
