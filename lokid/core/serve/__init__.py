"""How presets are served behind one endpoint: the ``[serve]`` table (``tables``), swaps in
a GPU group (``swaps``), replicas and when to add one (``replicas``, ``scaling``), which
replica gets a request (``affinity``, ``prefixes``), the named client keys (``keys``),
fair share and who waits (``fairshare``, ``waiting``), and the usage counts (``usage``).

Who uses it: the gateway (routing, admission, keys), the daemon (its properties, usage,
the starts of replicas), the planner (a replica's port and unit).
May import: :mod:`lokid.core.config` (the TOML reading helpers and the preset name rule),
:mod:`lokid.core.fleet` (the peers a ``[gateway]`` table names), and the core's root
modules.
"""
