"""``org.lokid.Lokid1.Pulls`` at ``/org/lokid/Lokid1``: models fetched to the server (issue 48).

``Pull(reference, directory)`` starts ``lokid pull-worker`` in a unit of its own
(:mod:`lokid.runners.pullrun`, :mod:`lokid.core.model.pullunit`) and returns its unit name at
once; the worker's status file becomes ``PullProgress`` signals (at most two a second per
pull) and ``ListPulls()``. ``CancelPull(unit)`` stops it: what came is kept for a resume.

Rules, each for a failure it prevents:

- **the reference is read here before any unit starts** (:func:`lokid.core.model.pullref.
  parse_reference`): a typo is an InvalidArgs to the caller, not a failed unit to find in
  the journal;
- **the directory is the first of ``model_dirs`` unless the caller names one**, absolute
  and existing: a model pulled where no preset looks would be a model nobody can start;
- **one pull per (directory, reference)**: a second call while it runs is Busy and names
  the unit (the unit name is derived from both); whether it runs is read at the call, not
  taken from the last turn of the follower (a pull again right after a cancel was Busy);
- **a pull outlives its client and the daemon**: lokictl may leave (Ctrl-C) and the daemon
  may restart; at its start the daemon follows again every status file whose pull is not
  over and whose unit still runs;
- **a unit that ends without a final word** (killed, out of memory) is reported failed with
  what systemd says, never left "fetching" for ever;
- **``Pull`` and ``CancelPull`` need the manage action**: a pull writes gigabytes to the
  server's disk and uses its network; ``ListPulls`` is for anyone, as presets are (it holds
  no secret: the token never reaches the status file);
- **the token** is ``<config>/hf-token`` when it exists (``/etc/loki/hf-token``, root's
  0600 file), handed to the unit as a credential.

Signatures are dbus-fast's string annotations (Debian 12's 1.84 and 13's 2.44): no
postponed annotations in this module.
"""

# dbus-fast's string signatures, read as annotations: neither a Python type nor a name
# ruff: noqa: F722, F821
# mypy: disable-error-code="name-defined,valid-type"

import asyncio
import logging
import os
import time
from typing import Any

from dbus_fast import Variant
from dbus_fast.service import ServiceInterface, method, signal

from ..core.access import engine_user
from ..core.config import files as cfg
from ..core.errors import BusyError, InvalidArgsError, NotFoundError, printable
from ..core.model import pullref, pullunit
from ..core.names import PULLS_INTERFACE
from ..unit.pullworker import FAILED, FINAL, Status, read_status
from .access import MANAGE, READ, access, guarded
from .team import FACTORIES

log = logging.getLogger("lokid.daemon")
EVERY = 0.5          # s between two reads of the status files while pulls run
KEEP_DONE = 600.0    # s a finished pull stays in ListPulls
MAX_REFERENCE = 2000
TOKEN_FILE = "hf-token"
STATUS_DIR = "pulls"


class PullEntry:
    """One pull the daemon follows."""

    def __init__(self, pull_id: str, reference: str, directory: str, status_file: str):
        self.id, self.reference, self.directory = pull_id, reference, directory
        self.status_file = status_file
        self.unit = pullunit.unit_name(pull_id)
        self.status = Status(reference=reference, directory=directory, state="starting")
        self.ended_at: float | None = None

    def view(self) -> "dict[str, Variant]":
        s = self.status
        return {"unit": Variant("s", self.unit), "reference": Variant("s", self.reference),
                "directory": Variant("s", self.directory), "state": Variant("s", s.state),
                "done": Variant("t", max(0, s.done)), "total": Variant("t", s.total or 0),
                "file": Variant("s", s.file), "detail": Variant("s", s.detail),
                "model": Variant("s", s.model), "files": Variant("as", list(s.files))}


