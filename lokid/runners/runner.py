"""The runner interface: how the daemon starts, stops and follows the engines.

Two implementations, one contract:

- :mod:`lokid.runners.systemd_runner` drives ``loki-engine@<preset>.service`` through
  systemd's own D-Bus API (``org.freedesktop.systemd1``) and learns the
  engines' state from the units' ``PropertiesChanged`` signals;
- :mod:`lokid.runners.local_runner` runs ``lokid prestart`` and ``lokid engine`` as
  the daemon's own children where no system manager is reachable, with the
  unit's semantics (attempt token, READY through a notify socket, restart on
  failure with a limit).

Both report every change of an engine as an :class:`EngineState` to the
callback the daemon gives them; the daemon turns it into properties and the
``EngineStateChanged`` signal. The verbs return once the start or stop is
under way, with the id of its *job*; the job's end (systemd's ``JobRemoved``:
``done``, ``failed``, ``canceled``, ``timeout``…) goes to a second callback,
so that a caller waiting for one verb learns its outcome, and not some state
on the way (a restart passes through ``inactive``). A long job never blocks a
D-Bus call. Each runner also says how the benchmark reads its engine's disk
reads and memory (the thrash hint): the unit's cgroup counters under
systemd, the engine process's ``/proc`` files for the daemon's own children.

The mapping from a unit's (ActiveState, SubState) to lokid's five states is
here, pure, so that both runners and the tests agree on it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..core.bench.iosample import IOSampler

INACTIVE, LOADING, READY, FAILED, STOPPING = "inactive", "loading", "ready", "failed", "stopping"
# States in which the engine's processes exist (the preset is "active").
LIVE = frozenset({LOADING, READY, STOPPING})


@dataclass(frozen=True)
class EngineState:
    """What an engine is doing now.

    ``status`` is the supervisor's STATUS= text; ``detail`` says why the state
    is what it is (a job result, an exit status, a restart) and is what
    ``EngineStateChanged`` carries.
    """

    state: str = INACTIVE
    status: str = ""
    detail: str = ""


Listener = Callable[[str, EngineState], None]
# (preset, job id, verb, result): a job ended. Results are systemd's job results.
JobListener = Callable[[str, str, str, str], None]
DONE, JOB_FAILED, CANCELED = "done", "failed", "canceled"


RESTARTING = "restarting after a failure"   # the detail of systemd's pause before a restart


def restarting(state: EngineState) -> bool:
    """Whether the engine failed and waits to be started again: systemd's pause before
    Restart=on-failure's next try, or the local runner's (its detail says so)."""
    return state.state == LOADING and state.detail.startswith((RESTARTING, "restarting in "))


def unit_state(active: str, sub: str, result: str = "") -> tuple[str, str]:
    """lokid's state and a detail for a unit's ActiveState/SubState/Result.

    ``activating`` covers ExecStartPre and the load (a Type=notify unit is
    ``active`` only after READY=1); ``activating/auto-restart`` is the pause
    between a failure and systemd's next try.
    """
    if active == "active" or active == "reloading":
        return READY, ""
    if active == "activating":
        if sub == "auto-restart":
            return LOADING, RESTARTING + (f" ({result})" if result and
                                                            result != "success" else "")
        return LOADING, ""
    if active == "deactivating":
        return STOPPING, ""
    if active == "failed":
        return FAILED, f"the unit failed ({result})" if result and result != "success" \
            else "the unit failed"
    return INACTIVE, ""


class Runner(ABC):
    """Starts, stops and follows the engines of presets; reports changes to ``listener``."""

    kind = ""

    def __init__(self, listener: Listener, on_job: JobListener | None = None):
        self.listener = listener
        self.on_job = on_job
        self.states: dict[str, EngineState] = {}

    def state(self, preset: str) -> EngineState:
        return self.states.get(preset, EngineState())

    def _set(self, preset: str, state: EngineState) -> None:
        if self.states.get(preset, EngineState()) == state:
            return
        self.states[preset] = state
        self.listener(preset, state)

    def _job_done(self, preset: str, job: str, verb: str, result: str) -> None:
        if self.on_job is not None:
            self.on_job(preset, job, verb, result)

    @abstractmethod
    async def attach(self) -> None:
        """Begin following the engines (called once the daemon's loop runs)."""

    @abstractmethod
    async def track(self, presets: list[str]) -> None:
        """Follow these presets' engines (after a load or reload): learn their state now."""

    @abstractmethod
    async def start(self, preset: str) -> str:
        """Start the preset's engine (nothing if it runs or is loading); the job's id."""

    @abstractmethod
    async def stop(self, preset: str) -> str:
        """Stop the preset's engine (nothing if it is not running); the job's id."""

    @abstractmethod
    async def restart(self, preset: str) -> str:
        """Stop the engine if it runs, then start it; the job's id."""

    @abstractmethod
    async def io_sampler(self, preset: str) -> IOSampler | None:
        """A sampler of the running engine's disk reads and memory (the benchmark's thrash
        hint), each from where this runner can read them; None when it cannot."""

    async def held_memory(self, preset: str) -> int | None:
        """What the running engine holds in the host's memory, page cache of the files it
        only read left out (a footprint's host figure); None where this runner cannot tell
        (the footprint then takes the sampler's figure)."""
        return None

    async def engine_pids(self, preset: str) -> list[int]:
        """The processes of the preset's running start (the supervisor, the engine and
        anything they started); [] when it does not run or this runner cannot tell."""
        return []

    def restarts(self, preset: str) -> int | None:
        """Automatic restarts of the engine since the last start by hand (systemd's
        NRestarts), None when this runner cannot tell."""
        return None

    async def reload(self) -> None:  # noqa: B027 - optional hook
        """The presets were read again (the systemd runner reruns the generator)."""

    @abstractmethod
    async def close(self) -> None:
        """Stop following (the local runner also stops its engines: they are its children)."""
