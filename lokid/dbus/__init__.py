"""The daemon, ``lokid daemon``: the D-Bus API (the interface classes only delegate), the
registry it serves, the authorisation, editing and telemetry.

Who runs it: systemd (``lokid.service``), or a developer on the session bus.
May import: every package below it (:mod:`lokid.core`, :mod:`lokid.host`,
:mod:`lokid.store`, :mod:`lokid.planning`, :mod:`lokid.unit`, :mod:`lokid.runners`,
:mod:`lokid.watch`, :mod:`lokid.bench`); the commands (``lokid``, lokictl) are above it.
"""
