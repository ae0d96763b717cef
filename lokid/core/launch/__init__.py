"""From a preset to an engine's start: the plan (``plan``, ``spec``, ``flags``, ``caps``,
``drafts``, ``gpuselect``), the one typed value ``lokid prestart`` writes
(``runtimeplan``), and the rules around a start: attempts and the crash loop
(``attempt``, ``crashloop``), ports and who holds them (``conflicts``, ``portunit``), and
a stop that waits for the gateway's drain (``drainmark``).

Who uses it: ``lokid prestart`` and ``lokid plan``, the daemon (state, starts, the
benchmark's facts), the gateway (ports, drain).
May import: :mod:`lokid.core.config`, :mod:`lokid.core.model`, :mod:`lokid.core.serve`
(replicas and the ``[serve]`` table a plan reads), :mod:`lokid.core.fleet` (the RPC
backend's flags), and the core's root modules.
"""
