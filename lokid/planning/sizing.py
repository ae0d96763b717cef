"""A planned start's memory: its need per device and whether this host can ever hold it
(issue 29, items 2 and 4), as ``lokid plan`` and the daemon say it.

The need is :func:`lokid.core.place.need.size_plan` over the plan, its model's header,
the files loaded beside it and the footprint kept for the plan's memory key (the state
DB, read only); the room is :func:`lokid.host.devices.read_room`. A preset that needs
more on a device than the device has with every engine stopped and its reserve kept
(:func:`lokid.core.place.policy.never_fits`) is refused with the figures: starting it
could only fail out of memory. A device whose room could not be read (``Room.unknown``)
refuses nothing: the need on it is said with the reason its room is unknown
(``room_unknown``), so an operator sees why lokid does not place it (issue 44, item 10).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ..core.errors import ConfigError, DoesNotFitError
from ..core.launch.flags import flag_value
from ..core.launch.plan import Plan, PlanInputs
from ..core.place.footprint import Footprint, memory_key
from ..core.place.need import DRAFT, MMPROJ, Sizing, size_plan
from ..core.place.policy import ANY_GPU, Device, never_fits, room_unknown
from ..host.devices import Room

# what an operator can do about a preset this host can never hold
REMEDY = "lower ctx, gpu_layers or the KV cache type, or run it on a larger host"


def memory_key_of(plan: Plan, inputs: PlanInputs) -> str:
    """The footprint key of a plan: its arguments, its model file as it is on disk now
    (an overwritten file is another model), the engine's build and the GPUs it sees."""
    try:
        st = os.stat(inputs.model_path)
        model = (inputs.model_path, st.st_size, st.st_mtime_ns)
    except OSError:
        model = (inputs.model_path, inputs.model.file_size, 0)
    return memory_key(plan.argv, model, f"{inputs.caps.build}|{inputs.caps.path}|"
                      f"{plan.env.get('CUDA_VISIBLE_DEVICES', '')}")


def _file_size(path: str | None) -> int:
    if not path:
        return 0
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def extra_files(plan: Plan) -> dict[str, int]:
    """Bytes of the files the engine loads beside its model: a projector, a draft."""
    args = plan.argv[1:]
    return {name: _file_size(flag_value(args, *flags))
            for name, flags in (("mmproj", MMPROJ), ("draft model", DRAFT))
            if flag_value(args, *flags)}


@dataclass(frozen=True)
class Memory:
    """A plan's need on this host, why it can never fit ("" when it can), and the devices
    of its need whose room is unknown, with why (``ANY_GPU``: the GPUs chosen at start)."""

    sizing: Sizing
    never: str
    unknown: Mapping[str, str] = field(default_factory=dict)

    @property
    def text(self) -> str:
        """The need in one line, and what of it is not placed for want of a room."""
        parts = [self.sizing.text]
        for device, why in sorted(self.unknown.items()):
            whose = "the GPUs'" if device == ANY_GPU else f"{device}'s"
            parts.append(f"{whose} room is unknown ({why}): not placed by it")
        return "; ".join(parts)

    def to_json(self) -> dict[str, object]:
        return {"needs": dict(self.sizing.need.fixed),
                **({"per_gpu": self.sizing.need.per_gpu, "gpu_count": self.sizing.need.count}
                   if self.sizing.need.count else {}),
                "sources": dict(self.sizing.sources), "text": self.text,
                **({"room_unknown": dict(self.unknown)} if self.unknown else {}),
                **({"does_not_fit": self.never} if self.never else {})}


def size(plan: Plan, inputs: PlanInputs, room: Room, gpu_engine: bool,
         footprint: Footprint | None = None, cost: float | None = None) -> Memory:
    """The plan's need on ``room``'s devices and whether it can ever fit there. Raises
    ConfigError for a KV cache type the estimate does not know (the engine refuses it
    too)."""
    try:
        sizing = size_plan(plan.preset, plan.argv, plan.env, inputs.model,
                           host_gpus=room.gpus(), gpu_free=room.free, gpu_engine=gpu_engine,
                           extra=extra_files(plan), footprint=footprint, cost=cost,
                           gpu_choice=plan.gpu_choice,
                           gpu_capacity={d.name: d.capacity for d in room.devices},
                           gpu_uuids=room.uuids)
    except ValueError as e:
        raise ConfigError(str(e), inputs.preset.path) from None
    return Memory(sizing, never_fits_here(plan.argv, sizing, room.devices, room.unknown),
                  room_unknown(sizing.need, room.devices, room.unknown))


def never_fits_here(argv: Sequence[str], sizing: Sizing, devices: Sequence[Device],
                    unknown: Mapping[str, str] | None = None) -> str:
    """Why the plan can never fit on this host ("" when it can). A plan split with RPC
    workers (--rpc) is never refused so: the estimate counts every layer here, where the
    engine puts some on the workers (their devices are not this host's). Nor is a need
    on a device whose room is ``unknown`` (``Room.unknown``)."""
    from ..core.fleet.rpc import workers_of

    return "" if workers_of(argv) else never_fits(sizing.need, devices, unknown)


def refuse(memory: Memory, preset: str) -> None:
    """DoesNotFitError with the figures when the plan can never fit on this host."""
    if memory.never:
        basis = memory.sizing.basis or memory.sizing.head
        raise DoesNotFitError(f"preset {preset!r} {memory.never} ({basis}): {REMEDY}")


def memory_now(plan: Plan, inputs: PlanInputs, state_dir: str, gpu: object | None = None,
               gpu_engine: bool | None = None) -> tuple[Memory, Room]:
    """The plan's memory on this host as it is now: the room read (NVML through ``gpu``,
    else the engine's --list-devices), the footprint kept for the plan's key (read only).
    ``gpu_engine``: whether the engine has a GPU backend (None: from its library files)."""
    from ..core.launch.gpuselect import listing_env
    from ..host.devices import listed_gpus, read_room
    from ..host.probe import engine_gpu_backends
    from ..store.state import StateReader

    if gpu_engine is None:
        backends = engine_gpu_backends(inputs.caps.path)
        gpu_engine = backends is None or backends != ()   # a static build: it may have one
    # --list-devices in the order lokid gives its engines (PCI bus: NVML's numbering)
    room = read_room(inputs.config.placement, engine=inputs.caps.path, gpu_engine=gpu_engine,
                     gpu=gpu, lister=lambda e: listed_gpus(e, listing_env(os.environ)))
    with StateReader(state_dir) as db:
        found = db.footprint(plan.preset, memory_key_of(plan, inputs))
    cost = found.load_seconds if found is not None else None
    return size(plan, inputs, room, gpu_engine, found, cost), room
