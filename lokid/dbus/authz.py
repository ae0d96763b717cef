"""Who may call the verbs: polkit where it runs, else root or the ``loki`` group.

Every method of the D-Bus API declares READ (anyone) or an action
(:data:`lokid.core.names.ACTION_MANAGE`, :data:`lokid.core.names.ACTION_BENCH`). For an
action, :meth:`Authority.check` asks, in order:

1. the caller's uid, from the bus (``GetConnectionCredentials``): root and
   the daemon's own user are always allowed (as systemd allows a privileged
   caller before asking polkit);
2. polkit, when ``org.freedesktop.PolicyKit1`` is on the bus:
   ``CheckAuthorization`` for the caller's bus name and the action (the
   ``.policy`` file says auth_admin_keep; the rules file lets group ``loki``
   in); interactive authentication only when the caller's message allows it;
3. without polkit: membership of the manage group (``loki``), from the
   groups the bus read from the caller's socket (``UnixGroupIDs``), or from
   the group database when the bus does not give them.

:meth:`Authority.allows` asks the same without raising and without ever
prompting, remembered a few seconds per caller: whether a reply may carry
secret values (:mod:`lokid.dbus.reveal`). :meth:`Authority.caller` says who
calls, for what a method may list (``DraftCandidates``).

dbus-fast does not hand the message to a method, so :meth:`Authority.note`
(a message handler, called by dbus-fast before it dispatches a call) keeps
the current call in a context variable, which the method's task inherits.
A check that finds no call for its own member denies: the failure mode is
"no", never "yes".
"""

from __future__ import annotations

import contextvars
import grp
import logging
import os
import pwd
import time
from typing import Any

from dbus_fast import DBusError, Message, MessageFlag, MessageType, Variant
from dbus_fast.aio import MessageBus

from ..core.errors import PermissionDeniedError
from ..core.names import MANAGE_GROUP as MANAGE_GROUP  # its home; the daemon takes it here
from ..core.names import OBJECT_PATH
from ..host.buscall import call

log = logging.getLogger("lokid.authz")  # as the journal has always said it

DBUS = "org.freedesktop.DBus"
DBUS_PATH = "/org/freedesktop/DBus"
POLKIT = "org.freedesktop.PolicyKit1"
POLKIT_PATH = "/org/freedesktop/PolicyKit1/Authority"
POLKIT_AUTHORITY = POLKIT + ".Authority"

# How long a caller's right to read secrets is remembered (allows), and for how many.
ALLOWS_CACHE_SECONDS = 5.0
ALLOWS_CACHE_MAX = 1024
CREDENTIALS_CACHE_MAX = 1024   # callers whose credentials are kept (then all forgotten)

_current: contextvars.ContextVar[Message | None] = contextvars.ContextVar(
    "lokid_current_call", default=None)


def current_call() -> Message | None:
    """The method call being answered (noted by :meth:`Authority.note`), or None."""
    return _current.get()


