"""``gpus = "auto"`` and ``gpu_count = N``: the GPUs of one start, chosen by ``lokid
prestart`` (issue 29, item 3).

The start is sized as ``lokid plan`` sizes it (:func:`lokid.planning.sizing.memory_now`:
the footprint measured for the plan's key, else the estimate; for ``auto``, the fewest
GPUs whose even share fits), the devices are read now (NVML, else the engine's
``--list-devices``), and :func:`lokid.core.place.choose.choose` picks the best fit. The
choice goes into the runtime plan, never into the unit: ``CUDA_VISIBLE_DEVICES`` in its
environment, with ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` (NVML numbers GPUs in PCI bus order,
CUDA fastest first, which differ on a host of mixed GPUs; the engine's ``--list-devices``
is read in that order too) and a Vulkan engine's ``--device``, as for ``gpus = [n]``
(:func:`lokid.core.launch.plan.gpu_env`), a note saying why (the journal has it too), and its
``claim``, the bytes it expects to take on each chosen GPU.

Two starts choosing at once (the gateway starting two presets, two ``systemctl start``)
must not both see the same free memory: the choice and the runtime plan's write are made
under one lock (``gpu-choice.lock`` in the runtime directory), and a start still loading
(its runtime plan has a ``claim``, no READY is recorded, and its supervisor runs or the
plan was written less than 30 s ago) counts its claim as taken, less what its engine's
processes already hold per the driver (NVML); with ``--list-devices`` alone, its whole
claim.

A host where no GPU is found (a CPU build, no driver, none listed) chooses nothing: the
engine sees what it would without lokid, and the note says so. MIG instances are not
chosen from: the choice is written as indices, and CUDA takes an instance by its UUID
only (pin one with ``gpus = "MIG-…"``).
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from ..core.launch.attempt import Mark
from ..core.launch.plan import Plan, PlanInputs, gpu_env
from ..core.launch.runtimeplan import RuntimePlan
from ..core.place.choose import Choice, choose
from ..core.record import replace
from ..host.devices import Room
from ..store.runtimedir import RUNTIME_SUFFIX
from .sizing import Memory

LOCK = "gpu-choice.lock"
CLAIM_GRACE = 30.0    # seconds a claim counts with no supervisor seen yet
ANCESTRY = 6          # parents walked from a GPU process up to a start's supervisor


@contextmanager
def choosing(runtime_dir: str) -> Iterator[None]:
    """One choice at a time on this host, its runtime plan written inside."""
    os.makedirs(runtime_dir, exist_ok=True)
    fd = os.open(os.path.join(runtime_dir, LOCK), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o640)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _parent(pid: int, proc: str) -> int:
    try:
        with open(f"{proc}/{pid}/stat", "rb") as f:
            stat = f.read().decode("utf-8", "replace")
        return int(stat.rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def _under(pid: int, ancestor: int, proc: str) -> bool:
    for _ in range(ANCESTRY):
        if pid == ancestor:
            return True
        if pid <= 1:
            return False
        pid = _parent(pid, proc)
    return False


def _recent(runtime_dir: str, file: str) -> bool:
    """Written less than CLAIM_GRACE ago: under systemd, prestart (the pid written) has
    exited and ``lokid engine`` has not yet written its own pid."""
    try:
        return time.time() - os.stat(os.path.join(runtime_dir, file)).st_mtime < CLAIM_GRACE
    except OSError:
        return False


def claimed(runtime_dir: str, name: str, processes: Mapping[str, Mapping[int, int]] | None,
            proc: str = "/proc") -> dict[str, int]:
    """Bytes per GPU that other starts still loading have claimed and not taken yet.
    ``processes``: per GPU, the driver's pid → bytes (None: not known)."""
    from ..core.errors import StalePlanError
    from ..store import exits
    from ..store.runtimedir import read_runtime_plan

    out: dict[str, int] = {}
    try:
        files = [f for f in os.listdir(runtime_dir) if f.endswith(RUNTIME_SUFFIX)]
    except OSError:
        return out
    for file in files:
        other = file[:-len(RUNTIME_SUFFIX)]
        if other == name:
            continue
        try:
            rp = read_runtime_plan(runtime_dir, other)
        except StalePlanError:
            continue
        if not rp.claim or exits.was_ready(runtime_dir, other, rp.invocation):
            continue
        if not (rp.pid and os.path.exists(f"{proc}/{rp.pid}")) and not _recent(runtime_dir,
                                                                               file):
            continue   # its supervisor is gone, and not for a moment between two steps
        for gpu, nbytes in rp.claim.items():
            taken = 0
            if processes is not None:
                taken = sum(n for pid, n in processes.get(gpu, {}).items()
                            if _under(pid, rp.pid, proc))
            if nbytes > taken:
                out[gpu] = out.get(gpu, 0) + nbytes - taken
    return out


