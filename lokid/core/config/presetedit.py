"""Editing a preset's TOML text in place: set and unset keys, keeping every comment.

An operator's preset is documentation as much as settings (``etc/presets/example.toml``
explains each key and holds commented-out examples), so an edit over the bus
must change the lines it is about and nothing else. tomllib cannot write;
tomlkit keeps the layout: a key that exists is replaced where it stands,
with its line's trailing comment; a key that does not exist goes just below
its commented-out example when the file has one (``#port = 8081``), else
after the other keys of its table; a table that does not exist yet is
appended as a ``[table]`` section. Only the APIs of tomlkit 0.11 (Debian 12)
are used, and its ``Container._insert_at`` for that one placement (private,
but what its own ``append`` calls).

A key is dotted: ``ctx``, or ``table.key`` (``spec.mode``, ``env.LLAMA_ARG_THREADS``),
each part a TOML bare key. Editing is syntax, not validation: a value the
preset may not hold (``spec.mode = "eagle"``) is written, and
:func:`lokid.core.config.files.parse_preset_text` says what is wrong with the
result before anything replaces the file. :func:`etag` names a version of
the file, so that an edit is applied only to the text it was made from.

Errors are :class:`~lokid.core.errors.ConfigError`, one printable line each.
This module is part of the pure core: text in, text out.
"""

from __future__ import annotations

import hashlib
import re
import tomllib
from collections.abc import Callable, Collection, Iterable, Mapping, MutableMapping
from typing import Any

import tomlkit
from tomlkit.container import Container
from tomlkit.exceptions import TOMLKitError
from tomlkit.items import Comment, InlineTable, Table
from tomlkit.toml_document import TOMLDocument

from ..errors import BusyError, ConfigError, InvalidArgsError
from . import tomlscan
from .files import MAX_FILE_BYTES

CREATED_BY = "Created by lokictl new (lokid)."
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_INT64 = (-(2**63), 2**63 - 1)
_KINDS = "a string, an integer, a number, a boolean, or a list of strings and integers"


def etag(raw: bytes | None) -> str:
    """A version of a file's bytes (``sha256:`` and 32 hex digits); ``""`` for no file."""
    if raw is None:
        return ""
    return "sha256:" + hashlib.sha256(raw).hexdigest()[:32]


def parse_value(text: str) -> object:
    """What ``lokictl set key=VALUE`` means by VALUE: a TOML value of a kind a preset
    holds (``4096``, ``0.7``, ``true``, ``"123"``, ``["--jinja", "-fa", "on"]``),
    else the text itself (``mtp``, ``Qwen3-8B-Q4_K_M.gguf``)."""
    try:
        data = tomllib.loads(f"v = {text}")
    except tomllib.TOMLDecodeError:
        return text
    value = data.get("v")
    # "1\nctx = 2" would parse as two keys: the text was not one value
    if len(data) != 1 or not _settable(value):
        return text
    return value


def check_edit(keys: Collection[str], values: Iterable[object] = ()) -> None:
    """Refuse, before any work, an edit larger than a preset file may be: more than
    :data:`~lokid.core.config.tomlscan.MAX_KEYS` keys, a key longer than
    :data:`~lokid.core.config.tomlscan.MAX_KEY_LENGTH`, or keys and ``values`` of more than
    :data:`~lokid.core.config.files.MAX_FILE_BYTES` together (InvalidArgsError)."""
    if len(keys) > tomlscan.MAX_KEYS:
        raise InvalidArgsError(f"{len(keys)} keys in one edit: at most {tomlscan.MAX_KEYS}, "
                               f"as many as a preset file may hold")
    size = 0
    for key in keys:
        if len(key) > tomlscan.MAX_KEY_LENGTH:
            raise InvalidArgsError(f"a key of {len(key)} characters ({key[:40]!r}…): at most "
                                   f"{tomlscan.MAX_KEY_LENGTH}")
        size += len(key) + 4
    for value in values:
        size += _size(value)
        if size > MAX_FILE_BYTES:
            break
    if size > MAX_FILE_BYTES:
        raise InvalidArgsError(f"more than {MAX_FILE_BYTES} bytes of keys and values in one "
                               f"edit: at most {MAX_FILE_BYTES}, the size of a preset file")


