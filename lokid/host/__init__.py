"""The host seen from any lokid process: /proc, the engine binary, one bus call, sd_notify,
lokid's own journal lines, the files secrets are read from.

Who runs it: every process of lokid (the ``lokid`` command and the unit's helpers, the
daemon, the benchmark, lokictl for its one bus call). Thin edges, each with one job.
May import: :mod:`lokid.core` only.
"""
