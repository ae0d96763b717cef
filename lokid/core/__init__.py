"""The pure core: config and presets, the model header, engine capabilities and flags,
speculation rules, the plan, the engine-log parser, attempt and benchmark rules,
names and errors.

No I/O beyond reading the files it is pointed at; it never imports
dbus_fast, systemd, httpx, sdnotify, subprocess, socket, asyncio or urllib
(tests/core/test_purity.py).

Who runs it: every lokid process. May import: the standard library and pure libraries
(tomlkit, gguf); nothing of lokid outside :mod:`lokid.core`.
"""
