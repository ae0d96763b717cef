"""The gateway's named client keys file (:data:`lokid.core.serve.keys.KEYS_FILE`), written by the
daemon for ``lokictl keys`` and the D-Bus API (:mod:`lokid.dbus.keys`); the gateway only
reads it (:mod:`lokid.gateway.keys`).

Rules, each for a failure it prevents:

- only a key's digest and its first :data:`~lokid.core.serve.keys.SHOWN_PREFIX` characters are
  written; the key itself is returned once to the caller and kept nowhere: a copy of the
  file, a backup or a ``cat`` gives no key;
- one writer at a time: each change reads the file, changes it and renames the new one
  into place holding an exclusive ``flock`` on the keys directory (and a lock between
  the daemon's own threads), so two ``AddKey`` at once both land, and a script that takes
  the same lock (``flock /etc/loki/clients …``) is never overwritten;
- atomic: the new text goes to a hidden temporary file in the same directory, flushed to
  the disk, ``0640`` group ``loki-gateway`` (when that group exists and the daemon may
  give it: root), renamed over the old one, and the directory flushed: the gateway,
  which re-reads the file within a second of a change, sees the old set or the new one,
  never half of either;
- an operator's comments and layout survive (tomlkit edits the document it parsed);
- what is written is parsed again with :func:`lokid.core.serve.keys.parse`, the gateway's own
  rules, before the rename: a change the gateway would refuse (and so keep serving the
  old set while the operator believes the new one holds) is an error, nothing written;
- a file that does not parse (a broken hand edit) is an error naming its line, and is
  left byte for byte: rewriting it would throw away the operator's other keys;
- a revoked key's table stays (``revoked = …``), so that its usage keeps its name; only
  :meth:`KeyStore.remove` deletes it;
- a rotation with a grace keeps the old key's digest as ``previous_hash`` until
  ``previous_until``: clients move to the new key without an outage; without a grace the
  old key stops at once (kept until now, so that its client hears "rotated").

Faults: a broken file is :class:`~lokid.core.errors.ConfigError` (its path and line); a
name that no key has, :class:`~lokid.core.errors.NotFoundError`; a name taken, or the
lock held too long, :class:`~lokid.core.errors.BusyError`; a bad option,
:class:`~lokid.core.errors.InvalidArgsError`; a file system that refuses the write,
:class:`~lokid.core.errors.LokiError` naming the path and the cause.

Blocking I/O: the daemon calls these from a worker thread.
"""

from __future__ import annotations

import errno
import grp
import os
import stat
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import tomlkit

from ..core.errors import BusyError, ConfigError, InvalidArgsError, LokiError, NotFoundError
from ..core.names import GATEWAY_USER
from ..core.serve import keys as k
from .dirlock import flock_within

FILE_MODE = 0o640
DIR_MODE = 0o750
GATEWAY_GROUP = GATEWAY_USER      # loki-gateway's own group (debian/lokid.sysusers)
FLOCK_WAIT = 5.0                  # s: then Busy, nothing written
MAX_LIMIT = 10 ** 15              # the parser's bound (lokid.core.serve.keys)


@dataclass(frozen=True)
class Options:
    """What a caller sets on a key; None: leave as it is.

    ``models``: names or patterns, ``()`` or one ``*``: every model. ``limits``: by
    :data:`lokid.core.serve.keys.LIMITS` name, 0 lifts the limit. ``expires``: seconds since
    the epoch, 0 lifts it."""
    klass: str | None = None
    models: tuple[str, ...] | None = None
    limits: Mapping[str, int] = field(default_factory=dict)
    expires: float | None = None

    def check(self, now: float) -> None:
        if self.klass is not None and self.klass not in k.CLASSES:
            raise InvalidArgsError(f"class: one of {', '.join(k.CLASSES)}, not "
                                   f"{self.klass[:32]!r}")
        if self.models is not None and (
                len(self.models) > k.MAX_PATTERNS
                or any(not m or len(m) > 256 for m in self.models)):
            raise InvalidArgsError(f"models: at most {k.MAX_PATTERNS} names or patterns, each "
                                   "1 to 256 characters")
        for name, value in self.limits.items():
            if name not in k.LIMITS:
                raise InvalidArgsError(f"unknown limit {name[:40]!r}: one of "
                                       f"{', '.join(k.LIMITS)}")
            if not 0 <= value <= MAX_LIMIT:
                raise InvalidArgsError(f"{name}: 0 (no limit) to {MAX_LIMIT}, not {value}")
        if self.expires is not None and 0 < self.expires <= now:
            raise InvalidArgsError(f"expires: {_iso(self.expires)} is past: the key would "
                                   "stop at once (revoke it instead)")