def sibling_gpus(runtime_dir: str, name: str, proc: str = "/proc") -> frozenset[str]:
    """The GPUs the other engines of ``name``'s preset run or load on (its replicas and
    its own, lokid.core.serve.replicas): their runtime plans' claims, else the GPUs their
    environment shows, for those whose supervisor runs."""
    from ..core.errors import StalePlanError
    from ..core.serve.replicas import preset_of
    from ..store.runtimedir import read_runtime_plan

    base = preset_of(name)
    try:
        others = [f[:-len(RUNTIME_SUFFIX)] for f in os.listdir(runtime_dir)
                  if f.endswith(RUNTIME_SUFFIX)]
    except OSError:
        return frozenset()
    out: set[str] = set()
    for other in others:
        if other == name or preset_of(other) != base:
            continue
        try:
            rp = read_runtime_plan(runtime_dir, other)
        except StalePlanError:
            continue
        if not (rp.pid and os.path.exists(f"{proc}/{rp.pid}")):
            continue   # not running: its GPUs are free for this one
        visible = rp.env.get("CUDA_VISIBLE_DEVICES", "")
        out |= set(rp.claim) or {f"GPU{i}" for i in visible.split(",") if i.isdigit()}
    return frozenset(out)


def place(plan: Plan, inputs: PlanInputs, runtime_dir: str, state_dir: str, *,
          gpu: object | None = None, gpu_engine: bool | None = None, proc: str = "/proc"
          ) -> tuple[Plan, Choice, dict[str, int]]:
    """The plan with the GPUs chosen for this start (CUDA_VISIBLE_DEVICES and a note),
    the choice, and the start's claim per GPU, the devices read now. Call it under
    :func:`choosing`. ``gpu_engine``: whether the engine has a GPU backend (None: from
    its files)."""
    from ..host.nvml import GpuMemory
    from ..planning.sizing import memory_now

    if plan.gpu_choice is None or "CUDA_VISIBLE_DEVICES" in plan.env:
        return plan, Choice((), ""), {}
    try:
        memory, room = memory_now(plan, inputs, state_dir,
                                  gpu if gpu is not None else GpuMemory(), gpu_engine)
    except Exception as e:   # a KV type the estimate does not know, a defect: say, go on
        choice = Choice((), f"the GPUs could not be chosen ({type(e).__name__}: {e}): the "
                        "engine sees every GPU it finds")
        return replace(plan, notes=(*plan.notes, choice.why)), choice, {}
    return choose_for(plan, inputs, memory, room, runtime_dir, proc)


def choose_for(plan: Plan, inputs: PlanInputs, memory: Memory, room: Room, runtime_dir: str,
               proc: str = "/proc") -> tuple[Plan, Choice, dict[str, int]]:
    """:func:`place` on the plan's memory and the room already read (``lokid plan``
    has both): the plan with its GPUs, the choice, the claim."""
    if plan.gpu_choice is None or "CUDA_VISIBLE_DEVICES" in plan.env:
        return plan, Choice((), ""), {}
    need = memory.sizing.need
    taken = claimed(runtime_dir, plan.preset, room.processes, proc)
    reserve = {d.name: d.reserve for d in room.devices}
    left = {g: room.free.get(g, 0) - reserve.get(g, 0) - taken.get(g, 0)
            for g in room.whole_gpus()}
    choice = choose(need.count, need.per_gpu, left, taken,
                    sibling_gpus(runtime_dir, plan.preset, proc))
    if not choice.gpus:
        why = choice.why + "".join(f"; {n}" for n in room.notes)
        return replace(plan, notes=(*plan.notes, why)), choice, {}
    selected, note = gpu_env(inputs, choice.visible())
    claim = {g: need.per_gpu for g in choice.gpus}
    notes = (*plan.notes, choice.why, *([note] if note else []))
    return replace(plan, env={**plan.env, **selected}, notes=notes), choice, claim


def place_and_write(plan: Plan, mark: Mark, inputs: PlanInputs, runtime_dir: str,
                    state_dir: str, invocation: str) -> tuple[Plan, RuntimePlan]:
    """Prestart's step for a start whose GPUs lokid chooses: the choice and the runtime
    plan that carries it (with its claim) written under the lock, this process's pid in
    it. The plan and the runtime plan."""
    from ..store.runtimedir import write_runtime_plan

    with choosing(runtime_dir):
        plan, _, claim = place(plan, inputs, runtime_dir, state_dir)
        rp = replace(RuntimePlan.of(plan, mark, invocation, pid=os.getpid()), claim=claim)
        write_runtime_plan(runtime_dir, rp)
    return plan, rp
