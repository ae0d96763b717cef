"""Whether a user may read a file (or run it), from mode bits, or listen on a port: the
engine unit's view.

``loki-engine@.service`` runs the engine as :data:`ENGINE_USER`, in its own
groups and :data:`ENGINE_GROUPS`. lokid plans as root (``lokid plan``, the
daemon), and root reads everything: a model that ``loki`` cannot reach would
only fail at start, where the unit says the model "does not exist" (a
directory on the way is not searchable) or cannot be read. Planning as root
therefore asks this module whether the unit's user may read each file, and
which path component stops it; planning as the user itself asks the kernel,
and this module only explains a refusal.

Pure: the caller stats each component of the path (:class:`Node`) and says
who asks (:class:`User`); :mod:`lokid.planning.gather` does both. Only mode bits
are read (owner, then group, then others, as the kernel checks them). POSIX
ACLs are not evaluated: a node that carries one is given the benefit of the
doubt (``acl``), so that an operator's ``setfacl -m u:loki:rx`` never turns
into a false error. Capabilities and LSMs (AppArmor, SELinux) are not seen.

A port below ``net.ipv4.ip_unprivileged_port_start`` (1024 unless lowered) is
the same kind of check: root may bind it, the unit's ``loki`` may not (the unit
grants no CAP_NET_BIND_SERVICE), so a plan made as root asks :func:`may_listen`
for the unit's user rather than learning it from the engine's failed start.
"""

from __future__ import annotations

import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# units/loki-engine@.service: User=, and SupplementaryGroups= (the GPU device nodes).
# tests/core/test_access.py keeps these in step with the unit.
ENGINE_USER = "loki"
ENGINE_GROUPS = ("video", "render")
# Another user for the check (development, tests): a throwaway user stands in for loki.
ENGINE_USER_ENV = "LOKI_ENGINE_USER"
# The kernel's default for net.ipv4.ip_unprivileged_port_start (what binding a lower port
# takes CAP_NET_BIND_SERVICE for), where /proc/sys cannot be read.
UNPRIVILEGED_PORT_START = 1024

READ = 4
EXECUTE = 1      # on a directory: search

_ADJECTIVE = {READ: "readable", EXECUTE: "executable"}
_LETTER = {READ: "r", EXECUTE: "x"}


@dataclass(frozen=True)
class User:
    """Who the check is for: uid, every gid it runs with, and names for the message."""

    name: str
    uid: int
    gids: frozenset[int]
    group: str            # its primary group's name: what ``chgrp`` would give access to


@dataclass(frozen=True)
class Node:
    """One path component as ``stat`` saw it (symlinks followed)."""

    path: str
    mode: int             # st_mode
    uid: int
    gid: int
    owner: str = ""       # the owner's name ("" → the number)
    group: str = ""       # the group's name ("" → the number)
    acl: bool = False     # carries a POSIX ACL: not evaluated, taken as permitting


def engine_user(environ: Mapping[str, str]) -> str:
    """The user name the engine's unit runs as (``$LOKI_ENGINE_USER`` overrides it)."""
    return environ.get(ENGINE_USER_ENV, "").strip() or ENGINE_USER


def may_listen(uid: int, port: int, unprivileged_start: int, capable: bool = False) -> bool:
    """Whether a process of ``uid`` may bind ``port``: a port from
    ``unprivileged_start`` (the sysctl net.ipv4.ip_unprivileged_port_start) up is
    anyone's; a lower one is root's, or ``capable``'s (CAP_NET_BIND_SERVICE, which
    ``loki-engine@.service`` gives no one: it sets no AmbientCapabilities=)."""
    return port >= unprivileged_start or uid == 0 or capable


def permits(user: User, node: Node, bit: int) -> bool:
    """Whether ``node``'s mode bits give ``user`` the permission ``bit`` (READ or EXECUTE).

    Root reads and searches everything, and runs a file with any execute bit.
    Otherwise one class decides: the owner's bits when the user owns the file
    (even where the group's or others' bits would allow more), else the
    group's when it is in the group, else the others'.
    """
    if node.acl:
        return True
    mode = node.mode
    if user.uid == 0:
        if bit == EXECUTE and not stat.S_ISDIR(mode):
            return bool(mode & 0o111)
        return True
    if user.uid == node.uid:
        return bool(mode & (bit << 6))
    if node.gid in user.gids:
        return bool(mode & (bit << 3))
    return bool(mode & bit)


def blocker(user: User, chain: Sequence[Node], bit: int) -> Node | None:
    """The first node of ``chain`` that stops ``user``, or None when none does.

    ``chain`` is every directory on the way, from ``/`` down, then the file
    itself last: each directory needs search permission, the file ``bit``.
    """
    for i, node in enumerate(chain):
        last = i == len(chain) - 1
        if not permits(user, node, bit if last else EXECUTE):
            return node
    return None


def _describe(node: Node) -> str:
    owner = node.owner or str(node.uid)
    group = node.group or str(node.gid)
    return f"owner {owner}:{group}, mode {stat.S_IMODE(node.mode):04o}"


def _fix(user: User, node: Node, bit: int) -> str:
    """The chmod/chgrp that would give ``user`` the permission: the class that decides."""
    c, p = _LETTER[bit], node.path
    if bit == READ and stat.S_ISREG(node.mode) and not p.endswith(".gguf"):
        # model = "/etc/shadow": no advice to open a file up that may be no model at all
        return "is it the right file? its name does not end in .gguf"
    if user.uid == node.uid:
        return f"chmod u+{c} {p}"
    if node.gid in user.gids:
        return f"chmod g+{c} {p}"
    return f"chmod o+{c} {p}, or chgrp {user.group} {p} and chmod g+{c} {p}"


def _why(user: User, node: Node, bit: int) -> str:
    if stat.S_ISDIR(node.mode):
        return (f"directory {node.path} ({_describe(node)}) is not searchable by it: "
                f"{_fix(user, node, EXECUTE)}")
    return f"the file ({_describe(node)}) is not {_ADJECTIVE[bit]} by it: {_fix(user, node, bit)}"


def not_permitted(what: str, path: str, user: User, node: Node, bit: int) -> str:
    """The error when the unit's user could not use the file, planned by another user:
    "model /m/x.gguf is not readable by user loki (owner root:root, mode 0600): …"."""
    head = f"{what} {path} is not {_ADJECTIVE[bit]} by user {user.name}"
    if stat.S_ISDIR(node.mode):
        return f"{head}: {_why(user, node, bit)}"
    return f"{head} ({_describe(node)}): {_fix(user, node, bit)}"


def permission_denied(what: str, path: str, user: User, node: Node | None, bit: int) -> str:
    """The error when the kernel refused this process (EACCES): which component, and the
    fix, when the mode bits tell; just "permission denied" when they do not (an ACL, an
    LSM)."""
    head = f"{what} {path}: permission denied for user {user.name}"
    return head if node is None else f"{head}: {_why(user, node, bit)}"
