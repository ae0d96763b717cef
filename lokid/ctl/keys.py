"""``lokictl keys add|list|change|revoke|rotate|remove``: the gateway's named client keys,
managed through the daemon (``org.lokid.Lokid1.Keys``, polkit action
``org.lokid.lokid1.manage-keys``).

- ``add`` and ``rotate`` print the new key alone on stdout (``KEY=$(lokictl keys add
  bob)`` takes it whole) and say on stderr that it is not shown again: the daemon keeps
  only its hash, and a key lost is a key rotated;
- limits are flags with the file's meaning (``--rpm`` is requests_per_minute); ``0`` or
  ``--no-rpm`` lifts one on ``change``; ``--models '*'`` opens every model again;
- ``--expires`` takes a duration from now (``30d``, ``12h``) or a date (``2027-01-31``,
  midnight UTC) or a date-time; ``never`` lifts it. lokictl turns it into seconds since
  the epoch, the API's form, so that every client of the API means the same instant.

The pure parts (durations, dates, options) are tested without a bus.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from dbus_fast import Variant

from ..core.names import KEYS_INTERFACE, OBJECT_PATH
from ..core.serve.keys import CLASSES
from ..host.buscall import plain
from .client import EXIT_OK, EXIT_USAGE, Client, CtlError

# flag → the limit's name in the file and the API
LIMIT_FLAGS = {"max-in-flight": "max_in_flight", "rpm": "requests_per_minute",
               "tpm": "tokens_per_minute", "tokens-per-day": "tokens_per_day",
               "tokens-per-month": "tokens_per_month"}
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"(\d{1,9})([smhdw])")
MAX_GRACE = 366 * 86400


def duration(text: str) -> int:
    """``90s``, ``10m``, ``1h``, ``30d``, ``2w`` in seconds; CtlError otherwise."""
    m = _DURATION.fullmatch(text.strip())
    if not m:
        raise CtlError(f"{text[:40]!r} is no duration: a number and s, m, h, d or w "
                       "(such as 1h or 30d)", EXIT_USAGE)
    return int(m.group(1)) * _UNITS[m.group(2)]


def expiry(text: str, now: float) -> int:
    """``--expires``: seconds since the epoch (0: never)."""
    text = text.strip()
    if text == "never":
        return 0
    if _DURATION.fullmatch(text):
        return int(now) + duration(text)
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise CtlError(f"--expires {text[:40]!r}: a duration from now (30d, 12h), a date "
                       "(2027-01-31, UTC) or a date-time (2027-01-31T12:00:00Z), or never",
                       EXIT_USAGE) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return int(when.timestamp())


def options(args: Mapping[str, Any], now: float) -> dict[str, Variant]:
    """The a{sv} of AddKey and ChangeKey from the parsed flags (None: not given)."""
    out: dict[str, Variant] = {}
    if args.get("klass"):
        out["class"] = Variant("s", args["klass"])
    if args.get("models") is not None:
        models = [m.strip() for m in str(args["models"]).split(",") if m.strip()]
        out["models"] = Variant("as", models)
    for flag, name in LIMIT_FLAGS.items():
        attr = flag.replace("-", "_")
        value = args.get(attr)
        if args.get("no_" + attr):
            value = 0
        if value is not None:
            if value < 0:
                raise CtlError(f"--{flag}: 0 (no limit) or more", EXIT_USAGE)
            out[name] = Variant("t", int(value))
    if args.get("expires") is not None:
        out["expires"] = Variant("x", expiry(str(args["expires"]), now))
    return out


def add_parsers(sub: Any) -> None:
    """``lokictl keys …`` under lokictl's command table."""
    keys = sub.add_parser("keys", help="the gateway's client keys: add, list, change, "
                          "revoke, rotate, remove")
    verbs = keys.add_subparsers(dest="keys_command", required=True)
    for verb, helptext in (("add", "make a key NAME and print it (once)"),
                           ("change", "change key NAME's scope, class, limits or expiry")):
        s = verbs.add_parser(verb, help=helptext)
        s.add_argument("name")
        s.add_argument("--models", metavar="A,B*", help="presets (names, aliases or "
                       "patterns) the key may use; '*': every model (the default)")
        s.add_argument("--class", dest="klass", choices=CLASSES,
                       help="who is served first when requests wait (default interactive)")
        for flag in LIMIT_FLAGS:
            s.add_argument(f"--{flag}", type=int, metavar="N", help="0: no limit")
            if verb == "change":
                s.add_argument(f"--no-{flag}", action="store_true", help=argparse.SUPPRESS)
        s.add_argument("--expires", metavar="30d|2027-01-31", help="when the key stops "
                       "working ('never' lifts it)")
    s = verbs.add_parser("list", help="every key (never a hash)")
    s.add_argument("--json", action="store_true")
    for verb, helptext in (("revoke", "refuse key NAME from its next request on (kept in "
                            "the list, for its usage)"),
                           ("remove", "delete key NAME from the file")):
        verbs.add_parser(verb, help=helptext).add_argument("name")
    s = verbs.add_parser("rotate", help="a new key for NAME, printed once")
    s.add_argument("name")
    s.add_argument("--grace", metavar="1h", help="how long the old key still works "
                   "(default: it stops now)")


