"""What a preset's replicas hold, for the gateway's placement (issue 47, item 1).

The placement (:mod:`lokid.gateway.placer`) counts each running preset's engine as a
:class:`~lokid.core.place.policy.Resident` holding its need where its start put it. A
replica past the first is an engine of its own, on the GPUs its start chose
(``gpus = "auto"`` puts it apart from its siblings) or in the host's memory; counted
nowhere, the room it took looked free: the rule granted another preset's start there,
and that engine could not load (the daemon's ``Devices`` leave lokid's engines out of
what "other processes" hold, so nothing else counted it either).

Rules, each for the failure it prevents:

- each live replica is a resident named ``NAME:k`` holding what the daemon says it
  holds (the preset's ``Memory``, ``replicas_held``: its own start's sizing);
- it is **kept** (never a victim of the rule's evictions): it is not a preset the rule
  can stop and start again on demand; the scaling rule (:mod:`lokid.core.serve.scaling`)
  stops those it started once idle, and the operator's are the operator's;
- one starting or stopping counts as such (its room is taken, or soon freed), and its
  requests in flight are its row's.

Pure over the gateway's view of a preset: no I/O.
"""

from __future__ import annotations

from ..core.place.policy import Resident
from ..core.serve.swaps import NEVER
from .presets import Preset

GONE = ("inactive", "failed")


def replica_residents(p: Preset) -> list[Resident]:
    """The residents of ``p``'s replicas 2 and up that run, start or stop."""
    held = p.memory.get("replicas_held")
    if not isinstance(held, dict):
        return []
    engines = {e.index: e for e in p.engines}
    out = []
    for k, devices in held.items():
        e = engines.get(int(k)) if isinstance(k, str) and k.isdigit() else None
        if e is None or e.index < 2 or e.state in GONE or not isinstance(devices, dict):
            continue
        out.append(Resident(
            f"{p.name}:{e.index}",
            {str(d): n for d, n in devices.items() if isinstance(n, int) and n >= 0},
            in_flight=e.in_flight, ready_since=e.ready_at if e.state == "ready" else NEVER,
            keep=True, starting=e.state not in ("ready", "stopping"),
            stopping=e.state == "stopping"))
    return out
