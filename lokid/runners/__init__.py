"""How the daemon starts, stops and follows engines: one contract, two runners.

Who runs it: the daemon (``lokid daemon``). The systemd runner drives
``loki-engine@.service`` units over systemd's D-Bus API; the local runner, where no
system manager is reachable, runs the unit's steps as the daemon's own children.
May import: :mod:`lokid.core`, :mod:`lokid.host`, :mod:`lokid.store`,
:mod:`lokid.planning`, :mod:`lokid.unit`.
"""
