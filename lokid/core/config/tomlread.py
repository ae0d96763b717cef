"""Reading a TOML config file within bounds, and checking its values with locations.

What every file lokid reads shares: a regular file of at most
:data:`MAX_FILE_BYTES`, opened without blocking (:func:`read_file`: a FIFO
would block the reader for ever, /dev/zero would fill memory), UTF-8, its text
checked by :mod:`lokid.core.config.tomlscan` before and after tomllib reads it
(:func:`parse_toml`); and :class:`Checker`, typed access to the parsed values
whose every error names the file, the line (:func:`key_line`: tomllib gives
none for values), the key and what would be valid. :mod:`lokid.core.config.files`
says what the keys of lokid.toml and of a preset mean.

Part of the pure core: it reads the files it is pointed at, nothing else.
"""

from __future__ import annotations

import os
import re
import stat
import tomllib
from typing import Any

from ..errors import ConfigError
from . import tomlscan

# Real presets are 1 to 3 KB; the cap keeps a runaway file (a log written to the
# wrong place) from filling memory.
MAX_FILE_BYTES = 64 * 1024

_TOML_AT = re.compile(r"\(at line (\d+), column \d+\)")


_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"))


def not_regular(mode: int) -> str:
    kind = next((name for test, name in _KINDS if test(mode)), "not a plain file")
    return f"cannot read: is {kind}, not a regular file"


def read_file(path: str) -> bytes:
    """The bytes of ``path``: a regular file (after links) of at most MAX_FILE_BYTES.

    A FIFO would block the reader forever and /dev/zero would fill memory, so
    the file is checked before it is opened (opening a device can act: a
    watchdog starts), opened without blocking, and checked again on the
    descriptor, since it may have been replaced in between.
    """
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(not_regular(st.st_mode), path)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise ConfigError("no such file", path) from None
    except OSError as e:
        raise ConfigError(f"cannot read: {e.strerror}", path) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(not_regular(st.st_mode), path)
        if st.st_size > MAX_FILE_BYTES:
            raise too_large(f"{st.st_size} bytes", path)
        chunks: list[bytes] = []
        size = 0
        # st_size can lie (a file still growing, one of /proc): read at most one
        # byte more than the cap, whatever it said.
        while size <= MAX_FILE_BYTES:
            chunk = os.read(fd, MAX_FILE_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as e:
        raise ConfigError(f"cannot read: {e.strerror}", path) from None
    finally:
        os.close(fd)
    if size > MAX_FILE_BYTES:
        raise too_large(f"more than {MAX_FILE_BYTES} bytes", path)
    return b"".join(chunks)


def too_large(size: str, path: str) -> ConfigError:
    return ConfigError(f"too large: {size}, the limit is {MAX_FILE_BYTES} bytes "
                       "(a preset is a few KB)", path)


def read_text(path: str) -> str:
    """The text of ``path`` (:func:`read_file`), which must be UTF-8."""
    raw = read_file(path)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"not UTF-8 text (byte {e.start})", path) from None


def read_toml(path: str) -> tuple[dict[str, Any], str]:
    text = read_text(path)
    return parse_toml(text, path), text


def parse_toml(text: str, path: str) -> dict[str, Any]:
    """``text`` read as TOML within the bounds of a file; ``path`` is named in errors.

    A text that does not come from a file (a candidate preset sent over the bus)
    gets the same bounds as one read from disk: its UTF-8 size, then tomlscan.
    """
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError as e:
        # a lone surrogate: no file holds one, and it cannot be written to one
        raise ConfigError(f"not UTF-8 text (character {e.start})", path) from None
    if size > MAX_FILE_BYTES:
        raise too_large(f"{size} bytes", path)
    suspects = tomlscan.check_text(text, path)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        message = str(e)
        m = _TOML_AT.search(message)
        line = int(m.group(1)) if m else None
        message = _TOML_AT.sub("", message).strip()
        raise ConfigError(f"TOML syntax error: {message}", path, line) from None
    except (RecursionError, MemoryError) as e:
        # check_text bounds the nesting and the file is small: should either still
        # happen, it is this file's error, not the daemon's.
        raise ConfigError(f"cannot be parsed ({type(e).__name__})", path) from None
    tomlscan.check_values(data, text, path, suspects)
    return data


