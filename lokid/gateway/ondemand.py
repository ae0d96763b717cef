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
  retrying in a loop does not restart a broken engine in a loop;
- a preset not on demand is never started by a request: the reply says
  ``lokictl start <preset>``;
- no wait is endless: :data:`START_TIMEOUT` bounds a start.
"""

from __future__ import annotations

import asyncio
import time

from dbus_fast import DBusError

from .presets import Preset, Presets
from .replies import UNAVAILABLE, GatewayError
from .report import start_for_request

READY, LOADING, FAILED, INACTIVE, STOPPING = "ready", "loading", "failed", "inactive", "stopping"
START_TIMEOUT = 600.0
FAILED_HOLD = 30.0


class Starter:
    def __init__(self, presets: Presets):
        self.presets = presets
        self.starting: dict[str, asyncio.Task[None]] = {}
        self.failed: dict[str, tuple[float, str]] = {}   # preset → (until, reason)

    async def url(self, preset: Preset) -> str:
        """The URL of the preset's ready engine; GatewayError (503) when there is none."""
        if preset.state == READY and preset.url:
            self.failed.pop(preset.name, None)
            return preset.url
        if preset.state not in (LOADING, STOPPING) and not preset.on_demand:
            raise GatewayError(503, f"preset {preset.name!r} is not running ({preset.state}): "
                               f"start it with `lokictl start {preset.name}`", UNAVAILABLE,
                               "model_not_running")
        held = self.failed.get(preset.name)
        if held is not None and held[0] > time.monotonic() and preset.state != LOADING:
            raise GatewayError(503, held[1], UNAVAILABLE, "model_start_failed")
        task = self.starting.get(preset.name)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._start(preset))
            self.starting[preset.name] = task
            task.add_done_callback(lambda t: self._done(preset.name, t))
        await asyncio.shield(task)   # the start goes on if this request is cancelled
        return preset.url

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
        job = ""
        if preset.state in (INACTIVE, FAILED) or (preset.state == STOPPING and preset.on_demand):
            while preset.state == STOPPING:   # a stop under way: start after it
                await self.presets.changed(preset, 5.0)
            try:
                job = await start_for_request(self.presets, preset.name)   # a cold start
            except DBusError as e:
                self._fail(preset, f"preset {preset.name!r} cannot start: {e.text}")
            seen_loading = False
        else:
            seen_loading = True
        while True:
            if preset.state == READY and preset.url:
                self.failed.pop(preset.name, None)
                return
            if preset.state == LOADING:
                seen_loading = True
            result = self.presets.jobs.get(job) if job else None
            # a state from before this start ("failed" last time) is not its outcome
            ended = seen_loading or result is not None
            if ended and preset.state in (FAILED, INACTIVE) or (
                    result is not None and result != "done" and preset.state != LOADING):
                reason = preset.status or result or preset.state
                self._fail(preset, f"preset {preset.name!r} failed to start: {reason}")
            await self.presets.changed(preset, 5.0)

    def _fail(self, preset: Preset, reason: str) -> None:
        self.failed[preset.name] = (time.monotonic() + FAILED_HOLD, reason)
        raise GatewayError(503, reason, UNAVAILABLE, "model_start_failed")