class PullsInterface(ServiceInterface):
    def __init__(self, backend: Any):
        super().__init__(PULLS_INTERFACE)
        self.backend = backend
        self.pulls: dict[str, PullEntry] = {}
        self._launcher: Any = None
        self._follow: asyncio.Task[None] | None = None

    # -- the parts it needs of the daemon, read at first use --------------------------

    def launcher(self) -> Any:
        if self._launcher is None:
            from ..runners.pullrun import ChildLauncher, UnitLauncher

            if self.backend.runner_kind == "systemd":
                self._launcher = UnitLauncher(self.backend.bus, engine_user(os.environ))
            else:
                self._launcher = ChildLauncher()
        return self._launcher

    def status_dir(self) -> str:
        path = os.path.join(self.backend.runtime_dir, STATUS_DIR)
        if not os.path.isdir(path):
            os.makedirs(path, mode=0o750, exist_ok=True)
            if self.backend.runner_kind == "systemd" and os.geteuid() == 0:
                import pwd

                user = pwd.getpwnam(engine_user(os.environ))
                os.chown(path, user.pw_uid, user.pw_gid)   # the worker (loki) writes there
        return path

    # -- the verbs ----------------------------------------------------------------------

    def _directory(self, directory: str) -> str:
        if not directory:
            dirs = cfg.load_global(self.backend.config_dir).model_dirs
            if not dirs:
                raise InvalidArgsError(
                    f"{os.path.join(self.backend.config_dir, cfg.GLOBAL_FILE)} sets no "
                    "model_dirs: name the directory to pull into (lokictl pull --dir DIR), "
                    "or set model_dirs so that presets find what is pulled")
            directory = dirs[0]
        if not os.path.isabs(directory) or len(directory) > 1024:
            raise InvalidArgsError(f"{printable(directory[:200])!r}: an absolute path")
        directory = os.path.normpath(directory)
        if not os.path.isdir(directory):
            raise InvalidArgsError(f"{printable(directory)}: no such directory")
        return directory

    async def start(self, reference: str, directory: str) -> str:
        if len(reference) > MAX_REFERENCE:
            raise InvalidArgsError(f"a reference of {len(reference)} characters: at most "
                                   f"{MAX_REFERENCE}")
        ref = pullref.parse_reference(reference)   # InvalidArgs, with the valid forms
        directory = await asyncio.to_thread(self._directory, directory)
        text = str(ref)
        pull_id = pullunit.unit_id(text, directory)
        live = self.pulls.get(pull_id)
        if live is not None and live.status.state not in FINAL:
            # read now, not at the follower's next turn: a pull cancelled or failed a
            # moment ago is over, and pulling again at once must resume it, not be Busy.
            # Quietly: the new pull's unit has the same name, and its caller, listening
            # already, would take the old pull's last word ("stopped") for its own.
            await self._read(live, quiet=True)
        if live is not None and live.status.state not in FINAL:
            raise BusyError(f"{text} is already being pulled into {directory} "
                            f"({live.unit}): lokictl pull --cancel {live.unit} stops it")
        status_file = os.path.join(self.status_dir(), f"{pull_id}.json")
        try:
            os.unlink(status_file)   # an earlier pull's last word is not this one's
        except FileNotFoundError:
            pass
        from ..runners.pullrun import worker_argv

        token = os.path.join(self.backend.config_dir, TOKEN_FILE)
        pull = PullEntry(pull_id, text, directory, status_file)
        await self.launcher().start(
            pull_id, worker_argv(directory, status_file, text), directory=directory,
            status_dir=os.path.dirname(status_file), reference=text,
            endpoint=os.environ.get("HF_ENDPOINT") or None,
            token_file=token if os.path.isfile(token) else None)
        self.pulls[pull_id] = pull
        log.info("pull %s into %s: started (%s)", text, directory, pull.unit)
        self._signal(pull)
        self._ensure_following()
        return pull.unit

    async def cancel(self, unit: str) -> None:
        if not pullunit.is_pull_unit(unit):
            raise InvalidArgsError(f"{printable(unit[:80])!r} is not a pull's unit "
                                   f"({pullunit.UNIT_PREFIX}<16 hex>.service)")
        pull = next((p for p in self.pulls.values() if p.unit == unit), None)
        if pull is None or pull.status.state in FINAL:
            raise NotFoundError(f"no pull runs as {unit}")
        await self.launcher().stop(pull.id)

    # -- following the status files ----------------------------------------------------

    def _signal(self, pull: PullEntry) -> None:
        s = pull.status
        self.PullProgress(pull.unit, pull.reference, s.state, max(0, s.done), s.total or 0,
                          s.detail if s.state != "done" else ", ".join(s.files))

    def _ensure_following(self) -> None:
        if self._follow is None or self._follow.done():
            self._follow = asyncio.get_running_loop().create_task(self._following())

    async def _following(self) -> None:
        while any(p.ended_at is None for p in self.pulls.values()):
            await asyncio.sleep(EVERY)
            for pull in list(self.pulls.values()):
                if pull.ended_at is None:
                    await self._read(pull)
            now = time.monotonic()
            for key, pull in list(self.pulls.items()):
                if pull.ended_at is not None and now - pull.ended_at > KEEP_DONE:
                    del self.pulls[key]

    async def _read(self, pull: PullEntry, quiet: bool = False) -> None:
        status = read_status(pull.status_file)
        if status is None or status.state not in FINAL:
            alive = await self.launcher().alive(pull.id)
            if alive is False:   # ended between the two reads? its last word wins
                status = read_status(pull.status_file) or status
                if status is None or status.state not in FINAL:
                    status = Status(reference=pull.reference, directory=pull.directory,
                                    state=FAILED, done=pull.status.done,
                                    total=pull.status.total,
                                    detail=f"{pull.unit} ended before the pull did "
                                           "(killed? see journalctl -u " + pull.unit + "); "
                                           "pull again to resume")
        if status is None:
            return
        before = pull.status
        status.reference, status.directory = pull.reference, pull.directory
        pull.status = status
        if not quiet and (status.state, status.done, status.detail) != (
                before.state, before.done, before.detail):
            self._signal(pull)
        if status.state in FINAL:
            pull.ended_at = time.monotonic()
            log.info("pull %s into %s: %s%s", pull.reference, pull.directory, status.state,
                     f" ({status.detail})" if status.detail else "")

    async def adopt(self) -> None:
        """At the daemon's start: follow again the pulls whose units still run."""
        folder = os.path.join(self.backend.runtime_dir, STATUS_DIR)
        try:
            names = sorted(n for n in os.listdir(folder) if n.endswith(".json"))
        except OSError:
            return
        for name in names:
            path = os.path.join(folder, name)
            status = read_status(path)
            pull_id = name[:-len(".json")]
            if status is None or status.state in FINAL or \
                    not pullunit.is_pull_unit(pullunit.unit_name(pull_id)):
                continue
            if await self.launcher().alive(pull_id):
                pull = PullEntry(pull_id, status.reference, status.directory, path)
                pull.status = status
                self.pulls[pull_id] = pull
                log.info("pull %s into %s: followed again (%s)", pull.reference,
                         pull.directory, pull.unit)
        if self.pulls:
            self._ensure_following()

    async def close(self) -> None:
        if self._follow is not None:
            self._follow.cancel()
        if self._launcher is not None:
            await self._launcher.close()

    # -- the interface -------------------------------------------------------------------

    @method()
    @access(MANAGE)
    @guarded
    async def Pull(self, reference: "s", directory: "s") -> "s":
        return await self.start(reference, directory)

    @method()
    @access(MANAGE)
    @guarded
    async def CancelPull(self, unit: "s") -> None:
        await self.cancel(unit)

    @method()
    @access(READ)
    @guarded
    async def ListPulls(self) -> "aa{sv}":
        now = time.monotonic()   # ended ones kept KEEP_DONE, whether the follower runs or not
        return [p.view() for p in self.pulls.values()
                if p.ended_at is None or now - p.ended_at <= KEEP_DONE]

    @signal()
    def PullProgress(self, unit: "s", reference: "s", state: "s", done: "t", total: "t",
                     detail: "s") -> "ssstts":
        return [unit, reference, state, done, total, detail]


FACTORIES.append(PullsInterface)
