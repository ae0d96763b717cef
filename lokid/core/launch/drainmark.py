"""An engine's stop at a shutdown waits for the gateway's drain (issue 30: a host
rebooted mid-use cut the streams the gateway was letting end).

A shutdown stops ``loki-gateway.service`` and the engines at once. The gateway lets its
requests in flight end (its drain, at most 30 s), but their engines were stopped under
them. So an engine whose stop comes while the system is stopping (``systemctl
is-system-running``: "stopping") and the gateway still runs (its ``RuntimeDirectory=``,
:data:`GATEWAY_RUNTIME_DIR`, exists until systemd has stopped it) sends llama-server its
SIGTERM once the gateway is gone, at most :data:`WAIT` seconds later. Any other stop
(``lokictl stop``, an idle stop, a swap, ``systemctl stop`` by hand) goes on at once: a
stop still cuts, an unload drains.

No ordering of units does this: with the engines ``After=`` the gateway, systemd stops
them first; with the gateway ``After=`` the engines, a gateway started by its socket at
boot waits for every enabled engine to load. Part of the pure core: names and the rule.
"""

from __future__ import annotations

GATEWAY_RUNTIME_DIR = "/run/loki-gateway"   # loki-gateway.service's RuntimeDirectory=
WAIT = 35.0   # seconds an engine's stop waits at most (the gateway's 30 s and its exit)
STOPPING = "stopping"   # systemctl is-system-running during a shutdown


def waits_for_gateway(gateway_up: bool, system_state: str) -> bool:
    """Whether an engine's stop waits for the gateway to be gone."""
    return gateway_up and system_state == STOPPING
