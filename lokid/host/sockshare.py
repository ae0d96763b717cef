"""An engine's UNIX socket given to the gateway's group, so the gateway connects there.

Under systemd an on-demand preset's engine listens on ``/run/loki/<preset>.sock``
(:mod:`lokid.core.launch.portunit`); llama-server makes it as the engine unit's user, mode 0750
under its ``UMask=0027``: only loki may connect. Once the engine answers, and before its
``READY=1``, the engine's step gives it to the ``loki-gateway`` group with mode 0660
(loki is a member of that group by ``sysusers.d/lokid.conf``; ``/run/loki`` is 0751, so
the gateway may reach a name in it and read nothing there). The gateway then connects to
the engine itself instead of through the port's relay (:mod:`lokid.gateway.sockets`).
Nobody else gains anything: the port, which any local user may reach, leads to the
same engine.
"""

from __future__ import annotations

import grp
import os

from ..core.names import GATEWAY_USER

MODE = 0o660


def share_with_gateway(path: str, group: str = GATEWAY_USER) -> str:
    """Give the socket at ``path`` to ``group`` (the gateway's), mode :data:`MODE`; "" when
    done, else why not (the gateway then goes through the port, as before)."""
    try:
        gid = grp.getgrnam(group).gr_gid
    except KeyError:
        return f"no group {group}"
    try:
        os.chown(path, -1, gid)
        os.chmod(path, MODE)
    except OSError as e:
        return f"{path}: {e.strerror or type(e).__name__}"
    return ""
