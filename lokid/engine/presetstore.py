"""The preset files, written by the daemon for its editing methods: atomic, one writer at a
time, and only over the version the caller read.

- Every write goes to a temporary file in the presets directory itself (a hidden
  name that no reader takes for a preset: it does not end in ``.toml``), is
  flushed to the disk, given the owner and mode of the file it replaces (a new
  file: ``root:root 0644`` as the package ships them, or the daemon's own ids),
  and renamed over it; the directory is flushed too. A reader, the generator or
  the engine's start, sees the old file or the new one, never half of either.
- Writes are serialised by a lock: of two editors, one wins, and the other's
  version (:func:`lokid.core.presetedit.etag` of the bytes it read) no longer
  matches, which is :class:`~lokid.core.errors.BusyError` with the reason: no
  update is lost. An empty version skips that check (a key-level change, applied
  to the file as it is under the lock, cannot lose another one).
- Nothing is written unless the caller's ``check`` of the new text (planning it
  as a start would) passes; a refused edit leaves the file byte for byte.

Blocking I/O: the daemon calls these from a worker thread.
"""

from __future__ import annotations

import errno
import os
import stat
import threading
from collections.abc import Callable
from dataclasses import dataclass

from ..core import config as cfg
from ..core.errors import BusyError, ConfigError, NotFoundError
from ..core.presetedit import etag
from ..core.presetname import check_preset_name


@dataclass(frozen=True)
class Source:
    """A preset file as read: its text and its version."""

    name: str
    path: str
    text: str
    etag: str


class PresetStore:
    def __init__(self, config_dir: str):
        self.config_dir = config_dir
        self.lock = threading.Lock()

    @property
    def directory(self) -> str:
        return os.path.join(self.config_dir, cfg.PRESETS_DIR)

    def path(self, name: str) -> str:
        check_preset_name(name)
        return cfg.preset_path(self.config_dir, name)

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
        with open(path, "rb") as f:
            return f.read(cfg.MAX_FILE_BYTES + 1)

    def read(self, name: str) -> Source:
        path = self.path(name)
        raw = self._raw(path)
        if raw is None:
            raise NotFoundError(f"no preset {name!r} (expected {path})")
        return Source(name, path, _text(raw, path), etag(raw))

    def write(self, name: str, change: Callable[[str | None], str], version: str = "",
              check: Callable[[str, str], None] | None = None, create: bool = False) -> str:
        """Apply ``change`` (the current text, None for a new preset → the new text) under
        the lock; ``check(path, text)`` raises to refuse it; the new version.

        ``version``: the one the caller read ("" = no check). ``create``: the preset
        must not exist yet; otherwise it must.
        """
        path = self.path(name)
        with self.lock:
            raw = self._raw(path)
            if create and raw is not None:
                raise BusyError(f"preset {name!r} exists already ({path}): change it, or "
                                "remove it first")
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
            self._replace(path, data)
            return etag(data)

    def delete(self, name: str, version: str = "") -> None:
        path = self.path(name)
        with self.lock:
            raw = self._raw(path)
            if raw is None:
                raise NotFoundError(f"no preset {name!r} (expected {path})")
            self._check_version(name, raw, version)
            os.unlink(path)
            _sync_dir(self.directory)

    def rename(self, name: str, new_name: str, version: str = "") -> None:
        path, new_path = self.path(name), self.path(new_name)
        with self.lock:
            raw = self._raw(path)
            if raw is None:
                raise NotFoundError(f"no preset {name!r} (expected {path})")
            self._check_version(name, raw, version)
            try:
                os.link(path, new_path)  # fails if the new name exists: never replaced
            except FileExistsError:
                raise BusyError(f"preset {new_name!r} exists already ({new_path})") from None
            os.unlink(path)
            _sync_dir(self.directory)

    @staticmethod
    def _check_version(name: str, raw: bytes | None, version: str) -> None:
        if version and version != etag(raw):
            raise BusyError(
                f"preset {name!r} changed since it was read (version {version}, now "
                f"{etag(raw) or 'removed'}): read it again and redo the change")

    def _replace(self, path: str, data: bytes) -> None:
        directory, base = os.path.split(path)
        try:
            old = os.stat(path)
            uid, gid, mode = old.st_uid, old.st_gid, stat.S_IMODE(old.st_mode)
        except FileNotFoundError:
            uid, gid, mode = -1, -1, 0o644  # the daemon's own ids: root under systemd
        tmp = os.path.join(directory, f".{base}.{os.getpid()}.{threading.get_ident()}.tmp")
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
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise
        _sync_dir(directory)


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
