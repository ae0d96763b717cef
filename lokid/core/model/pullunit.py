"""A model pull's transient unit (issue 48): its name and its properties, pure.

The daemon starts each pull as ``loki-pull-<id>.service`` through systemd's
``StartTransientUnit`` (:mod:`lokid.dbus.pulls`); this module says what that unit is, so
that the rules are table-tested without a system manager. Each property is there for a
failure it prevents:

- **one unit per (directory, reference)**: the name is a digest of both, so a second
  ``lokictl pull`` of the same model into the same directory finds the first one running
  (systemd refuses the second unit) instead of a second writer; two references that
  resolve to one file are kept apart by the download's own lock;
- **user loki, no capability, nothing writable but the target directory and the status
  directory** (``ProtectSystem=strict``, ``ReadWritePaths=``): the worker parses what a
  remote server sends, so a flaw there must reach nothing else; the files it writes are
  the engines' user's, as a model an engine reads must be;
- **network families only** (``RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX``; the
  last for the resolver and sd_notify): the hub and its CDN are any address, so no
  address fence is possible, but netlink, packet sockets and the like are refused;
- **the token as a credential** (``LoadCredential=hf-token:…``), never in argv or the
  environment, where ``ps`` and ``systemctl show`` would print it;
- **``HF_ENDPOINT`` passed on** from the daemon's environment, so a mirror set for the
  daemon (a drop-in) is the mirror the pull uses;
- **Nice=10**: a pull of tens of GiB must not slow the engines answering beside it;
- **a bounded memory** (``MemoryMax=``): the worker streams 1 MiB chunks, so more than
  that bound is a fault (a listing of a hostile mirror), which stops here.

A D-Bus struct's value is a list, never a tuple: Debian 12's dbus-fast 1.84 refused the
tuple (``SignatureBodyMismatchError``) and every pull there failed before its unit existed
(found under systemd 252 by tests/packaging/test_pull_systemd.py).
"""

from __future__ import annotations

import hashlib
from typing import Any

UNIT_PREFIX = "loki-pull-"
TOKEN_CREDENTIAL = "hf-token"       # the name the worker reads in $CREDENTIALS_DIRECTORY
MEMORY_MAX = 512 << 20
STOP_TIMEOUT_US = 30 * 1_000_000    # the worker writes "stopped" and exits at SIGTERM
NICE = 10


def unit_id(reference: str, directory: str) -> str:
    """The id a pull's unit and status file share: a digest of where and what."""
    return hashlib.sha256(f"{directory}\0{reference}".encode()).hexdigest()[:16]


def unit_name(pull_id: str) -> str:
    return f"{UNIT_PREFIX}{pull_id}.service"


def is_pull_unit(name: str) -> bool:
    """Whether ``name`` is a pull's unit as :func:`unit_name` writes it (a caller's
    ``CancelPull`` argument must name nothing else)."""
    stem = name[len(UNIT_PREFIX):-len(".service")] if name.endswith(".service") else ""
    return (name.startswith(UNIT_PREFIX) and len(stem) == 16
            and all(c in "0123456789abcdef" for c in stem))


def properties(argv: list[str], *, directory: str, status_dir: str, user: str,
               reference: str, endpoint: str | None,
               token_file: str | None) -> list[tuple[str, str, Any]]:
    """The transient service's properties as (name, D-Bus signature, value)."""
    props: list[tuple[str, str, Any]] = [
        ("Description", "s", f"lokid model pull {reference[:200]}"),
        ("Type", "s", "exec"),
        ("ExecStart", "a(sasb)", [[argv[0], argv, False]]),
        ("User", "s", user),
        ("Group", "s", user),
        ("NotifyAccess", "s", "main"),          # STATUS= progress for systemctl status
        ("SyslogIdentifier", "s", "lokid-pull"),
        ("TimeoutStopUSec", "t", STOP_TIMEOUT_US),
        ("MemoryMax", "t", MEMORY_MAX),
        ("Nice", "i", NICE),
        ("UMask", "u", 0o027),
        ("ProtectSystem", "s", "strict"),
        ("ProtectHome", "s", "read-only"),
        ("ReadWritePaths", "as", [directory, status_dir]),
        ("PrivateTmp", "b", True),
        ("PrivateDevices", "b", True),
        ("NoNewPrivileges", "b", True),
        ("CapabilityBoundingSet", "t", 0),
        ("RestrictAddressFamilies", "(bas)", [True, ["AF_INET", "AF_INET6", "AF_UNIX"]]),
        ("RestrictSUIDSGID", "b", True),
        ("RestrictRealtime", "b", True),
        ("LockPersonality", "b", True),
        ("ProtectKernelTunables", "b", True),
        ("ProtectKernelModules", "b", True),
        ("ProtectKernelLogs", "b", True),
        ("ProtectControlGroups", "b", True),
        ("ProtectHostname", "b", True),
        ("ProtectClock", "b", True),
        ("SystemCallArchitectures", "as", ["native"]),
    ]
    if endpoint:
        props.append(("Environment", "as", [f"HF_ENDPOINT={endpoint}"]))
    if token_file:
        props.append(("LoadCredential", "a(ss)", [[TOKEN_CREDENTIAL, token_file]]))
    return props
