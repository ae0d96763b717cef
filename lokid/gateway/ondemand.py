"""Where a request goes: a ready engine's URL, after starting it when its preset is on demand.

Rules, each for a failure it prevents:

- a ready preset costs nothing: its URL is known from the daemon's signals;
- requests waiting for the same preset share one start (one ``StartPreset``, one wait):
  a burst of requests for a stopped model starts it once;
- a start outlives the request that asked for it: a client that gives up does not
  cancel the load the next client will want (giving up a start nobody waits for is the
  GPU groups' business, :mod:`lokid.gateway.groups`, through :meth:`Starter.cancel`);
- a start that fails answers every waiting request with the preset's own reason (its
  Status), and so does every request for :data:`FAILED_HOLD` seconds after: a client
  retrying in a loop does not restart a broken engine in a loop; unless its need moved
  meanwhile (a start that failed out of memory has its footprint raised by the daemon,
  issue 29): the next start is another one, placed by the new figure;
- a start that ran out of memory says so, with the daemon's figures: its job's words,
  else (no job's end heard: the journal lags) its need raised since it was asked, waited
  for :data:`OOM_LAG` at most. Clients read the load's last progress line instead
  ("loading big (s.gguf): 0 s, 1 MiB resident", issue 45, item 13);
- a failed start waits for its own job's end (:data:`JOB_LAG`), not for the preset's next
  change: under systemd the failure's other signals (its State, OnDemandState, the
  restart's pause) come first, and the reason a client read was never the job's, on every
  failed start that lost that race (issue 45, the item-13 walk);
- a start that lokid's restart interrupted is no start that failed (issue 28, item 4:
  kill -9 of the daemon during a cold start held the preset at "failed to start:
  inactive" for 30 s after it was back). When the daemon leaves the bus, or its owner on
  the bus changed since the start was asked (:attr:`Presets.generation`), the waiting
  requests wait up to :data:`DAEMON_BACK` for it to come back; then the start goes on if
  the engine is still loading (systemd kept it), or is asked again once if it is not. A
  daemon not back in time answers 503 ``lokid_unreachable``, and holds nothing: the
  next request starts the preset;
- a preset not on demand is never started by a request: the reply says
  ``lokictl start <preset>``;
- a preset being unloaded (its ``Unloading``, ``lokictl unload``) gets no new request:
  it waits for the unload's end (bounded by :data:`START_TIMEOUT`), then goes as to any
  stopped preset (started again when on demand; else the reply says how to start it).
  Sent to the engine meanwhile, a steady client kept the unload's drain from reaching 0
  and restarted the engine during its stop: the unload never ended;
- a preset whose own engine is not ready while another of its replicas is (a restart
  rolling through them, issue 47) is served by that replica: no 503, no start;
- no wait is endless: :data:`START_TIMEOUT` bounds a start;
- a request a browser sends without asking first (a ``GET``: an ``<img>`` on any page a
  local user opens, with no ``Origin`` and no CORS preflight) never starts an engine,
  nor stops one: ``GET /props?model=X`` started X on demand, or in a GPU group swapped
  the group to X (issue 45, item 5). It is served by a ready engine whose turn it is
  (:func:`check_safe`), else answered 503 ``model_not_running``: a POST starts it.
"""

from __future__ import annotations

import asyncio
import time
from typing import NoReturn

from dbus_fast import DBusError

from .presets import Preset, Presets
from .replies import UNAVAILABLE, GatewayError
from .report import start_for_request

READY, LOADING, FAILED, INACTIVE, STOPPING = "ready", "loading", "failed", "inactive", "stopping"
START_TIMEOUT = 600.0
FAILED_HOLD = 30.0
JOB_LAG = 3.0   # seconds a failed start's JobFinished may follow its state (journal lag)
# seconds a failed start with no job's word waits for the daemon to raise its need for
# memory (its footprints read the engine's lines up to 3 s after the failure, then Memory)
OOM_LAG = 5.0
# Seconds a start waits for lokid to come back on the bus: its unit restarts it after
# RestartSec=2s, and it owns the bus name once its presets are loaded (a few seconds
# with hundreds of them).
DAEMON_BACK = 60.0
# What the bus answers a call to a name nobody owns, or whose owner left before it replied
GONE = ("org.freedesktop.DBus.Error.ServiceUnknown", "org.freedesktop.DBus.Error.NameHasNoOwner",
        "org.freedesktop.DBus.Error.NoReply", "org.freedesktop.DBus.Error.Disconnected")


SAFE_METHODS = frozenset({"GET", "HEAD"})   # what a page sends without a preflight


