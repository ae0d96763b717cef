"""Where a model pull's worker runs (issue 48): a transient systemd unit, or the daemon's
own child where no system manager runs (the tests', a developer's session daemon).

Both launch ``lokid pull-worker`` with the same arguments and the same status file, so
that the daemon follows a pull the same way whichever runs it (:mod:`lokid.dbus.pulls`).
Under systemd the unit is what :mod:`lokid.core.model.pullunit` says; a failed unit of an earlier
pull of the same id is reset first (systemd keeps a failed transient unit loaded, and a
second start of its name would be refused as a unit that exists). A child gets the token as
a unit would: a 0700 directory holding a 0600 copy, named by ``CREDENTIALS_DIRECTORY``.
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
from typing import Any

from dbus_fast import DBusError, Variant

from ..core.errors import BusyError, LokiError
from ..core.model import pullunit
from ..host.buscall import call
from .systemd_runner import SYSTEMD, SYSTEMD_MANAGER, SYSTEMD_PATH
from .unitcalls import active_state


def worker_argv(directory: str, status_file: str, reference: str) -> list[str]:
    """``lokid pull-worker``'s command line, as the daemon's own interpreter runs lokid (the
    local runner's engines too); the reference after ``--`` (it may start with a dash, and
    must never be read as an option)."""
    return [sys.executable, "-m", "lokid", "pull-worker", "--dir", directory,
            "--status-file", status_file, "--", reference]


class UnitLauncher:
    """Pulls as transient units of the system manager reached on ``bus``."""

    def __init__(self, bus: Any, user: str):
        self.bus, self.user = bus, user

    async def start(self, pull_id: str, argv: list[str], *, directory: str, status_dir: str,
                    reference: str, endpoint: str | None, token_file: str | None) -> None:
        unit = pullunit.unit_name(pull_id)
        try:
            await call(self.bus, SYSTEMD, SYSTEMD_PATH, SYSTEMD_MANAGER, "ResetFailedUnit",
                       "s", [unit])
        except DBusError:
            pass   # not loaded, or not failed: nothing to reset
        props = pullunit.properties(argv, directory=directory, status_dir=status_dir,
                                    user=self.user, reference=reference, endpoint=endpoint,
                                    token_file=token_file)
        try:
            await call(self.bus, SYSTEMD, SYSTEMD_PATH, SYSTEMD_MANAGER, "StartTransientUnit",
                       "ssa(sv)a(sa(sv))",
                       [unit, "fail", [[name, Variant(sig, value)] for name, sig, value in props],
                        []])
        except DBusError as e:
            if "UnitExists" in (e.type or "") or "already exists" in (e.text or ""):
                raise BusyError(f"{unit} already runs: that pull is under way") from None
            raise LokiError(f"systemd refused the pull's unit {unit}: {e.text}") from None

    async def alive(self, pull_id: str) -> bool | None:
        """Whether the unit still runs; None when systemd cannot be asked now."""
        try:
            state = await active_state(self.bus, pullunit.unit_name(pull_id))
        except (DBusError, OSError):
            return None
        return state in ("active", "activating", "deactivating", "reloading")

    async def stop(self, pull_id: str) -> None:
        try:
            await call(self.bus, SYSTEMD, SYSTEMD_PATH, SYSTEMD_MANAGER, "StopUnit", "ss",
                       [pullunit.unit_name(pull_id), "replace"])
        except DBusError as e:
            raise LokiError(f"systemd refused to stop {pullunit.unit_name(pull_id)}: "
                            f"{e.text}") from None

    async def close(self) -> None:
        """Units outlive the daemon: a pull goes on through a daemon's restart."""


class ChildLauncher:
    """Pulls as the daemon's own children (no system manager)."""

    def __init__(self) -> None:
        self.procs: dict[str, asyncio.subprocess.Process] = {}
        self.creds: dict[str, tempfile.TemporaryDirectory[str]] = {}

    async def start(self, pull_id: str, argv: list[str], *, directory: str, status_dir: str,
                    reference: str, endpoint: str | None, token_file: str | None) -> None:
        proc = self.procs.get(pull_id)
        if proc is not None and proc.returncode is None:
            raise BusyError(f"the pull {pull_id} already runs")
        env = {k: v for k, v in os.environ.items()
               if k not in ("HF_ENDPOINT", "CREDENTIALS_DIRECTORY", "NOTIFY_SOCKET")}
        if endpoint:
            env["HF_ENDPOINT"] = endpoint
        if token_file:
            env["CREDENTIALS_DIRECTORY"] = self._credential(pull_id, token_file)
        self.procs[pull_id] = await asyncio.create_subprocess_exec(
            *argv, env=env, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)

    def _credential(self, pull_id: str, token_file: str) -> str:
        old = self.creds.pop(pull_id, None)
        if old is not None:
            old.cleanup()
        holder = tempfile.TemporaryDirectory(prefix="lokid-pull-creds-")
        os.chmod(holder.name, 0o700)
        with open(token_file, "rb") as src:
            data = src.read(4096)
        fd = os.open(os.path.join(holder.name, pullunit.TOKEN_CREDENTIAL),
                     os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as dst:
            dst.write(data)
        self.creds[pull_id] = holder
        return holder.name

    async def alive(self, pull_id: str) -> bool | None:
        proc = self.procs.get(pull_id)
        if proc is None or proc.returncode is not None:
            holder = self.creds.pop(pull_id, None)
            if holder is not None:
                holder.cleanup()
            return False
        return True

    async def stop(self, pull_id: str) -> None:
        proc = self.procs.get(pull_id)
        if proc is not None and proc.returncode is None:
            proc.terminate()

    async def close(self) -> None:
        """The daemon's children end with it (as its engines do here)."""
        for proc in self.procs.values():
            if proc.returncode is None:
                proc.terminate()
        for proc in self.procs.values():
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except TimeoutError:
                proc.kill()
        for holder in self.creds.values():
            holder.cleanup()
