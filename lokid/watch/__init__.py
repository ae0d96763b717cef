"""Following the engines: their journal (events, the layers-in-RAM verdict, logs read for
a caller), their telemetry counted, GPU memory from NVML, the Prometheus textfile.

Who runs it: the daemon, and ``lokid watch`` (the journal watcher alone).
May import: everything below the daemon: :mod:`lokid.core`, :mod:`lokid.host`,
:mod:`lokid.store`, :mod:`lokid.planning`, :mod:`lokid.runners` (engine states).
"""
