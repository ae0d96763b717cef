"""The local runner: engines as the daemon's own children, where no system manager is reachable.

On a developer machine, in a container or on the session bus, the daemon runs
what ``loki-engine@.service`` would run, with the unit's semantics:

- ``lokid engine <preset>`` (it plans the start, then supervises the
  engine) with a fresh ``INVOCATION_ID`` as systemd would give; one such step is
  started ahead and told its preset when a start comes (:mod:`lokid.runners.spare`),
  so that a start does not wait for a new interpreter;
- readiness through a notify socket the daemon owns (an abstract AF_UNIX
  datagram socket, ``NOTIFY_SOCKET`` for the children): READY=1, STATUS=,
  STOPPING=1, accepted only from the engine's main process (NotifyAccess=main,
  told by SO_PASSCRED credentials);
- the engine's stdout and stderr through one pipe that the event loop reads in
  batches (:mod:`lokid.runners.pipelines`) into the daemon's log and into the same
  line parser as the
  journal watcher (:class:`lokid.watch.journalwatch.LoadJudge`), so layers pushed to
  RAM cut automatic speculation here too;
- restart on failure after :data:`RESTART_SEC`, until the crash-loop rule of
  :mod:`lokid.core.launch.crashloop` says to stop (the unit's Restart=on-failure);
  exit status 78 (the preset cannot start as it is) is final at once, as the
  unit's RestartPreventExitStatus= makes it; a stop sends SIGTERM and, after
  :data:`STOP_TIMEOUT`, SIGKILL. A stop before READY is not held against
  automatic speculation (what the unit's ``lokid stopped`` does);
- a job per verb, ended as systemd ends its jobs: a start or restart is
  ``done`` at READY, ``failed`` when its start fails, ``canceled`` when a stop
  replaces it; a stop is ``done`` once the engine is gone.

The benchmark's thrash hint reads the engine's own ``/proc/<pid>/io`` and RSS:
llama-server is the child of the ``lokid engine`` the runner spawned, and
runs as the daemon's user.

Differences from the unit, on purpose: no watchdog and no start timeout: the
supervisor's pings and timeout extensions are read but not enforced.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import struct
import sys
import time
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..core.launch import crashloop
from ..core.names import SYSLOG_IDENTIFIER, engine_unit
from ..core.telemetry.logring import LogRing
from ..unit.supervisor import PARENT_PID
from .pipelines import PipeLines
from .runner import (
    CANCELED,
    DONE,
    FAILED,
    INACTIVE,
    JOB_FAILED,
    LIVE,
    LOADING,
    READY,
    STOPPING,
    EngineState,
    JobListener,
    Listener,
    Runner,
)
from .spare import Spare

if TYPE_CHECKING:
    from ..core.bench.iosample import IOSampler

log = logging.getLogger("lokid.local")
engine_log = logging.getLogger("lokid.engine")

RESTART_SEC = 5.0
STOP_TIMEOUT = 90.0
LINE_LIMIT = 1 << 20
LOKID_PREFIX = SYSLOG_IDENTIFIER + ": "


class _Engine:
    """One preset's children and what the runner knows of them."""

    def __init__(self, preset: str):
        self.preset = preset
        self.task: asyncio.Task[None] | None = None
        self.proc: asyncio.subprocess.Process | None = None
        self.invocation = ""
        self.stop_requested = False
        self.again = False                       # start again once stopped (restart)
        self.wake = asyncio.Event()              # interrupts the pause before a restart
        self.failures: list[crashloop.Failure] = []
        self.ready = False                       # this start's engine answered
        self.last_line = ""                      # this start's last non-blank output line
        self.jobs: list[tuple[str, str]] = []    # (job id, verb) not ended yet


