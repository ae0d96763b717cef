"""The gateway's keyring: who a request is (:class:`lokid.core.serve.keys.Identity`), from the
key it presents, against the flat ``api_keys_file`` and the named keys file
(:data:`lokid.core.serve.keys.KEYS_FILE`, ``[gateway] keys_file``) that lokid.service writes
for ``lokictl keys``.

Rules, each for a failure it prevents:

- a key is read from ``Authorization: Bearer KEY``, a bare ``Authorization: KEY`` and
  ``x-api-key: KEY`` (:func:`lokid.core.serve.keys.presented`): Anthropic's clients and litellm's
  ``anthropic/`` provider send ``x-api-key``, and were refused 401 where llama-server and
  llama.cpp's router answer them (issue 46);
- a request is checked with one hash and one dictionary lookup
  (:class:`lokid.core.serve.keys.Lookup`), whatever the number of keys: 1,000 keys cost what
  one does, and the time taken says nothing of how close a wrong key came;
- the named file is re-read when it changes (its inode, size, mtime or ctime), looked at
  every :data:`CHECK_EVERY` seconds by a task of its own (:meth:`Keyring.start`), the read
  and parse in a thread: a key revoked, added or rotated by ``lokictl keys`` is in force
  within a second without a restart, and no request waits on the file. A request already
  let in is not stopped: a revoked key's streams in flight finish;
- a file that becomes broken or unreadable keeps the last good set, said once in the log
  (the file and the cause, never a key): a half-edited file must not open the gateway nor
  lock the whole team out. At start there is no last good set: a file that is there but
  cannot be read or parsed is an error naming it (:class:`ConfigError`), the gateway
  does not start rather than start open or shut;
- the gateway is *keyed* when ``api_keys_file`` is set or the named file holds a key; a
  keyless gateway's requests are :data:`lokid.core.serve.keys.ANONYMOUS`. Once keyed it stays
  keyed until it stops: every key deleted is every request refused, never an open
  gateway (a file emptied by mistake must not hand the GPUs to the network);
- a refused key is told why when the client had it (revoked, expired, rotated: the
  key's name, which its holder knows), else only that a valid key is required; no key,
  nor any part of one, is ever in a reply or a log line.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable, Mapping

from ..core.errors import ConfigError
from ..core.serve.keys import (
    ANONYMOUS,
    MAX_KEYS_BYTES,
    Identity,
    KeyEntry,
    Lookup,
    parse,
    presented,
)
from .replies import GatewayError

log = logging.getLogger("lokid.gateway")

CHECK_EVERY = 0.5   # seconds between two looks at the named file (a change in force in < 1 s)
REQUIRED = ("a valid API key is required: send `Authorization: Bearer <key>` or "
            "`x-api-key: <key>`")

Stamp = tuple[int, int, int, int, int]
Read = tuple["Stamp | None", dict[str, KeyEntry]]


def _stamp(st: os.stat_result) -> Stamp:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def read_named(path: str) -> Read:
    """The named keys in ``path`` and the file's stamp; (None, {}) when there is no such
    file. ConfigError naming the file for one that cannot be read or parsed."""
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            data = f.read(MAX_KEYS_BYTES + 1)
    except FileNotFoundError:
        return None, {}
    except OSError as e:
        raise ConfigError(f"cannot read the named keys file: {e.strerror} (set [gateway] "
                          "keys_file = \"\" in lokid.toml for no named keys)", path,
                          key="keys_file") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError("the named keys file is not UTF-8 text", path) from None
    return _stamp(st), parse(text, path)


def named_keys_held(path: str) -> int:
    """How many keys the named file ``path`` holds now (0 without one); ConfigError for
    one that cannot be read or parsed. For the start's rule on ``listen``."""
    return len(read_named(path)[1]) if path else 0


class Keyring:
    """The keys a gateway takes: ``legacy`` (the flat api_keys_file's, read at start)
    and the named file ``path`` ("" for none), kept in step with it."""

    def __init__(self, legacy: frozenset[str] = frozenset(), path: str = "",
                 wall: Callable[[], float] = time.time):
        self.legacy = legacy
        self.path = path
        self.wall = wall
        self.stamp: Stamp | None = None
        self.entries: dict[str, KeyEntry] = {}
        self.problem = ""   # what is wrong with the named file now ("" when nothing)
        if path:
            self.stamp, self.entries = read_named(path)
        self.lookup = Lookup(self.entries.values(), legacy)
        self.keyed = bool(legacy) or bool(self.entries)
        self._task: asyncio.Task[None] | None = None

    def identify(self, headers: Mapping[str, str], now: float | None = None) -> Identity:
        """Who sent a request with ``headers``: ANONYMOUS on a keyless gateway; else the
        identity of its key, or GatewayError 401 (invalid_api_key)."""
        if not self.keyed:
            return ANONYMOUS
        secret = presented(headers)
        if secret is None:
            raise GatewayError(401, REQUIRED, "authentication_error", "invalid_api_key")
        found, why = self.lookup.find(secret, self.wall() if now is None else now)
        if found is None:
            raise GatewayError(401, f"{why}: {REQUIRED}" if why else REQUIRED,
                               "authentication_error", "invalid_api_key")
        return found

    def refresh(self, stamp: Stamp | None = None) -> bool:
        """Read the named file again if ``stamp`` (its stat now; looked up when None)
        differs from the last read's; whether the keys were read again."""
        if not self.path:
            return False
        if stamp is None:
            stamp = self.look()
        if stamp == self.stamp:
            return False
        return self._apply(stamp, _read_or_error(self.path))

    def _apply(self, stamp: Stamp | None, found: Read | ConfigError) -> bool:
        if isinstance(found, ConfigError):
            self._broken(str(found))
            self.stamp = stamp   # not read again until it changes again
            return False
        self._install(*found)
        return True

    def look(self) -> Stamp | None:
        """The named file's stamp now (None: no such file); a file that cannot be looked
        at has the stamp it had, and is said once."""
        try:
            return _stamp(os.stat(self.path))
        except FileNotFoundError:
            return None
        except OSError as e:
            self._broken(f"{self.path}: cannot look at the named keys file: {e.strerror}")
            return self.stamp

    def _install(self, stamp: Stamp | None, entries: dict[str, KeyEntry]) -> None:
        if self.problem:
            log.info("the named keys file %s is read again: %d key(s)", self.path,
                     len(entries))
        elif entries != self.entries:
            log.info("the named keys file %s changed: %d key(s)", self.path, len(entries))
        self.problem = ""
        self.stamp, self.entries = stamp, entries
        self.lookup = Lookup(entries.values(), self.legacy)
        self.keyed = self.keyed or bool(entries)   # once keyed, never open again

    def _broken(self, why: str) -> None:
        if why != self.problem:
            log.warning("%s; the last good set of %d named key(s) stays in force", why,
                        len(self.entries))
        self.problem = why

    def start(self) -> None:
        """Look at the named file every CHECK_EVERY seconds until :meth:`stop`."""
        if self.path and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._watch())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(CHECK_EVERY)
            stamp = self.look()
            if stamp != self.stamp:   # read and parsed off the event loop
                self._apply(stamp, await asyncio.to_thread(_read_or_error, self.path))


def _read_or_error(path: str) -> Read | ConfigError:
    try:
        return read_named(path)
    except ConfigError as e:
        return e
    except Exception as e:   # a defect of ours: said as a broken file, the watch goes on
        return ConfigError(f"the named keys file cannot be read ({type(e).__name__})", path)
