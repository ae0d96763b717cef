"""Placement by measured memory (issue 29): the room of each device, each preset's
footprint (estimated from its GGUF header, then measured), and the rule that places
engines and evicts idle ones so that a start never fails for memory. Pure: the daemon
and the gateway feed it figures and carry out what it says.

Who uses it: the gateway (where an engine starts, which idle one makes room), the daemon
and the planner (room, footprints, ``lokid plan``'s need), the runners and the store.
May import: :mod:`lokid.core.config`, :mod:`lokid.core.launch` (the placement flags),
:mod:`lokid.core.model` (the GGUF header), :mod:`lokid.core.serve` (replicas, swaps),
and the core's root modules.
"""