class LocalRunner(Runner):
    kind = "local"

    def __init__(self, listener: Listener, config_dir: str, state_dir: str, runtime_dir: str,
                 judge: Any = None, lokid: Sequence[str] = (sys.executable, "-m", "lokid"),
                 on_job: JobListener | None = None):
        super().__init__(listener, on_job)
        self.config_dir = config_dir
        self.state_dir = state_dir
        self.runtime_dir = runtime_dir
        self.judge = judge
        self.lokid = list(lokid)
        self.engines: dict[str, _Engine] = {}
        self.by_pid: dict[int, _Engine] = {}
        self.sock: socket.socket | None = None
        self.notify_address = ""
        self.job_count = 0
        # each preset's last lines: `lokictl logs` where there is no journal
        self.logs: dict[str, LogRing] = {}
        # a `lokid engine -` started ahead: a start does not wait for an interpreter
        self.spare = Spare([*self.lokid, "engine"], lambda: self._env(None))

    # -- the notify socket ------------------------------------------------------

    async def attach(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        name = f"lokid-notify-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        sock.bind("\0" + name)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        sock.setblocking(False)
        self.sock = sock
        self.notify_address = "@" + name
        asyncio.get_running_loop().add_reader(sock.fileno(), self._on_notify)
        self.spare.fill_soon()

    def _on_notify(self) -> None:
        assert self.sock is not None
        while True:
            try:
                data, ancdata, _flags, _addr = self.sock.recvmsg(
                    4096, socket.CMSG_SPACE(struct.calcsize("iII")))
            except (BlockingIOError, InterruptedError):
                return
            pid = 0
            for level, kind, payload in ancdata:
                if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                    pid = struct.unpack("iII", payload[:struct.calcsize("iII")])[0]
            eng = self.by_pid.get(pid)
            if eng is None:
                continue  # NotifyAccess=main: only the engine's supervisor speaks
            self._notified(eng, data.decode("utf-8", "replace").split("\n"))

    def _notified(self, eng: _Engine, fields: list[str]) -> None:
        current = self.state(eng.preset)
        state, status = current.state, current.status
        for field in fields:
            key, _, value = field.partition("=")
            if key == "READY" and value == "1" and state == LOADING:
                state = READY
                eng.ready = True
            elif key == "STOPPING" and value == "1":
                state = STOPPING
            elif key == "STATUS":
                status = value
        self._set(eng.preset, EngineState(state, status, "" if state == READY
                                          else current.detail))
        if state == READY:
            self._end_jobs(eng, {"start": DONE, "restart": DONE})
            self.spare.fill_soon()   # the start it served is done: the next one's

    # -- jobs ---------------------------------------------------------------------

    def _job_id(self) -> str:
        self.job_count += 1
        return f"local/{self.job_count}"

    def _new_job(self, eng: _Engine, verb: str) -> str:
        job = self._job_id()
        eng.jobs.append((job, verb))
        return job

    def _end_jobs(self, eng: _Engine, results: dict[str, str]) -> None:
        """End the pending jobs whose verb ``results`` names, with that result."""
        ending = [(j, v) for j, v in eng.jobs if v in results]
        eng.jobs = [(j, v) for j, v in eng.jobs if v not in results]
        for job, verb in ending:
            self._job_done(eng.preset, job, verb, results[verb])

    def _job_over(self, eng: _Engine, verb: str, result: str) -> str:
        """A job that ends as soon as it is asked for (told once the caller has its id)."""
        job = self._job_id()
        asyncio.get_running_loop().call_soon(self._job_done, eng.preset, job, verb, result)
        return job

    # -- verbs --------------------------------------------------------------------

    async def track(self, presets: list[str]) -> None:
        pass  # the runner knows its own children; presets never started are inactive

    async def start(self, preset: str) -> str:
        return self._start(self.engines.setdefault(preset, _Engine(preset)), "start")

    def _start(self, eng: _Engine, verb: str) -> str:
        if eng.task is not None and not eng.task.done():
            if self.state(eng.preset).state == READY and not eng.stop_requested:
                return self._job_over(eng, verb, DONE)
            if eng.stop_requested:
                eng.again = True  # like systemd's "replace": start once the stop is done
                self._end_jobs(eng, {"stop": CANCELED})
            return self._new_job(eng, verb)
        eng.failures.clear()  # a start by hand: what failed before it is forgiven
        eng.stop_requested = eng.again = False
        job = self._new_job(eng, verb)
        eng.task = asyncio.get_running_loop().create_task(self._run(eng))
        return job

    async def stop(self, preset: str) -> str:
        eng = self.engines.setdefault(preset, _Engine(preset))
        if eng.task is None or eng.task.done():
            return self._job_over(eng, "stop", DONE)
        eng.again = False
        self._end_jobs(eng, {"start": CANCELED, "restart": CANCELED})
        job = self._new_job(eng, "stop")
        self._request_stop(eng)
        return job

    async def engine_pids(self, preset: str) -> list[int]:
        """The ``lokid engine`` child and every process under it."""
        from ..host.proc import children

        eng = self.engines.get(preset)
        proc = eng.proc if eng is not None else None
        if proc is None or proc.returncode is not None:
            return []

        def tree(root: int) -> list[int]:
            out, todo = [], [root]
            while todo:
                pid = todo.pop()
                out.append(pid)
                todo += children(pid)
            return out

        return await asyncio.to_thread(tree, proc.pid)

    def restarts(self, preset: str) -> int | None:
        """The failures since the last start by hand: each was followed by a restart, as
        long as the crash-loop rule allowed one (systemd's NRestarts, here)."""
        eng = self.engines.get(preset)
        return None if eng is None else len(eng.failures)

    async def restart(self, preset: str) -> str:
        eng = self.engines.setdefault(preset, _Engine(preset))
        if eng.task is None or eng.task.done():
            return self._start(eng, "restart")
        eng.again = True
        self._end_jobs(eng, {"start": CANCELED, "restart": CANCELED, "stop": CANCELED})
        job = self._new_job(eng, "restart")
        eng.failures.clear()
        self._request_stop(eng)
        return job

    def _request_stop(self, eng: _Engine) -> None:
        if eng.stop_requested:
            return
        eng.stop_requested = True
        eng.wake.set()
        if self.state(eng.preset).state in LIVE:
            self._set(eng.preset, EngineState(STOPPING, "stopping", "stop requested"))
        proc = eng.proc
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            asyncio.get_running_loop().call_later(STOP_TIMEOUT, self._kill_if_alive, eng, proc)

    def _kill_if_alive(self, eng: _Engine, proc: asyncio.subprocess.Process) -> None:
        """TimeoutStopSec=: SIGKILL to a child that ignored SIGTERM (its engine follows it:
        PR_SET_PDEATHSIG)."""
        if proc.returncode is None:
            log.warning("preset %s: still running %.0f s after SIGTERM: killing it",
                        eng.preset, STOP_TIMEOUT)
            with contextlib.suppress(ProcessLookupError):
                proc.kill()

    async def close(self) -> None:
        """Stop every engine (they are our children) and wait for them."""
        await self.spare.close()
        running = [e for e in self.engines.values() if e.task is not None and not e.task.done()]
        for eng in running:
            eng.again = False
            self._request_stop(eng)
        if running:
            await asyncio.wait([e.task for e in running if e.task is not None],
                               timeout=STOP_TIMEOUT + 10)
        if self.sock is not None:
            asyncio.get_running_loop().remove_reader(self.sock.fileno())
            self.sock.close()
            self.sock = None

    async def io_sampler(self, preset: str) -> IOSampler | None:
        """The engine process's own counters: the one child of its supervisor."""
        from ..host.proc import children, sampler_for_pid

        eng = self.engines.get(preset)
        proc = eng.proc if eng is not None else None
        if proc is None or proc.pid not in self.by_pid:  # not running
            return None
        engines = await asyncio.to_thread(children, proc.pid)
        return sampler_for_pid(engines[0]) if len(engines) == 1 else None

    # -- one preset's life ------------------------------------------------------

    def _env(self, invocation: str | None) -> dict[str, str]:
        """A step's environment; its ``INVOCATION_ID`` (None: the spare's, told later)."""
        env = {**os.environ, "LOKI_CONFIG_DIR": self.config_dir,
               "LOKI_STATE_DIR": self.state_dir, "LOKI_RUNTIME_DIR": self.runtime_dir,
               "NOTIFY_SOCKET": self.notify_address, "PYTHONUNBUFFERED": "1",
               # the step and its engine die with the daemon (lokid.unit.supervisor)
               PARENT_PID: str(os.getpid())}
        if invocation is None:
            env.pop("INVOCATION_ID", None)
        else:
            env["INVOCATION_ID"] = invocation
        return env

    async def _spawn(self, eng: _Engine,
                     taken: tuple[asyncio.subprocess.Process, int] | None
                     ) -> tuple[asyncio.subprocess.Process, PipeLines]:
        """The step (``taken``: the spare, told this start; else a new one), and the reader
        of its output (stdout and stderr: one pipe)."""
        if taken is not None:
            proc, read_end = taken
            return proc, PipeLines(read_end, lambda lines: self._lines(eng, lines), LINE_LIMIT)
        read_end, write_end = os.pipe2(os.O_CLOEXEC)
        try:
            proc = await asyncio.create_subprocess_exec(
                *self.lokid, "engine", eng.preset, env=self._env(eng.invocation),
                stdin=asyncio.subprocess.DEVNULL, stdout=write_end, stderr=write_end)
        except BaseException:
            os.close(read_end)
            raise
        finally:
            os.close(write_end)  # the child's only: EOF once it and its engine are gone
        return proc, PipeLines(read_end, lambda lines: self._lines(eng, lines), LINE_LIMIT)

    async def _run(self, eng: _Engine) -> None:
        try:
            while True:
                if eng.stop_requested:
                    eng.stop_requested = False
                    if not eng.again:
                        self._set(eng.preset, EngineState(INACTIVE, "", "stopped"))
                        self._end_jobs(eng, {"stop": DONE, "start": CANCELED,
                                             "restart": CANCELED})
                        return
                    eng.again = False
                    self._end_jobs(eng, {"stop": DONE})
                outcome = await self._once(eng)
                if eng.stop_requested:
                    continue
                if outcome is None:
                    self._end_jobs(eng, {"start": JOB_FAILED, "restart": JOB_FAILED,
                                         "stop": DONE})
                    return  # final failure, already reported
                eng.failures = [*eng.failures, crashloop.Failure(time.time(), eng.ready,
                                                                 outcome)][-crashloop.KEEP:]
                why = crashloop.stop_reason(eng.failures, time.time())
                if why:
                    self._set(eng.preset, EngineState(
                        FAILED, "", f"{why}; start it again when the cause is fixed"))
                    self._end_jobs(eng, {"start": JOB_FAILED, "restart": JOB_FAILED,
                                         "stop": DONE})
                    return
                self._set(eng.preset, EngineState(
                    LOADING, "", f"restarting in {RESTART_SEC:g} s: "
                    + crashloop.progress(eng.failures, time.time())))
                # as under systemd: the start job fails with the start, the restart goes on
                self._end_jobs(eng, {"start": JOB_FAILED, "restart": JOB_FAILED})
                eng.wake.clear()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(eng.wake.wait(), RESTART_SEC)
        except Exception:
            log.exception("preset %s: the local runner failed", eng.preset)
            self._set(eng.preset, EngineState(FAILED, "", "internal error in lokid's local "
                                              "runner; details are in its log"))
            self._end_jobs(eng, {"start": JOB_FAILED, "restart": JOB_FAILED, "stop": DONE})

    async def _once(self, eng: _Engine) -> str | None:
        """One start; the failure to restart after, or None when done (stopped, or final)."""
        eng.invocation = uuid.uuid4().hex
        eng.ready = False
        eng.last_line = ""
        # the spare first: it plans and spawns the engine while the state is announced
        taken = self.spare.take(eng.preset, eng.invocation)
        try:
            self._set(eng.preset, EngineState(LOADING, "", "starting"))
        except BaseException:
            if taken is not None:   # told already: it must not run unsupervised
                taken[0].kill()
                os.close(taken[1])
            raise
        proc, output = await self._spawn(eng, taken)
        eng.proc = proc
        self.by_pid[proc.pid] = eng
        if eng.stop_requested:  # asked while it was being spawned
            proc.send_signal(signal.SIGTERM)
            asyncio.get_running_loop().call_later(STOP_TIMEOUT, self._kill_if_alive, eng, proc)
        try:
            rc = await proc.wait()
            output.read_now()   # its end is there: no wait for the next batch of lines
            await output.done  # every writer gone: the child, and the engine it started
        finally:
            output.close()
            self.by_pid.pop(proc.pid, None)
            eng.proc = None
            self.spare.fill_soon()
        if eng.stop_requested:
            if not eng.ready:
                await asyncio.to_thread(self._forgive_stop, eng)
            return None
        if rc in crashloop.NO_RESTART:
            why = eng.last_line or f"status {rc}"
            why = why[len(LOKID_PREFIX):] if why.startswith(LOKID_PREFIX) else why
            self._set(eng.preset, EngineState(FAILED, why, f"cannot start: {why}"))
            return None
        return f"the engine exited with status {rc}" if rc >= 0 else \
            f"the engine was killed by signal {-rc}"

    def _forgive_stop(self, eng: _Engine) -> None:
        """A stop before READY is no failure of automatic speculation (lokid stopped)."""
        from ..unit.steps import stopped

        stopped(self.state_dir, self.runtime_dir, eng.preset,
                {"SERVICE_RESULT": "success", "INVOCATION_ID": eng.invocation})

    def _lines(self, eng: _Engine, raw: list[bytes]) -> None:
        """A batch of the child's output lines (:mod:`lokid.runners.pipelines`): logged as
        one record, given to the line parser in order (the engine's together, lokid's own
        one by one, as their journal entries would be), the last non-blank one kept."""
        lines = [r.decode("utf-8", "replace") for r in raw]
        engine_log.info("%s", "\n".join(f"{eng.preset}: {line}" for line in lines))
        ring, now = self.logs.setdefault(eng.preset, LogRing()), time.time()
        for line in lines:
            if line.startswith(LOKID_PREFIX):
                ring.add(now, SYSLOG_IDENTIFIER, line[len(LOKID_PREFIX):])
            else:
                ring.add(now, "llama-server", line)
        for line in reversed(lines):
            if line.strip():
                eng.last_line = line
                break
        judge = self.judge
        if judge is None:
            return
        try:
            batch: list[str] = []
            for line in lines:
                if not line.startswith(LOKID_PREFIX):
                    batch.append(line)
                    continue
                if batch:
                    judge.engine_lines(eng.preset, eng.invocation, batch)
                    batch = []
                judge.handle({"_SYSTEMD_UNIT": engine_unit(eng.preset),
                              "_SYSTEMD_INVOCATION_ID": eng.invocation,
                              "MESSAGE": line[len(LOKID_PREFIX):], "LOKI_PRESET": eng.preset,
                              "SYSLOG_IDENTIFIER": SYSLOG_IDENTIFIER})
            if batch:
                judge.engine_lines(eng.preset, eng.invocation, batch)
        except Exception:
            log.exception("preset %s: the line parser failed", eng.preset)
