"""Many servers, one endpoint (issue 30): the pure rules of a fleet of lokid hosts.

The peers a gateway routes to (``peers``) and what it keeps of their lists
(``listing``), which host answers a request (``route``), and one model across hosts
with llama.cpp's RPC backend (``rpc``, ``worker``).

Who uses it: the gateway, the daemon, the planner (an RPC preset's flags), the unit
generator and ``lokid rpc-worker``.
May import: :mod:`lokid.core.config` (the TOML reading, secrets, external presets),
:mod:`lokid.core.model` (what a model can do), :mod:`lokid.core.serve` (affinity and
prefixes), and the core's root modules.
"""
