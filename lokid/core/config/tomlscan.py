"""Bounds on an untrusted TOML text: before tomllib reads it, and on what it returns.

The daemon reads every file in the presets directory, and one bad file must
harm only itself. tomllib has two costs a short file can blow up: it recurses
once per ``[`` or ``{`` (``extra_args = [[[[…]]]]`` a thousand deep raises
RecursionError), and it checks every prefix of a dotted key (one key
``a.a.a.…`` of 32 KB took 11 s, quadratic in its parts). :func:`check_text` is
a linear lexer that bounds both before tomllib runs: it knows comments and the
four kinds of strings, so brackets and dots inside them do not count.

:func:`check_values` walks what tomllib returned, without recursion: it bounds
the number and length of keys, and refuses control characters in every key
and string value. A NUL cannot cross D-Bus (the daemon would fail to send the
error), and a newline in a key would forge a second line of it; so an error
names such a key by its position (``[spec]: key 2``), never by its bytes.

No I/O here: :mod:`lokid.core.config.files` reads the file within its own bounds.
"""

from __future__ import annotations

import re
import tomllib
from typing import Any

from ..errors import ConfigError

MAX_DEPTH = 16          # [ and { open at once; a [[table]] header counts 2
MAX_KEY_PARTS = 8       # parts of one dotted key (spec.mode has 2)
MAX_KEYS = 256          # keys in the whole file, every table counted (a preset has ~12)
MAX_KEY_LENGTH = 128    # characters in one key

# Outside strings, the characters the lexer acts on; everything else is skipped.
_CODE_STOP = re.compile(r"[\"'#\[\]{}.=,\n]")
_BASIC_STOP = re.compile(r'["\\\n]')
_LITERAL_STOP = re.compile(r"['\n]")
_ML_BASIC_STOP = re.compile(r'["\\]')
# A string token worth decoding when looking for the line of a bad key or value.
_SUSPECT = re.compile(r"[\\\x00-\x1f\x7f-\x9f]")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
# Decoding a suspect string costs a tomllib call: enough for any real file.
_MAX_LOOKUPS = 1000

Span = tuple[int, int]


