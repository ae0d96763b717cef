"""lokid's own files, shared by the processes that read and write them: the state DB
(attempt tokens, failure verdicts, bench results), the usage DB (the gateway's counts,
the daemon's alone), the runtime directory (each start's plan, its hand-off, its exits,
the plan cache), the preset files the daemon writes, and noticing when configuration
files change.

Who runs it: the unit's helpers (prestart, engine, stopped), the daemon, ``lokid plan``
and the benchmark; every file here has one writer at a time, said in its module.
May import: :mod:`lokid.core` and :mod:`lokid.host`.
"""
