"""A unit's ``memory.stat``, read from the cgroup v2 tree (issue 44, item 11).

systemd's D-Bus API gives a unit's ``MemoryCurrent``, page cache included, and no
breakdown; the breakdown is the cgroup's own ``memory.stat`` file, which root reads
under ``/sys/fs/cgroup`` (read-only under the daemon's ``ProtectControlGroups=yes``,
readable all the same). The rule over its text is :mod:`lokid.core.place.held`.

The path is systemd's ``ControlGroup`` property of the unit: an absolute path inside the
tree. One that is not (empty, relative, with a ``..``) is refused rather than joined,
and at most :data:`MAX_BYTES` are read. Every fault is None (no cgroup v2, the unit gone
meanwhile): the caller keeps the figure it had.
"""

from __future__ import annotations

import os

CGROUP_ROOT = "/sys/fs/cgroup"
MAX_BYTES = 16384


def read_memory_stat(control_group: str, root: str = CGROUP_ROOT) -> str | None:
    """The text of ``<root><control_group>/memory.stat``; None when it cannot be read."""
    parts = control_group.split("/")
    if not control_group.startswith("/") or ".." in parts or "." in parts:
        return None
    try:
        with open(os.path.join(root, control_group.lstrip("/"), "memory.stat"), "rb") as f:
            return f.read(MAX_BYTES).decode("ascii", "replace")
    except OSError:
        return None