class KeyStore:
    """The keys file at ``path`` (its directory made at need, ``0750``)."""

    def __init__(self, path: str = k.KEYS_FILE, group: str = GATEWAY_GROUP):
        self.path = path
        self.directory = os.path.dirname(path) or "."
        self.group = group
        self._lock = threading.Lock()

    # -- reading --------------------------------------------------------------------

    def entries(self) -> list[k.KeyEntry]:
        """Every key, sorted by name ([] when there is no file); ConfigError when broken."""
        text = self._read()
        return sorted(k.parse(text, self.path).values(), key=lambda e: e.name)

    # -- changing -------------------------------------------------------------------

    def add(self, name: str, options: Options, now: float | None = None) -> str:
        """A new key ``name``: the key, once (only its digest is written)."""
        when = time.time() if now is None else now
        _check_name(name)
        options.check(when)
        secret = k.new_secret()
        with self._edit() as doc:
            keys = _keys_table(doc)
            if name in keys:
                raise BusyError(f"a key named {name!r} exists already ({self.path}): change "
                                "it, rotate it, or remove it first")
            table = tomlkit.table()
            table["hash"] = k.digest(secret)
            table["prefix"] = secret[:k.SHOWN_PREFIX]
            table["class"] = options.klass or k.INTERACTIVE
            table["created"] = _datetime(when)
            _apply(table, Options(None, options.models, options.limits, options.expires))
            keys[name] = table
        return secret

    def change(self, name: str, options: Options, now: float | None = None) -> None:
        options.check(time.time() if now is None else now)
        with self._edit() as doc:
            _apply(self._table(doc, name), options)

    def revoke(self, name: str, now: float | None = None) -> None:
        """Its next request is refused; the table stays (usage keeps its name). A key
        revoked already keeps its first time."""
        with self._edit() as doc:
            table = self._table(doc, name)
            if "revoked" not in table:
                table["revoked"] = _datetime(time.time() if now is None else now)

    def rotate(self, name: str, grace: float = 0, now: float | None = None) -> str:
        """A new key for ``name``, once; the old one works ``grace`` seconds more (0: stops
        now). A revoked key is not brought back this way."""
        when = time.time() if now is None else now
        if not 0 <= grace <= 366 * 86400:
            raise InvalidArgsError(f"grace: 0 to 366 days in seconds, not {grace}")
        secret = k.new_secret()
        with self._edit() as doc:
            table = self._table(doc, name)
            if "revoked" in table:
                raise BusyError(f"key {name!r} is revoked: add a new key instead (or remove "
                                "this one first)")
            old = str(table["hash"])
            table["hash"] = k.digest(secret)
            table["prefix"] = secret[:k.SHOWN_PREFIX]
            for stale in ("previous_hash", "previous_until"):
                if stale in table:
                    del table[stale]
            # without a grace, until now: the old key is refused at once, and its client
            # told it was rotated (not "invalid key", which sends people hunting typos)
            table["previous_hash"] = old
            table["previous_until"] = _datetime(when + grace)
        return secret

    def remove(self, name: str) -> None:
        """Its table deleted: its usage is then reported under no known key."""
        with self._edit() as doc:
            self._table(doc, name)
            del doc["keys"][name]

    # -- the file -------------------------------------------------------------------

    def _table(self, doc: Any, name: str) -> Any:
        _check_name(name)
        keys = doc.get("keys")
        if keys is None or name not in keys:
            raise NotFoundError(f"no key named {name!r} in {self.path}")
        return keys[name]

    def _read(self) -> str:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            return ""
        except OSError as e:
            raise _io_error("cannot read", self.path, e) from None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise ConfigError("is not a regular file: move it away", self.path)
            raw = os.read(fd, k.MAX_KEYS_BYTES + 1)
        finally:
            os.close(fd)
        if len(raw) > k.MAX_KEYS_BYTES:
            raise ConfigError(f"over {k.MAX_KEYS_BYTES} bytes", self.path)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ConfigError(f"not UTF-8 text (byte {e.start}): edit it by hand",
                              self.path) from None

    @contextmanager
    def _edit(self) -> Iterator[Any]:
        """The file as a tomlkit document, written back at the block's end if it then
        parses by the gateway's rules; nothing written when the block raises."""
        with self._lock, self._locked():
            text = self._read()
            k.parse(text, self.path)   # a broken hand edit: its line, and left as it is
            doc = tomlkit.parse(text)
            yield doc
            new = tomlkit.dumps(doc)
            try:
                k.parse(new, self.path)
            except ConfigError as e:
                raise InvalidArgsError(f"the change would make the keys file invalid, "
                                       f"nothing written: {e.reason}") from None
            self._write(new.encode("utf-8"))

    @contextmanager
    def _locked(self) -> Iterator[None]:
        self._make_directory()
        try:
            fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as e:
            raise _io_error("cannot open", self.directory, e) from None
        try:
            if not flock_within(fd, FLOCK_WAIT, 0.005):
                raise BusyError(f"another program holds the lock of {self.directory} "
                                f"(flock) for more than {FLOCK_WAIT:.0f} s: nothing "
                                "changed; try again")
            yield
        finally:
            os.close(fd)   # releases the flock

    def _make_directory(self) -> None:
        if os.path.isdir(self.directory):
            return
        try:
            os.makedirs(self.directory, DIR_MODE, exist_ok=True)
            os.chmod(self.directory, DIR_MODE)
            gid = self._gid()
            if gid != -1:
                os.chown(self.directory, 0, gid)
        except OSError as e:
            raise _io_error("cannot create", self.directory, e) from None

    def _gid(self) -> int:
        """loki-gateway's group when it exists and the daemon may give it (root), else -1
        (the daemon's own: a session daemon under tests)."""
        if os.geteuid() != 0:
            return -1
        try:
            return grp.getgrnam(self.group).gr_gid
        except KeyError:
            return -1

    def _write(self, data: bytes) -> None:
        tmp = os.path.join(self.directory,
                           f".{os.path.basename(self.path)}.{os.getpid()}.tmp")
        try:
            try:
                os.unlink(tmp)   # left by a killed daemon of the same pid
            except FileNotFoundError:
                pass
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
                gid = self._gid()
                if gid != -1:
                    os.fchown(f.fileno(), 0, gid)
                os.fchmod(f.fileno(), FILE_MODE)
            os.rename(tmp, self.path)
        except OSError as e:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise _io_error("cannot write", self.path, e) from None
        _sync_dir(self.directory)


