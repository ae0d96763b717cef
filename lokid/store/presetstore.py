"""The preset files, written by the daemon for its editing methods: atomic, one writer per
preset at a time, only over the version the caller read, and never over a change made
meanwhile by another program.

- Every write goes to a temporary file in the presets directory itself (a hidden
  name that no reader takes for a preset: it does not end in ``.toml``), is
  flushed to the disk, given the owner and mode of the file it replaces, and
  renamed over it; the directory is flushed too. A reader, the generator or the
  engine's start, sees the old file or the new one, never half of either.
- A new preset is ``root:loki 0640`` (the daemon's own user, group
  :data:`lokid.core.names.MANAGE_GROUP`): the engines, run as user loki, read
  it; other users do not (``env`` may hold tokens). Without that group
  (development, tests) the daemon's own group, and the log says so.
- Each preset has its own lock: of two editors of one preset, one wins, and the
  other's version (:func:`lokid.core.config.presetedit.etag` of the bytes it read) no
  longer matches, which is :class:`~lokid.core.errors.BusyError` with the
  reason. An edit of one preset never waits for an edit of another, and waits at
  most :data:`LOCK_WAIT` for one of the same preset (``Busy`` then). An empty
  version skips that check (a key-level change, applied to the file as it is
  under the lock, cannot lose another one).
- Compare and replace under one check: planning a new text takes a while, and an
  operator may save the file by hand meanwhile (12 of 37 such hand edits were
  lost when the version was checked only as the file was read). So right before
  the rename the file is read again, holding an exclusive ``flock`` on the
  presets directory, and a file that is not byte for byte what the edit was
  made from is ``Busy``, the hand edit kept. A script that writes presets takes
  the same lock (``flock /etc/loki/presets …``) and is then never overwritten;
  an editor that takes no lock can lose only within the microseconds between
  that last read and the rename (POSIX has no compare-and-rename).
- Nothing is written unless the caller's ``check`` of the new text (planning it
  as a start would) passes; a refused edit leaves the file byte for byte.
- :meth:`PresetStore.close` (the daemon stops) makes every edit still running
  end ``Busy`` before it writes, so that a stop never waits for an edit.
- Temporary files left by a killed daemon (its own hidden names only, older than
  :data:`STALE_TMP_SECONDS`) are removed when the store opens and before each
  write.

Blocking I/O: the daemon calls these from a worker thread.
"""

from __future__ import annotations

import contextlib
import errno
import grp
import logging
import os
import re
import stat
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from ..core.config import files as cfg
from ..core.config.presetedit import etag
from ..core.config.presetname import check_preset_name
from ..core.errors import BusyError, ConfigError, NotFoundError
from ..core.names import MANAGE_GROUP
from .dirlock import flock_within

log = logging.getLogger("lokid.daemon")

NEW_MODE = 0o640
LOCK_WAIT = 30.0           # seconds an edit waits for another edit of the same preset
FLOCK_WAIT = 2.0           # seconds a write waits for another program's lock on the directory
STALE_TMP_SECONDS = 600.0  # a write takes milliseconds: a temporary file this old is a leftover
# ".<preset>.toml.<pid>.<thread>.tmp": the temporary name of a write (_tmp_name)
_TMP_NAME = re.compile(r"\.[A-Za-z0-9][A-Za-z0-9_.-]*\.toml\.[0-9]+\.[0-9]+\.tmp")


@dataclass(frozen=True)
class Source:
    """A preset file as read: its text and its version."""

    name: str
    path: str
    text: str
    etag: str


