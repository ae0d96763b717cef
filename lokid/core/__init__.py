"""The pure core: the rules of lokid, without I/O, grouped by topic.

- :mod:`lokid.core.config`: config files and presets, read into typed values and edited
  with their comments kept; secrets, external presets, aliases.
- :mod:`lokid.core.model`: the GGUF header, what a model can do, a model pulled from
  the hub.
- :mod:`lokid.core.launch`: from a preset to an engine's start: engine capabilities and
  flags, speculation, the plan and the runtime plan, attempts and the crash loop, ports.
- :mod:`lokid.core.telemetry`: what an engine says (log lines, requests, its last
  error) and the figures an operator reads.
- :mod:`lokid.core.bench`: the benchmark's rules.
- :mod:`lokid.core.serve`: serving behind one endpoint: swaps, replicas and scaling,
  affinity, client keys, fair share, who waits, usage.
- :mod:`lokid.core.place`: placement by measured memory.
- :mod:`lokid.core.fleet`: a fleet of lokid hosts, peers and RPC workers.
- At the root, the words every topic shares: ``errors`` (and their D-Bus names),
  ``names``, ``paths``, ``record``, ``wording``, ``timespec``, ``access``, ``address``.

Each topic's ``__init__`` says who uses it and which other topics it may import
(tests/test_layout.py holds it to that); the root modules may be imported by any.

No I/O beyond reading the files it is pointed at; it never imports
dbus_fast, systemd, httpx, sdnotify, subprocess, socket, asyncio or urllib
(tests/core/test_purity.py).

Who runs it: every lokid process. May import: the standard library and pure libraries
(tomlkit, gguf); nothing of lokid outside :mod:`lokid.core`.
"""
