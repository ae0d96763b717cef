"""``lokictl``: the operator's client of ``org.lokid.Lokid1``, a thin D-Bus client.

Who runs it: operators, on the server or over ssh (``--host``). Modules, imports pointing
one way: :mod:`~lokid.ctl.main` (the command table) over the commands
(:mod:`~lokid.ctl.commands`, :mod:`~lokid.ctl.edit`, :mod:`~lokid.ctl.stats`,
:mod:`~lokid.ctl.logs`), all over the bus client (:mod:`~lokid.ctl.client`).
May import: :mod:`lokid.core`, :mod:`lokid.host` (its one bus call), :mod:`lokid.dbus.wire`
(the connection Debian 12's dbus-fast needs); never the daemon.
"""