class PresetStore:
    def __init__(self, config_dir: str, group: str = MANAGE_GROUP):
        self.config_dir = config_dir
        self.group = group
        self.stopping = threading.Event()
        self._guard = threading.Lock()
        self._locks: dict[str, tuple[threading.Lock, list[int]]] = {}  # name → lock, users
        self.clean_stale()

    @property
    def directory(self) -> str:
        return os.path.join(self.config_dir, cfg.PRESETS_DIR)

    def path(self, name: str) -> str:
        check_preset_name(name)
        return cfg.preset_path(self.config_dir, name)

    def close(self) -> None:
        """The daemon stops: every edit still running ends ``Busy`` before it writes."""
        self.stopping.set()

    def cancelled(self) -> bool:
        return self.stopping.is_set()

    # -- reading -------------------------------------------------------------------------

    def _raw(self, path: str) -> bytes | None:
        """The file's bytes (bounded as the reader bounds them), None when absent."""
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return None
        if stat.S_ISLNK(st.st_mode):
            raise ConfigError("is a symbolic link: lokid edits only plain preset files (edit "
                              "its target by hand)", path)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError("is not a regular file: lokid edits only plain preset files",
                              path)
        if st.st_size > cfg.MAX_FILE_BYTES:
            raise ConfigError(f"is {st.st_size} bytes, more than a preset may be "
                              f"({cfg.MAX_FILE_BYTES})", path)
        try:
            with open(path, "rb") as f:
                return f.read(cfg.MAX_FILE_BYTES + 1)
        except FileNotFoundError:   # removed between the two calls
            return None

    def read(self, name: str) -> Source:
        path = self.path(name)
        raw = self._raw(path)
        if raw is None:
            raise NotFoundError(f"no preset {name!r} (expected {path})")
        return Source(name, path, _text(raw, path), etag(raw))

    # -- writing -------------------------------------------------------------------------

    def write(self, name: str, change: Callable[[str | None], str], version: str = "",
              check: Callable[[str, str], None] | None = None, create: bool = False) -> str:
        """Apply ``change`` (the current text, None for a new preset → the new text) under
        the preset's lock; ``check(path, text)`` raises to refuse it; the new version.

        ``version``: the one the caller read ("" = no check). ``create``: the preset
        must not exist yet; otherwise it must. ``Busy`` when the file changed meanwhile.
        """
        path = self.path(name)
        self.clean_stale()
        with self._holding(name):
            raw = self._raw(path)
            if create and raw is not None:
                raise _exists(name, path)
            if not create and raw is None:
                raise NotFoundError(f"no preset {name!r} (expected {path})")
            self._check_version(name, raw, version)
            current = None if raw is None else _text(raw, path)
            text = change(current)
            if check is not None:
                check(path, text)
            data = text.encode("utf-8")
            if data == raw:
                return etag(raw)
            tmp = self._prepare(path, data)
            try:
                with self._unchanged(name, path, raw):
                    if raw is None:
                        try:
                            os.link(tmp, path)   # a new preset never replaces a file
                        except FileExistsError:
                            raise _exists(name, path) from None
                    else:
                        os.replace(tmp, path)
            finally:
                _unlink(tmp)
            _sync_dir(self.directory)
            return etag(data)

    def delete(self, name: str, version: str = "") -> None:
        path = self.path(name)
        with self._holding(name):
            raw = self._raw(path)
            if raw is None:
                raise NotFoundError(f"no preset {name!r} (expected {path})")
            self._check_version(name, raw, version)
            with self._unchanged(name, path, raw):
                os.unlink(path)
            _sync_dir(self.directory)

    def rename(self, name: str, new_name: str, version: str = "") -> None:
        path, new_path = self.path(name), self.path(new_name)
        with self._holding(name, new_name):
            raw = self._raw(path)
            if raw is None:
                raise NotFoundError(f"no preset {name!r} (expected {path})")
            self._check_version(name, raw, version)
            with self._unchanged(name, path, raw):
                try:
                    os.link(path, new_path)  # fails if the new name exists: never replaced
                except FileExistsError:
                    raise _exists(new_name, new_path) from None
                os.unlink(path)
            _sync_dir(self.directory)

    def clean_stale(self) -> list[str]:
        """Remove this store's temporary files that a killed daemon left (its own names
        only, older than :data:`STALE_TMP_SECONDS`); the names removed."""
        try:
            entries = os.listdir(self.directory)
        except OSError:
            return []
        removed = []
        now = time.time()
        for entry in entries:
            if not _TMP_NAME.fullmatch(entry):
                continue
            tmp = os.path.join(self.directory, entry)
            try:
                st = os.lstat(tmp)
                if not stat.S_ISREG(st.st_mode) or now - st.st_mtime < STALE_TMP_SECONDS:
                    continue
                os.unlink(tmp)
            except OSError:
                continue
            log.info("removed %s, a temporary file of an edit that never ended (lokid "
                     "killed?)", tmp)
            removed.append(entry)
        return removed

    # -- the steps -----------------------------------------------------------------------

    @contextlib.contextmanager
    def _holding(self, *names: str) -> Iterator[None]:
        """The locks of ``names`` (taken in name order: two renames never deadlock); a
        lock lives while someone holds or waits for it."""
        names = tuple(sorted(set(names)))
        with self._guard:
            entries = [self._locks.setdefault(n, (threading.Lock(), [0])) for n in names]
            for _, users in entries:
                users[0] += 1
        taken: list[threading.Lock] = []
        try:
            deadline = time.monotonic() + LOCK_WAIT
            for (lock, _), name in zip(entries, names, strict=True):
                # in slices: a waiting worker thread gives up on a stop, and never waits
                # for ever (the daemon's worker threads are few, and shared)
                while not lock.acquire(timeout=0.1):
                    if self.stopping.is_set():
                        raise BusyError("lokid is stopping: the edit was cancelled, nothing "
                                        "written")
                    if time.monotonic() > deadline:
                        raise BusyError(f"another edit of preset {name!r} has run for more "
                                        f"than {LOCK_WAIT:.0f} s: nothing written; try again")
                taken.append(lock)
            yield
        finally:
            for lock in reversed(taken):
                lock.release()
            with self._guard:
                for n, (_, users) in zip(names, entries, strict=True):
                    users[0] -= 1
                    if not users[0]:
                        del self._locks[n]

    @contextlib.contextmanager
    def _unchanged(self, name: str, path: str, raw: bytes | None) -> Iterator[None]:
        """The block runs holding the directory's ``flock``, and only if the file is still
        ``raw`` (None: still absent); ``Busy`` otherwise, nothing done."""
        fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            if not flock_within(fd, FLOCK_WAIT, 0.002, self.stopping.is_set):
                raise BusyError(
                    f"another program holds the lock of {self.directory} (flock) for "
                    f"more than {FLOCK_WAIT:.0f} s: preset {name!r} was not "
                    "changed; try again")
            if self.stopping.is_set():
                raise BusyError("lokid is stopping: the edit was cancelled, nothing written")
            try:
                now = self._raw(path)
                what = "" if now == raw else "removed" if now is None else (
                    "created" if raw is None else "changed")
            except ConfigError:
                what = "replaced"   # by a link or a directory meanwhile
            if what:
                raise BusyError(
                    f"preset {name!r} was {what} by another program while this edit was "
                    f"made ({path}): nothing written; read it again and redo the change")
            yield
        finally:
            os.close(fd)   # releases the flock

    def _prepare(self, path: str, data: bytes) -> str:
        """A temporary file beside ``path`` holding ``data``, flushed, with the owner and
        mode of ``path`` (a new preset: :data:`NEW_MODE`, group :attr:`group`)."""
        try:
            old = os.stat(path)
            uid, gid, mode = old.st_uid, old.st_gid, stat.S_IMODE(old.st_mode)
        except FileNotFoundError:
            uid, gid, mode = -1, self._new_gid(path), NEW_MODE
        tmp = _tmp_name(path)
        _unlink(tmp)   # left by a thread of a killed process with the same ids
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
                try:
                    os.fchown(f.fileno(), uid, gid)
                except PermissionError:  # not root (a session daemon): its own ids, then
                    pass
                os.fchmod(f.fileno(), mode)
        except BaseException:
            _unlink(tmp)
            raise
        return tmp

    def _new_gid(self, path: str) -> int:
        try:
            return grp.getgrnam(self.group).gr_gid
        except KeyError:
            log.warning("no group %r on this host: %s is created %o with the daemon's own "
                        "group (the engines' user reads it only if that is its group too)",
                        self.group, path, NEW_MODE)
            return -1

    @staticmethod
    def _check_version(name: str, raw: bytes | None, version: str) -> None:
        if version and version != etag(raw):
            raise BusyError(
                f"preset {name!r} changed since it was read (version {version}, now "
                f"{etag(raw) or 'removed'}): read it again and redo the change")


def _exists(name: str, path: str) -> BusyError:
    return BusyError(f"preset {name!r} exists already ({path}): change it, or remove it "
                     "first")


def _tmp_name(path: str) -> str:
    directory, base = os.path.split(path)
    return os.path.join(directory, f".{base}.{os.getpid()}.{threading.get_ident()}.tmp")


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _text(raw: bytes, path: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"not UTF-8 text (byte {e.start}): edit it by hand", path) from None


def _sync_dir(directory: str) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.EROFS):
            raise
    finally:
        os.close(fd)