async def cmd_keys(c: Client, args: argparse.Namespace) -> int:
    verb = str(args.keys_command)
    if verb == "list":
        return await _list(c, bool(args.json))
    name = str(args.name)
    if verb in ("add", "change"):
        opts = options(vars(args), time.time())
        if verb == "add":
            (key,) = await _call(c, "AddKey", "sa{sv}", [name, opts])
            return _shown(name, str(key))
        if not opts:
            raise CtlError("keys change: nothing to change (see lokictl keys change --help)",
                           EXIT_USAGE)
        await _call(c, "ChangeKey", "sa{sv}", [name, opts])
        print(f"{name}: changed")
        return EXIT_OK
    if verb == "rotate":
        grace = duration(str(args.grace)) if args.grace else 0
        if grace > MAX_GRACE:
            raise CtlError("--grace: at most 366d", EXIT_USAGE)
        (key,) = await _call(c, "RotateKey", "sa{sv}", [name, {"grace": Variant("t", grace)}])
        return _shown(name, str(key))
    await _call(c, "RevokeKey" if verb == "revoke" else "RemoveKey", "s", [name])
    print(f"{name}: {'revoked' if verb == 'revoke' else 'removed'}")
    return EXIT_OK


async def _call(c: Client, member: str, signature: str = "", body: Any = ()) -> list[Any]:
    return await c._call(OBJECT_PATH, KEYS_INTERFACE, member, signature, body)


def _shown(name: str, key: str) -> int:
    print(key, flush=True)
    print(f"lokictl: the key of {name!r} is shown this once: lokid keeps only its hash",
          file=sys.stderr)
    return EXIT_OK


async def _list(c: Client, as_json: bool) -> int:
    (rows,) = await _call(c, "ListKeys")
    keys = [plain(r) for r in rows]
    if as_json:
        print(json.dumps(keys, indent=2, sort_keys=True))
        return EXIT_OK
    if not keys:
        print("no keys")
        return EXIT_OK
    table = [("NAME", "PREFIX", "CLASS", "STATE", "MODELS", "LIMITS", "EXPIRES")]
    for k in keys:
        limits = " ".join(f"{flag}={k[name]}" for flag, name in LIMIT_FLAGS.items()
                          if name in k)
        table.append((k["name"], k["prefix"] + "…", k["class"], k["state"],
                      ",".join(k["models"]) or "*", limits or "-",
                      _day(k["expires"]) if "expires" in k else "never"))
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    for row in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    return EXIT_OK


def _day(seconds: int) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%d %H:%M UTC")