def _check_name(name: str) -> None:
    if not k.valid_name(name):
        raise InvalidArgsError(f"key name {name[:64]!r} is not valid: 1 to 64 letters, digits, "
                               "'.', '_', '@' and '-', starting with a letter or digit")


def _keys_table(doc: Any) -> Any:
    if "keys" not in doc:
        try:
            doc["keys"] = tomlkit.table(is_super_table=True)
        except TypeError:   # tomlkit before 0.11.2: a plain [keys] header, read the same
            doc["keys"] = tomlkit.table()
    return doc["keys"]


def _apply(table: Any, options: Options) -> None:
    if options.klass is not None:
        table["class"] = options.klass
    if options.models is not None:
        if not options.models or "*" in options.models:
            if "models" in table:
                del table["models"]
        else:
            table["models"] = list(options.models)
    for name, value in options.limits.items():
        if value:
            table[name] = value
        elif name in table:
            del table[name]
    if options.expires is not None:
        if options.expires:
            table["expires"] = _datetime(options.expires)
        elif "expires" in table:
            del table["expires"]


def _datetime(seconds: float) -> datetime:
    return datetime.fromtimestamp(int(seconds), UTC)


def _iso(seconds: float) -> str:
    return _datetime(seconds).strftime("%Y-%m-%dT%H:%M:%SZ")


def _io_error(what: str, path: str, e: OSError) -> LokiError:
    hint = ""
    if e.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        hint = " (lokid.service writes /etc/loki/clients only: ReadWritePaths=)"
    return LokiError(f"{what} {path}: {e.strerror or e}{hint}")


def _sync_dir(directory: str) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
