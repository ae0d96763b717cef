"""The gateway: one HTTP endpoint for every preset, routed by the request's ``model``.

Who runs it: ``lokid gateway`` (its own process, later its own socket-activated unit), a
client of the daemon over D-Bus like ``lokictl``: a fault in one never takes the other
down. Modules, imports pointing one way: :mod:`~lokid.gateway.server` (the HTTP routes)
over :mod:`~lokid.gateway.groups` (one preset of a GPU group at a time) over
:mod:`~lokid.gateway.ondemand` (a start for a request) over
:mod:`~lokid.gateway.presets` (the daemon's presets, followed by signals),
:mod:`~lokid.gateway.report` (its requests and swaps counted, handed to the daemon once a
second), and :mod:`~lokid.gateway.relay` (a request carried to an engine), all over
:mod:`~lokid.gateway.settings` and :mod:`~lokid.gateway.replies`.
May import: :mod:`lokid.core`, :mod:`lokid.host` (its one bus call), :mod:`lokid.dbus.wire`
(the connection Debian 12's dbus-fast needs), :mod:`lokid.store` (the sizes of the slot
files the engines' steps list, :mod:`lokid.store.slotsizes`); never the daemon.
"""