def _size(value: object) -> int:
    if isinstance(value, str):
        return len(value.encode("utf-8", "surrogatepass")) + 2
    if isinstance(value, list | tuple):
        return 2 + sum(_size(v) + 2 for v in value)
    return len(repr(value))


def set_keys(text: str, values: Mapping[str, object],
             cancelled: Callable[[], bool] | None = None) -> str:
    """``text`` with each dotted key of ``values`` set, everything else as it was.

    ConfigError when ``text`` is not TOML, a key is not a preset key name, a
    value is not of a kind a preset holds, or a key names a table as a whole
    (``spec``) or a key inside something that is not a table.
    """
    edits = [(key, _set, (_split(key), _item(key, value))) for key, value in values.items()]
    return _edit(text, edits, cancelled)


def unset_keys(text: str, keys: Iterable[str],
               cancelled: Callable[[], bool] | None = None) -> str:
    """``text`` without each dotted key of ``keys``, everything else as it was.

    A table whose last key goes is removed with its header, unless it holds a comment
    (then header and comments stay). A key that is not set, ``model`` (required) or a
    whole table is a ConfigError.
    """
    edits: list[tuple[str, Callable[..., None], tuple[Any, ...]]] = []
    for key in keys:
        parts = _split(key)
        if parts == ("model",):
            raise ConfigError("model is required: set another model instead of unsetting it")
        edits.append((key, _unset, (parts,)))
    return _edit(text, edits, cancelled)


def new_text(values: Mapping[str, object]) -> str:
    """The text of a new preset holding ``values`` (dotted keys, ``model`` required, or
    ``url`` for ``kind = "external"``): a first comment line, ``kind``, ``model``, the
    other top-level keys, then the tables."""
    if values.get("kind") == "external":
        if "url" not in values:
            raise ConfigError("url is required for kind = \"external\" (the API's base URL, "
                              "/v1 included)")
    elif "model" not in values:
        raise ConfigError("model is required (a file name found in model_dirs, "
                          "or an absolute path)")
    ordered = sorted(values.items(),
                     key=lambda kv: (kv[0] != "kind", kv[0] != "model",
                                     len(_split(kv[0])) > 1))
    return set_keys(f"# {CREATED_BY}\n", dict(ordered))


# --- keys and values -----------------------------------------------------------


def _split(key: str) -> tuple[str, ...]:
    parts = tuple(key.split("."))
    if len(parts) > 2 or not all(_BARE_KEY.fullmatch(part) for part in parts):
        raise ConfigError(f"{key!r} is not a preset key: write NAME or TABLE.NAME, each "
                          "part made of letters, digits, _ and - (e.g. ctx, spec.mode)")
    return parts


def _settable(value: object) -> bool:
    if isinstance(value, bool | float | str):
        return True
    if isinstance(value, int):
        return _INT64[0] <= value <= _INT64[1]
    if isinstance(value, list | tuple):
        return all(isinstance(v, str) or (isinstance(v, int) and not isinstance(v, bool)
                                          and _INT64[0] <= v <= _INT64[1]) for v in value)
    return False


def _item(key: str, value: object) -> Any:
    if isinstance(value, Mapping):
        raise ConfigError(f"cannot set a table as a whole: set its keys one by one "
                          f"({key}.NAME = VALUE)", key=key)
    if not _settable(value):
        shown = repr(value)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        raise ConfigError(f"cannot be set to {shown}: the value must be {_KINDS} "
                          "(integers within 64 bits)", key=key)
    return tomlkit.item(list(value) if isinstance(value, tuple) else value)


# --- editing -------------------------------------------------------------------


def _parse(text: str) -> TOMLDocument:
    """``text`` as a tomlkit document, within the bounds of a preset file."""
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_FILE_BYTES:
        raise ConfigError(f"too large: {size} bytes, the limit is {MAX_FILE_BYTES} bytes "
                          "(a preset is a few KB)")
    tomlscan.check_text(text, "")   # tomlkit recurses per bracket, as tomllib does
    try:
        return tomlkit.parse(text)
    except TOMLKitError as e:
        raise ConfigError(f"TOML syntax error: {e}") from None
    except (RecursionError, MemoryError) as e:
        raise ConfigError(f"cannot be parsed ({type(e).__name__})") from None