def check_safe(preset: Preset, its_turn: bool, what: str = "a GET") -> None:
    """For a GET or HEAD (or ``what`` else that starts nothing): GatewayError 503
    unless ``preset``'s engine is ready and may take it now (``its_turn``: its GPU
    group's turn is its own, it is not being stopped); serving it then starts nothing
    and swaps nothing."""
    if preset.state == READY and preset.url and not preset.unloading and its_turn:
        return
    how = ("a POST for it (such as /v1/chat/completions) starts it" if preset.on_demand
           else f"start it with `lokictl start {preset.name}`")
    raise GatewayError(503, f"preset {preset.name!r} is not running ({preset.shown_state}): "
                       f"{what} does not start an engine; {how}", UNAVAILABLE,
                       "model_not_running")


def _needs(preset: Preset) -> str:
    """The preset's need as the daemon says it (Memory), to tell a failed start's hold
    from a start placed anew: a start that failed out of memory has its record raised."""
    return repr(sorted((preset.memory.get("needs") or {}).items()))


def _out_of_memory(preset: Preset, asked_needs: str) -> str:
    """Why a start failed, where the daemon raised the preset's need for memory since it
    was asked and its job did not say it (issue 45, item 13: clients read the load's last
    progress line, "loading big (s.gguf): 0 s, 1 MiB resident"); else ""."""
    memory = preset.memory
    sources = memory.get("sources")
    if _needs(preset) == asked_needs or not isinstance(sources, dict) \
            or "oom" not in sources.values():
        return ""
    return f"out of memory: it {memory.get('text') or 'needs more than this host had free'}"


