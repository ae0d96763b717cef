"""``org.lokid.Lokid1.Keys`` at ``/org/lokid/Lokid1``: the gateway's named client keys,
managed over the bus (``lokictl keys``, the Cockpit page) and written by the daemon
(:mod:`lokid.store.keystore`); the gateway re-reads the file within a second.

Rules, each for a failure it prevents:

- every method, ``ListKeys`` too, needs the polkit action
  ``org.lokid.lokid1.manage-keys`` (:data:`lokid.dbus.access.KEYS`; group ``loki``, not
  the gateway's user): who may list keys learns the names, scopes and limits of a team,
  and a key's prefix helps recognise it in a leaked file;
- a key crosses the bus once, in the reply to ``AddKey`` or ``RotateKey``, to the caller
  alone; ``ListKeys`` never carries a hash, and ``KeysChanged`` carries nothing: a
  signal goes to every client that listens;
- options are checked here by name and type before the store sees them (an unknown
  option is an error, never ignored: a typo in a limit must not lift it), and the store
  checks the file against the gateway's own rules before it writes;
- the file is the one the gateway reads: ``[gateway] keys_file`` of lokid.toml, read at
  each call (keys written where the gateway does not look would be keys that silently
  never work); its default follows the daemon's config directory
  (``<config>/clients/keys.toml``, :data:`lokid.core.serve.keys.KEYS_FILE` for ``/etc/loki``), as
  the presets do, so that a daemon run on a test directory never touches ``/etc``; a
  ``keys_file = ""`` (no named keys) refuses every method, saying so.

Signatures are dbus-fast's string annotations (Debian 12's 1.84 and 13's 2.44): no
postponed annotations in this module.
"""

# dbus-fast's string signatures, read as annotations: neither a Python type nor a name
# ruff: noqa: F722, F821
# mypy: disable-error-code="name-defined,valid-type"

import asyncio
import os
import time
from typing import Any

from dbus_fast import Variant
from dbus_fast.service import ServiceInterface, method, signal

from ..core.config import files as cfg
from ..core.errors import InvalidArgsError, NotFoundError
from ..core.names import KEYS_INTERFACE
from ..core.serve.keys import CLASSES, KEYS_DIR, KEYS_FILE, LIMITS, KeyEntry
from ..store.keystore import KeyStore, Options
from .access import KEYS, access, guarded
from .team import FACTORIES

_DEFAULT_CONFIG = os.path.dirname(KEYS_DIR)   # /etc/loki
_INTEGERS = ("t", "u", "x", "i", "q", "n", "y")


def keys_file(config_dir: str) -> str:
    """The keys file of a daemon reading ``config_dir``."""
    return os.path.join(config_dir, os.path.relpath(KEYS_FILE, _DEFAULT_CONFIG))


def options_of(values: "dict[str, Variant]", allowed: "tuple[str, ...]") -> "dict[str, Any]":
    """The caller's options by name, each of its documented type; InvalidArgs otherwise."""
    out: dict[str, Any] = {}
    for name, value in values.items():
        if name not in allowed:
            raise InvalidArgsError(f"unknown option {name[:40]!r}: one of {', '.join(allowed)}")
        sig = value.signature if isinstance(value, Variant) else ""
        data = value.value if isinstance(value, Variant) else value
        if name == "class":
            if sig != "s":
                raise InvalidArgsError(f"class: a string ({', '.join(CLASSES)})")
        elif name == "models":
            if sig != "as":
                raise InvalidArgsError("models: an array of strings (names or patterns; "
                                       "'*' or none: every model)")
            data = tuple(data)
        elif sig not in _INTEGERS or isinstance(data, bool):
            raise InvalidArgsError(f"{name}: an integer")
        out[name] = data
    return out


class KeysInterface(ServiceInterface):
    def __init__(self, backend: Any):
        super().__init__(KEYS_INTERFACE)
        self.backend = backend
        self._stores: dict[str, KeyStore] = {}   # by path: one thread lock per file

    def _store(self) -> KeyStore:
        """The store of the file the gateway reads (blocking: lokid.toml is read)."""
        config_dir = str(self.backend.config_dir)
        path = cfg.load_global(config_dir).gateway.keys_file
        if not path:
            raise NotFoundError(f"[gateway] keys_file is \"\" in "
                                f"{os.path.join(config_dir, cfg.GLOBAL_FILE)}: the gateway "
                                "reads no named keys; remove that line to manage them")
        if path == KEYS_FILE:
            path = keys_file(config_dir)
        return self._stores.setdefault(path, KeyStore(path))

    async def _run(self, verb: str, *args: Any) -> Any:
        return await asyncio.to_thread(lambda: getattr(self._store(), verb)(*args))

    async def _changed(self, verb: str, *args: Any) -> Any:
        result = await self._run(verb, *args)
        self.KeysChanged()
        return result

    @method()
    @access(KEYS)
    @guarded
    async def AddKey(self, name: "s", options: "a{sv}") -> "s":
        return await self._changed("add", name, _options(options))

    @method()
    @access(KEYS)
    @guarded
    async def ListKeys(self) -> "aa{sv}":
        entries = await self._run("entries")
        now = time.time()
        return [_listed(e, now) for e in entries]

    @method()
    @access(KEYS)
    @guarded
    async def ChangeKey(self, name: "s", options: "a{sv}") -> None:
        await self._changed("change", name, _options(options))

    @method()
    @access(KEYS)
    @guarded
    async def RevokeKey(self, name: "s") -> None:
        await self._changed("revoke", name)

    @method()
    @access(KEYS)
    @guarded
    async def RotateKey(self, name: "s", options: "a{sv}") -> "s":
        grace = options_of(options, ("grace",)).get("grace", 0)
        return await self._changed("rotate", name, float(grace))

    @method()
    @access(KEYS)
    @guarded
    async def RemoveKey(self, name: "s") -> None:
        await self._changed("remove", name)

    @signal()
    def KeysChanged(self) -> None:
        return None


def _options(values: "dict[str, Variant]") -> Options:
    got = options_of(values, ("class", "models", *LIMITS, "expires"))
    return Options(got.get("class"), got.get("models"),
                   {n: int(got[n]) for n in LIMITS if n in got},
                   None if "expires" not in got else float(got["expires"]))


def _listed(entry: KeyEntry, now: float) -> "dict[str, Variant]":
    ident = entry.identity
    state = "active"
    if entry.revoked is not None and entry.revoked <= now:
        state = "revoked"
    elif ident.expires is not None and ident.expires <= now:
        state = "expired"
    out = {"name": Variant("s", entry.name), "prefix": Variant("s", entry.prefix),
           "class": Variant("s", ident.klass), "models": Variant("as", list(ident.models)),
           "state": Variant("s", state)}
    for name, value in ident.limits.as_dict().items():
        out[name] = Variant("t", value)
    for name, when in (("expires", ident.expires), ("created", entry.created),
                       ("revoked", entry.revoked), ("previous_until", entry.previous_until)):
        if when is not None:
            out[name] = Variant("x", int(when))
    return out


FACTORIES.append(KeysInterface)