def _edit(text: str, edits: Iterable[tuple[str, Callable[..., None], tuple[Any, ...]]],
          cancelled: Callable[[], bool] | None = None) -> str:
    """Apply each ``change(doc, key, *args)`` of ``edits`` to one document of ``text``,
    written out once: linear in the number of keys (a parse and a write per key made
    10,000 keys minutes of work). ``cancelled`` is asked between keys."""
    doc = _parse(text)
    for key, change, args in edits:
        if cancelled is not None and cancelled():
            raise BusyError("lokid is stopping: the edit was cancelled, nothing written")
        try:
            change(doc, key, *args)
        except TOMLKitError as e:   # a layout tomlkit cannot edit (tables out of order, …)
            raise ConfigError(f"cannot be edited here: {e}", key=key) from None
    out: str = doc.as_string()
    return out


def _is_table(value: object) -> bool:
    # Table, InlineTable and the proxy of a table split by others ([a] [b] [a.c])
    return isinstance(value, MutableMapping)


def _set(doc: TOMLDocument, key: str, parts: tuple[str, ...], item: Any) -> None:
    container: MutableMapping[str, Any] = doc
    if len(parts) == 2:
        table, name = parts
        found = doc.get(table)
        if found is None:
            doc.append(table, tomlkit.table())
            found = doc[table]
        elif not _is_table(found):
            raise ConfigError(f"{table} holds {_kind(found)}, not a table of keys", key=key)
        container = found
    else:
        name = parts[0]
    current = container.get(name)
    if current is not None and _is_table(current):
        raise ConfigError(f"is a table: set its keys one by one ({key}.NAME = VALUE)", key=key)
    if current is None:
        _add(container, name, item)
    else:
        container[name] = item


def _add(container: MutableMapping[str, Any], name: str, item: Any) -> None:
    """Add the absent key ``name``: below its commented-out example (``#port = 8081``)
    when ``container`` holds one, else where tomlkit puts a new key."""
    body = container.value if isinstance(container, Table) else container
    if isinstance(body, Container):
        example = re.compile(rf"\s*#\s*{re.escape(name)}\s*=")
        for index, (k, it) in enumerate(body.body):
            if k is None and isinstance(it, Comment) and example.match(it.as_string()):
                if index + 1 < len(body.body):
                    # private, but what tomlkit's own append uses (0.11 to 0.15 at least)
                    body._insert_at(index + 1, name, item)
                    return
                break   # the last line: appending puts the key right below it
    container[name] = item


def _unset(doc: TOMLDocument, key: str, parts: tuple[str, ...]) -> None:
    container: Any = doc
    if len(parts) == 2:
        container = doc.get(parts[0])
        if not _is_table(container):
            container = None
    name = parts[-1]
    if container is None or name not in container:
        raise ConfigError(f"no key {key!r} in this preset; set: {', '.join(_set_keys(doc))}")
    if _is_table(container[name]):
        inside = ", ".join(f"{key}.{k}" for k in container[name]) or "none"
        raise ConfigError(f"is a table: unset its keys one by one (set: {inside})", key=key)
    del container[name]
    if len(parts) == 2 and _bare(container):
        del doc[parts[0]]


def _bare(table: object) -> bool:
    """Whether a table holds nothing an operator wrote: no key, no comment (its header's
    included). An unset that leaves ``[chat]`` so is removes the header too; a table
    that keeps a comment (the annotated example's ``[spec]``) keeps its header, as the
    comment documents it."""
    if isinstance(table, InlineTable):
        return not len(table)
    if not isinstance(table, Table) or len(table) or table.trivia.comment:
        return False
    return not any(k is not None or isinstance(it, Comment) for k, it in table.value.body)


def _set_keys(doc: TOMLDocument) -> list[str]:
    out: list[str] = []
    for key, value in doc.items():
        if _is_table(value):
            out.extend(f"{key}.{k}" for k in value)
        else:
            out.append(key)
    return out


def _kind(value: object) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"   # an array of tables ([[name]]) too
    return type(value).__name__