def _line(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def check_text(text: str, path: str) -> list[Span]:
    """Refuse ``text`` nested deeper than :data:`MAX_DEPTH` or with a dotted key of
    more than :data:`MAX_KEY_PARTS` parts; return the spans of its string tokens that
    hold an escape or a control character (for :func:`check_values`).

    Where the text is not valid TOML the lexer may read it differently from
    tomllib, but only after the point where tomllib stops with a syntax error:
    a string ends at a newline unless it is a multi-line one, as in tomllib.
    """
    suspects: list[Span] = []
    depth = 0
    dots = 0
    pos = 0
    while (m := _CODE_STOP.search(text, pos)) is not None:
        pos = m.start()
        ch = text[pos]
        if ch == "#":
            end = text.find("\n", pos)
            pos = len(text) if end < 0 else end
            continue
        if ch in "\"'":
            end = _string_end(text, pos)
            if _SUSPECT.search(text, pos, end):
                suspects.append((pos, end))
            pos = end
            continue
        if ch in "[{":
            depth += 1
            dots = 0
            if depth > MAX_DEPTH:
                raise ConfigError(
                    f"nested more than {MAX_DEPTH} levels deep (arrays and inline tables "
                    "inside one another): a preset needs 2 or 3", path, _line(text, pos))
        elif ch in "]}":
            depth = max(depth - 1, 0)
            dots = 0
        elif ch == ".":
            dots += 1
            if dots >= MAX_KEY_PARTS:
                raise ConfigError(
                    f"a dotted key of more than {MAX_KEY_PARTS} parts (such as spec.mode, "
                    "which has 2)", path, _line(text, pos))
        else:  # = , and newline end a key
            dots = 0
        pos += 1
    return suspects


def _string_end(text: str, pos: int) -> int:
    """The end of the string token that starts at ``pos`` (its closing quote included)."""
    quote = text[pos]
    if text.startswith(quote * 3, pos):
        if quote == "'":
            end = text.find("'''", pos + 3)
            return len(text) if end < 0 else _closing_quotes(text, end + 3, quote)
        i = pos + 3
        while (m := _ML_BASIC_STOP.search(text, i)) is not None:
            if m.group() == "\\":
                i = m.start() + 2
            elif text.startswith('"""', m.start()):
                return _closing_quotes(text, m.start() + 3, quote)
            else:
                i = m.start() + 1
        return len(text)
    if quote == "'":
        m = _LITERAL_STOP.search(text, pos + 1)
    else:
        i = pos + 1
        while (m := _BASIC_STOP.search(text, i)) is not None and m.group() == "\\":
            # an escape; a backslash before a newline is a syntax error, and the
            # newline still ends the string
            i = m.start() + (1 if text.startswith("\\\n", m.start()) else 2)
    if m is None:
        return len(text)
    return m.end() if m.group() == quote else m.start()


def _closing_quotes(text: str, pos: int, quote: str) -> int:
    """After a closing triple quote, up to two more quotes still belong to the string."""
    for _ in range(2):
        if text.startswith(quote, pos):
            pos += 1
    return pos


def show_key(key: str) -> str:
    """``key`` as an error may show it: bare when it is a bare TOML key, else quoted with
    every character that is not printable written as an escape."""
    if _BARE_KEY.fullmatch(key):
        return key
    out = []
    for ch in key:
        if ch in '"\\':
            out.append("\\" + ch)
        elif not ch.isprintable():
            out.append(f"\\u{ord(ch):04x}" if ord(ch) <= 0xFFFF else f"\\U{ord(ch):08x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _control(text: str) -> str | None:
    """``U+XXXX`` of the first control character in ``text``, None when it has none."""
    m = _CONTROL.search(text)
    return None if m is None else f"U+{ord(m.group()):04X}"


def _table(where: str) -> str:
    return f"[{where}]" if where else ""


def check_values(data: dict[str, Any], text: str, path: str, suspects: list[Span]) -> None:
    """Refuse more than :data:`MAX_KEYS` keys, a key longer than :data:`MAX_KEY_LENGTH`,
    and a control character in any key or string (arrays and nested tables included).

    ``where`` below is the dotted path of the value being looked at, built only
    from keys already checked and shown with :func:`show_key`.
    """
    count = 0
    stack: list[tuple[str, object]] = [("", data)]
    while stack:
        where, value = stack.pop()
        if isinstance(value, dict):
            children: list[tuple[str, object]] = []
            for number, (key, item) in enumerate(value.items(), start=1):
                count += 1
                if count > MAX_KEYS:
                    raise ConfigError(f"more than {MAX_KEYS} keys: a preset needs a dozen",
                                      path)
                bad = _control(key)
                if bad is not None:
                    raise ConfigError(f"key {number} contains a control character ({bad})",
                                      path, _string_line(text, suspects, key), _table(where))
                if len(key) > MAX_KEY_LENGTH:
                    raise ConfigError(f"key {number} is {len(key)} characters long, more than "
                                      f"{MAX_KEY_LENGTH}", path, None, _table(where))
                shown = show_key(key)
                children.append((f"{where}.{shown}" if where else shown, item))
            stack.extend(reversed(children))
        elif isinstance(value, list):
            nested: list[tuple[str, object]] = []
            for i, item in enumerate(value):
                if isinstance(item, str):
                    bad = _control(item)
                    if bad is not None:
                        raise ConfigError(f"item {i} contains a control character ({bad})",
                                          path, _string_line(text, suspects, item), where)
                elif isinstance(item, (dict, list)):
                    nested.append((f"{where}[{i}]", item))
            stack.extend(reversed(nested))
        elif isinstance(value, str):
            bad = _control(value)
            if bad is not None:
                raise ConfigError(f"contains a control character ({bad})",
                                  path, _string_line(text, suspects, value), where)


def _string_line(text: str, suspects: list[Span], wanted: str) -> int | None:
    """The line of the first string token of ``text`` that reads as ``wanted``, if any.

    A string with a control character is written with an escape (``"\\u0000"``)
    or holds a tab or a newline, so its token is among the suspects.
    """
    for start, end in suspects[:_MAX_LOOKUPS]:
        try:
            found = tomllib.loads("x = " + text[start:end]).get("x")
        except tomllib.TOMLDecodeError:
            continue
        if found == wanted:
            return _line(text, start)
    return None