class Starter:
    def __init__(self, presets: Presets):
        self.presets = presets
        self.starting: dict[str, asyncio.Task[None]] = {}
        # preset → (until, reason, its need then)
        self.failed: dict[str, tuple[float, str, str]] = {}

    async def url(self, preset: Preset) -> str:
        """The URL of the preset's ready engine; GatewayError (503) when there is none."""
        if preset.unloading:
            await self._unloaded(preset)
        if preset.state == READY and preset.url:
            self.failed.pop(preset.name, None)
            return preset.url
        if preset.url and any(e.index > 1 and e.state == READY and e.url
                              for e in preset.engines):
            # its own engine restarts (an edit's roll, issue 47) or failed: a ready replica
            # takes the request (lokid.gateway.replicas); a 503 here failed every request
            # of the roll's first step
            return preset.url
        if preset.state not in (LOADING, STOPPING) and not preset.on_demand:
            raise GatewayError(503, f"preset {preset.name!r} is not running ({preset.state}): "
                               f"start it with `lokictl start {preset.name}`", UNAVAILABLE,
                               "model_not_running")
        held = self.failed.get(preset.name)
        if held is not None and held[0] > time.monotonic() and preset.state != LOADING \
                and held[2] == _needs(preset):
            raise GatewayError(503, held[1], UNAVAILABLE, "model_start_failed")
        task = self.starting.get(preset.name)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._start(preset))
            self.starting[preset.name] = task
            task.add_done_callback(lambda t: self._done(preset.name, t))
        await asyncio.shield(task)   # the start goes on if this request is cancelled
        return preset.url

    async def _unloaded(self, preset: Preset) -> None:
        """Until the preset's unload ended (its Unloading false), or 503 past START_TIMEOUT."""
        deadline = time.monotonic() + START_TIMEOUT
        while preset.unloading and not self.presets.unreachable:
            left = deadline - time.monotonic()
            if left <= 0:
                raise GatewayError(503, f"preset {preset.name!r} is being unloaded "
                                   f"(`lokictl unload`), still after {START_TIMEOUT:.0f} s",
                                   UNAVAILABLE, "model_unloading")
            await self.presets.changed(preset, left)

    def _done(self, name: str, task: asyncio.Task[None]) -> None:
        if self.starting.get(name) is task:   # not a newer start of the same preset
            del self.starting[name]

    def cancel(self, name: str) -> None:
        """Give up the start of ``name`` under way, if any (its group swaps it out): its
        end is no failure, and the next request for it starts it again."""
        task = self.starting.pop(name, None)
        if task is not None:
            task.cancel()

    async def _start(self, preset: Preset) -> None:
        try:
            await asyncio.wait_for(self._until_ready(preset), START_TIMEOUT)
        except TimeoutError:
            self._fail(preset, f"preset {preset.name!r} did not become ready in "
                       f"{START_TIMEOUT:.0f} s ({preset.status or preset.state})")

    async def _until_ready(self, preset: Preset) -> None:
        generation = self.presets.generation
        asked_needs = _needs(preset)
        job: str | None = ""
        if preset.state in (INACTIVE, FAILED) or (preset.state == STOPPING and preset.on_demand):
            job = await self._ask(preset)
            seen_loading = False
        else:
            seen_loading = True
        job_awaited = False
        while True:
            if preset.state == READY and preset.url:
                self.failed.pop(preset.name, None)
                return
            if job is None or self.presets.unreachable or self.presets.generation != generation:
                # lokid left (and maybe came back) since the start was asked: its engine
                # may have gone with it, and the job is gone; not the preset's failure
                await self._daemon_back(preset, generation)
                generation = self.presets.generation
                if preset.state == READY and preset.url:
                    continue
                if preset.state in (INACTIVE, FAILED):
                    job, seen_loading = await self._ask(preset), False
                else:   # the start went on without the daemon (systemd's unit)
                    job, seen_loading = "", True
                continue
            if preset.state == LOADING:
                seen_loading = True
            result = self.presets.jobs.get(job) if job else None
            # a state from before this start ("failed" last time) is not its outcome
            ended = seen_loading or result is not None
            if ended and preset.state in (FAILED, INACTIVE) or (
                    result is not None and result != "done" and preset.state != LOADING):
                if job and result is None and not job_awaited:
                    # its JobFinished follows with the engine's own words (the status
                    # is often the load's last progress line): a moment for it
                    job_awaited = True
                    await self._job_end(preset, job)
                    continue
                detail = self.presets.job_details.get(job, "") if job else ""
                if not detail:   # no word on this start (its job's end not heard): the
                    # daemon may still be reading it out of memory (lines from the journal)
                    detail = await self._raised(preset, asked_needs, job)
                reason = detail or preset.status or result or preset.state
                if "out of memory" not in reason:
                    reason = _out_of_memory(preset, asked_needs) or reason
                # held against the need it was asked with: one the daemon raised since
                # (out of memory) is a start placed anew, however late the raise came
                self._fail(preset, f"preset {preset.name!r} failed to start: {reason}",
                           asked_needs)
            await self.presets.changed(preset, 5.0)

    async def _job_end(self, preset: Preset, job: str) -> None:
        """Until the daemon's JobFinished of ``job`` is heard, :data:`JOB_LAG` at most, or
        lokid leaves the bus. Not until the preset's next change: under systemd the same
        failure sends the preset's State, OnDemandState and the restart's pause before the
        job's end, whose words (the daemon read the engine's lines for them) were then
        never read: clients got the raised need's or the load's progress's wording."""
        deadline = time.monotonic() + JOB_LAG
        while job not in self.presets.jobs and not self.presets.unreachable:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            await self.presets.changed(preset, left)

    async def _raised(self, preset: Preset, asked_needs: str, job: str | None) -> str:
        """Why the start failed, once the daemon raised the preset's need after it ran out
        of memory (:func:`_out_of_memory`), or its job's end came with its words (late),
        within :data:`OOM_LAG`; "" when neither did."""
        deadline = time.monotonic() + OOM_LAG
        while not (said := _out_of_memory(preset, asked_needs)):
            if job and self.presets.job_details.get(job):
                return self.presets.job_details[job]
            left = deadline - time.monotonic()
            if left <= 0:
                return ""
            await self.presets.changed(preset, min(left, 0.25))   # Memory: no waiter's
        return said

    async def _ask(self, preset: Preset) -> str | None:
        """StartForRequest after any stop under way: the job, or None when lokid is not
        on the bus to take it (GatewayError for a refusal: the preset's failure)."""
        while preset.state == STOPPING:   # a stop under way: start after it
            await self.presets.changed(preset, 5.0)
        try:
            return await start_for_request(self.presets, preset.name)   # a cold start
        except DBusError as e:
            if self.presets.unreachable or e.type in GONE:
                return None
            self._fail(preset, f"preset {preset.name!r} cannot start: {e.text}")

    async def _daemon_back(self, preset: Preset, generation: int) -> None:
        """Until lokid is on the bus again and its presets are read; a 503 that holds
        nothing when it is not back within DAEMON_BACK."""
        deadline = time.monotonic() + DAEMON_BACK
        if not self.presets.unreachable and self.presets.generation == generation:
            # a call said lokid is gone before the bus's signal of it came: wait for that
            # (or a second, for a daemon that only did not answer in time)
            await self.presets.changed(preset, 1.0)
        while self.presets.unreachable:
            left = deadline - time.monotonic()
            if left <= 0:
                raise GatewayError(503, f"preset {preset.name!r} was starting when lokid left "
                                   f"the bus, and lokid is not back after {DAEMON_BACK:.0f} s "
                                   "(lokid.service): try again once it runs", UNAVAILABLE,
                                   "lokid_unreachable")
            await self.presets.changed(preset, min(left, 5.0))

    def _fail(self, preset: Preset, reason: str, needs: str | None = None) -> NoReturn:
        self.failed[preset.name] = (time.monotonic() + FAILED_HOLD, reason,
                                    _needs(preset) if needs is None else needs)
        raise GatewayError(503, reason, UNAVAILABLE, "model_start_failed")