class Authority:
    def __init__(self, bus: MessageBus, group: str = MANAGE_GROUP, use_polkit: bool = True):
        self.bus = bus
        self.group = group
        self.use_polkit = use_polkit
        self._allowed: dict[tuple[str, str], tuple[float, bool]] = {}
        self._credentials: dict[str, dict[str, Any]] = {}

    def install(self) -> None:
        self.bus.add_message_handler(self.note)

    @staticmethod
    def note(msg: Message) -> bool:
        if msg.message_type == MessageType.METHOD_CALL:
            _current.set(msg if (msg.path or "").startswith(OBJECT_PATH) else None)
        return False  # only noted: dbus-fast dispatches it as usual

    async def _call(self, destination: str, path: str, interface: str, member: str,
                    signature: str, body: list[Any]) -> list[Any]:
        return await call(self.bus, destination, path, interface, member, signature, body)

    async def _credentials_of(self, sender: str) -> dict[str, Any]:
        """The bus's ``GetConnectionCredentials`` of ``sender``, asked once per unique
        name: a connection's credentials are those of its socket when it connected, and a
        unique name is never given again while the bus runs (one round trip less on each
        call of the same client, such as the gateway's StartForRequest). DBusError as the
        bus answers."""
        found = self._credentials.get(sender)
        if found is None:
            (found,) = await self._call(DBUS, DBUS_PATH, DBUS, "GetConnectionCredentials",
                                        "s", [sender])
            if sender.startswith(":"):
                if len(self._credentials) >= CREDENTIALS_CACHE_MAX:
                    self._credentials.clear()
                self._credentials[sender] = found
        return found

    async def check(self, member: str, action: str) -> None:
        """Return if the current caller of ``member`` may do ``action``; else PermissionDenied."""
        msg = _current.get()
        if msg is None or msg.member != member or not msg.sender:
            raise PermissionDeniedError(f"{member}: cannot tell who is calling; refused")
        refusal = await self._refusal(msg, member, action, interactive=True)
        if refusal:
            raise PermissionDeniedError(refusal)

    async def allows(self, msg: Message, action: str) -> bool:
        """Whether the caller of ``msg`` holds ``action`` now, asking nobody to
        authenticate: what decides if a reply may carry secrets (a read never prompts).
        An answer is kept a few seconds per caller (a bus name is never reused while the
        bus runs), so that ``lokictl show`` reading several properties asks once."""
        if not msg.sender:
            return False
        key = (msg.sender, action)
        now = time.monotonic()
        cached = self._allowed.get(key)
        if cached is not None and now - cached[0] < ALLOWS_CACHE_SECONDS:
            return cached[1]
        allowed = not await self._refusal(msg, msg.member or "", action, interactive=False)
        if len(self._allowed) >= ALLOWS_CACHE_MAX:
            self._allowed.clear()
        self._allowed[key] = (now, allowed)
        return allowed

    async def caller(self, msg: Message | None) -> tuple[int, list[int]] | None:
        """The uid of the caller of ``msg`` and its groups (as the bus read them from its
        socket, else from the group database, as :meth:`check` takes them), or None for
        root and the daemon's own user, who see everything. PermissionDenied when the bus
        does not say."""
        if msg is None or not msg.sender:
            raise PermissionDeniedError("cannot tell who is calling; refused")
        try:
            creds = await self._credentials_of(msg.sender)
        except DBusError as e:
            raise PermissionDeniedError(f"the bus does not say who is calling ({e.text}); "
                                        "refused") from None
        if "UnixUserID" not in creds:
            raise PermissionDeniedError("the bus does not say who is calling; refused")
        uid = int(creds["UnixUserID"].value)
        if uid == 0 or uid == os.getuid():
            return None
        groups = [int(g) for g in creds["UnixGroupIDs"].value] if "UnixGroupIDs" in creds \
            else _groups_of(uid)
        return uid, groups

    async def _refusal(self, msg: Message, member: str, action: str,
                       interactive: bool) -> str:
        """Why the caller of ``msg`` may not do ``action``, or "" when it may."""
        try:
            creds = await self._credentials_of(msg.sender)
        except DBusError as e:
            return f"{member}: the bus does not say who is calling ({e.text}); refused"
        uid = int(creds["UnixUserID"].value) if "UnixUserID" in creds else -1
        if uid == 0 or uid == os.getuid():
            return ""
        if self.use_polkit and await self._polkit_present():
            if await self._polkit(msg, action, interactive):
                return ""
            return (f"{member}: not authorized by polkit for {action} (uid {uid}); ask an "
                    "administrator, or use sudo")
        groups = [int(g) for g in creds["UnixGroupIDs"].value] if "UnixGroupIDs" in creds \
            else _groups_of(uid)
        try:
            gid = grp.getgrnam(self.group).gr_gid
        except KeyError:
            gid = None
        if gid is not None and gid in groups:
            return ""
        return (f"{member} needs root or membership of group '{self.group}' (uid {uid} has "
                f"neither); e.g. `sudo usermod -aG {self.group} USER`, then log in again")

    async def _polkit_present(self) -> bool:
        try:
            (owned,) = await self._call(DBUS, DBUS_PATH, DBUS, "NameHasOwner", "s", [POLKIT])
            if owned:
                return True
            (names,) = await self._call(DBUS, DBUS_PATH, DBUS, "ListActivatableNames", "", [])
        except DBusError:
            return False
        return POLKIT in names

    async def _polkit(self, msg: Message, action: str, interactive: bool = True) -> bool:
        interactive = interactive and bool(msg.flags & MessageFlag.ALLOW_INTERACTIVE_AUTHORIZATION)
        subject = ["system-bus-name", {"name": Variant("s", msg.sender)}]
        try:
            (result,) = await self._call(POLKIT, POLKIT_PATH, POLKIT_AUTHORITY,
                                         "CheckAuthorization", "(sa{sv})sa{ss}us",
                                         [subject, action, {}, int(interactive), ""])
        except DBusError as e:
            log.warning("polkit CheckAuthorization(%s) failed: %s", action, e.text)
            return False
        return bool(result[0])


def _groups_of(uid: int) -> list[int]:
    try:
        pw = pwd.getpwuid(uid)
    except KeyError:
        return []
    return list(os.getgrouplist(pw.pw_name, pw.pw_gid))
