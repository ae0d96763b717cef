"""The benchmark's rules, without its I/O: the protocol and a result's keys (``rules``), a
repeated run's median and spread (``repeat``), the slot it runs in (``slot``) and the disk
and memory samples of its thrash hint (``iosample``).

Who uses it: :mod:`lokid.bench` (the measuring side), the daemon and lokictl (saved
results), ``lokid bench``.
May import: :mod:`lokid.core.config` (the reasoning efforts), :mod:`lokid.core.launch`
(the flags and the plan a result is kept under), and the core's root modules.
"""