def key_line(text: str, key: str, table: str = "") -> int | None:
    """The line where ``key`` is assigned (inside ``[table]`` if given), when findable.

    tomllib gives no positions for values, so this scans the text. It
    understands plain and quoted keys, ``[table]`` headers and dotted keys
    (``spec.mode = …``); anything fancier just yields no line number.

    No backtracking regex: a line of a multi-line string can be 60 KB of spaces,
    and a lazy group before the ``=`` took seconds on it.
    """
    current = ""
    dotted = f"{table}.{key}" if table else key
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if stripped.startswith("[") and not stripped.startswith("[["):
            end = stripped.find("]")
            rest = stripped[end + 1:].lstrip()
            inner = stripped[1:end].strip()
            if end > 0 and inner and "[" not in inner and (not rest or rest[0] == "#"):
                current = _plain_key(inner)
                continue
        name, equals, _ = stripped.partition("=")
        if not equals or not _KEY_CHARS.fullmatch(name.rstrip()):
            continue
        full = f"{current}.{_plain_key(name)}" if current else _plain_key(name)
        if full == dotted:
            return number
    return None


_KEY_CHARS = re.compile(r"""[A-Za-z0-9_."' -]+""")


def _plain_key(written: str) -> str:
    return written.replace('"', "").replace("'", "").replace(" ", "")


class Checker:
    """Typed access to one parsed file, raising errors that say where and what."""

    def __init__(self, path: str, text: str, data: dict[str, Any], table: str = ""):
        self.path = path
        self.text = text
        self.data = data
        self.table = table

    def error(self, key: str, message: str) -> ConfigError:
        key_shown = tomlscan.show_key(key)
        shown = f"{self.table}.{key_shown}" if self.table else key_shown
        return ConfigError(message, self.path, key_line(self.text, key, self.table), shown)

    def reject_unknown(self, known: tuple[str, ...]) -> None:
        for key in self.data:
            if key not in known:
                hint = close_match(key, known)
                raise self.error(
                    key, f"unknown key{hint}; valid keys: {', '.join(known)}"
                )

    def string(self, key: str, default: str | None = None) -> str | None:
        value = self.data.get(key)
        if value is None:
            return default
        if not isinstance(value, str):
            raise self.error(key, f"must be a string, not {tname(value)}")
        if "\0" in value:
            raise self.error(key, "must not contain a NUL character")
        return value

    def boolean(self, key: str, default: bool) -> bool:
        value = self.data.get(key, default)
        if not isinstance(value, bool):
            raise self.error(key, f"must be true or false, not {tname(value)}")
        return value

    def integer(self, key: str, lo: int, hi: int, what: str) -> int | None:
        value = self.data.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(key, f"must be an integer ({what}), not {tname(value)}")
        if not lo <= value <= hi:
            raise self.error(key, f"{value} is out of range ({what})")
        return value

    def string_list(self, key: str) -> tuple[str, ...]:
        value = self.data.get(key)
        if value is None:
            return ()
        if not isinstance(value, list):
            raise self.error(key, f"must be a list of strings, not {tname(value)}")
        out = []
        for i, item in enumerate(value):
            if not isinstance(item, str):
                raise self.error(key, f"item {i} must be a string, not {tname(item)}")
            if "\0" in item:
                raise self.error(key, f"item {i} must not contain a NUL character")
            out.append(item)
        return tuple(out)


def tname(value: object) -> str:
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
             list: "a list", dict: "a table"}
    return names.get(type(value), type(value).__name__)


def close_match(key: str, known: tuple[str, ...]) -> str:
    import difflib

    close = difflib.get_close_matches(key, known, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""
