"""Named client keys: who sends a request to the gateway, what it may use, its limits.

A team's gateway has one key per person, team or service, each with a name
(:data:`NAME_RULE`), the models it may use (names or shell patterns, ``*`` for
all), a class (``interactive`` or ``batch``: who is served first when requests
wait, :mod:`lokid.gateway.admission`), optional limits and an optional expiry.
They live in :data:`KEYS_FILE` (a TOML table per key), written by lokid.service for
``lokictl keys`` and the D-Bus API (:mod:`lokid.store.keystore`), read by the
gateway, which re-reads it when it changes (:mod:`lokid.gateway.keys`)::

    [keys.alice]
    hash = "sha256:9f86d0…"        # of the whole key; the key itself is never stored
    prefix = "sk-loki-Ab3x"        # its first characters, to recognise it in a list
    class = "interactive"
    models = ["qwen*", "llama3"]
    max_in_flight = 4
    requests_per_minute = 60
    tokens_per_minute = 200000
    tokens_per_day = 2000000
    tokens_per_month = 40000000
    expires = 2027-06-30T00:00:00Z
    created = 2026-12-06T23:50:00Z
    # revoked = 2026-12-07T10:00:00Z      (kept: its usage keeps its name)
    # previous_hash / previous_until       (a rotated key's old one, until then)

Rules, each for a failure it prevents:

- only a hash is stored (SHA-256 of the key): a copy of the file, a backup or a
  ``cat`` by an operator gives no key. A key is 32 random bytes (:func:`new_secret`),
  so an unsalted fast hash is enough: nothing can be guessed from it, and a request
  is checked with one hash and one dictionary lookup, whatever the number of keys,
  in a time that says nothing of how close a guess came;
- a key is read from ``Authorization: Bearer KEY``, a bare ``Authorization: KEY`` and
  ``x-api-key: KEY`` (:func:`presented`): Anthropic's clients and litellm's
  ``anthropic/`` provider send the last one, and llama-server and llama.cpp's router take
  all three; every header that may carry a client's key (:data:`CLIENT_KEY_HEADERS`)
  is dropped before a request leaves the gateway, so no client's key ever reaches an
  engine, an external API or a peer gateway;
- an unknown field, a bad name or a bad value is an error naming the key's line: a
  typo in ``models`` must not open every model to a key, nor a typo in a limit lift it;
- the flat ``api_keys_file`` of earlier releases still works: each of its keys is an
  identity named ``keys-file:<8 hex of its hash>`` (told apart in usage without
  writing the key anywhere), interactive, every model, no limit.

Part of the pure core: no I/O but the read of the file it is given.
"""

from __future__ import annotations

import fnmatch
import hashlib
import re
import secrets
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from ..config.tomlread import Checker, key_line
from ..errors import ConfigError

KEYS_DIR = "/etc/loki/clients"   # not /etc/loki/keys: that one holds root-only secrets
KEYS_FILE = f"{KEYS_DIR}/keys.toml"
MAX_KEYS_BYTES = 4 * 1024 * 1024   # ~10,000 keys; a runaway file never fills memory
MAX_KEYS = 10000
MAX_PATTERNS = 64                  # models patterns per key
KEY_PREFIX = "sk-loki-"
SHOWN_PREFIX = len(KEY_PREFIX) + 4  # characters of a key kept to recognise it
NAME_RULE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,63}")
INTERACTIVE = "interactive"
BATCH = "batch"
CLASSES = (INTERACTIVE, BATCH)
LIMITS = ("max_in_flight", "requests_per_minute", "tokens_per_minute", "tokens_per_day",
          "tokens_per_month")
FIELDS = ("hash", "prefix", "class", "models", *LIMITS, "expires", "created", "revoked",
          "previous_hash", "previous_until")
# Headers a client may put its key in; none of them leaves the gateway.
CLIENT_KEY_HEADERS = frozenset({"authorization", "x-api-key", "api-key", "proxy-authorization"})
ANONYMOUS_NAME = "anonymous"      # a gateway without keys: every request is this one
LEGACY_PREFIX = "keys-file:"      # a key of the flat api_keys_file
_HASH = re.compile(r"sha256:[0-9a-f]{64}")
_MAX_LIMIT = 10 ** 15


@dataclass(frozen=True)
class Limits:
    """A key's limits; None: none."""
    max_in_flight: int | None = None
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    tokens_per_day: int | None = None
    tokens_per_month: int | None = None

    def as_dict(self) -> dict[str, int]:
        return {k: v for k in LIMITS if (v := getattr(self, k)) is not None}


@dataclass(frozen=True)
class Identity:
    """Who a request is: what the gateway knows of its key, never the key."""
    name: str
    klass: str = INTERACTIVE
    models: tuple[str, ...] = ()   # empty: every model
    limits: Limits = field(default_factory=Limits)
    expires: float | None = None   # seconds since the epoch

    def allows(self, model: str) -> bool:
        """Whether this key may use ``model`` (a preset's name or alias, here or a peer's)."""
        return not self.models or any(fnmatch.fnmatchcase(model, p) for p in self.models)

    @property
    def batch(self) -> bool:
        return self.klass == BATCH


ANONYMOUS = Identity(ANONYMOUS_NAME)


@dataclass(frozen=True)
class KeyEntry:
    """One named key as the file holds it."""
    identity: Identity
    hash: str
    prefix: str = ""
    created: float | None = None
    revoked: float | None = None
    previous_hash: str = ""
    previous_until: float | None = None

    @property
    def name(self) -> str:
        return self.identity.name


def new_secret() -> str:
    """A new key: :data:`KEY_PREFIX` and 32 random bytes (43 URL-safe characters)."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


def digest(secret: str | bytes) -> str:
    """The stored form of a key."""
    data = secret.encode("utf-8", "surrogateescape") if isinstance(secret, str) else secret
    return "sha256:" + hashlib.sha256(data).hexdigest()


def legacy_identity(secret: str) -> Identity:
    """A key of the flat ``api_keys_file``: every model, no limit, named by its hash."""
    return Identity(LEGACY_PREFIX + digest(secret)[7:15])


def valid_name(name: str) -> bool:
    return bool(NAME_RULE.fullmatch(name))


def presented(headers: Mapping[str, str]) -> str | None:
    """The key a request carries: ``Authorization: Bearer KEY``, a bare
    ``Authorization: KEY``, or ``x-api-key: KEY``; None when it carries none."""
    auth = headers.get("Authorization", "").strip()
    if auth:
        scheme, _, rest = auth.partition(" ")
        return rest.strip() if scheme.lower() == "bearer" and rest.strip() else auth
    other = headers.get("x-api-key", "").strip()
    return other or None


class Lookup:
    """Keys by hash: :meth:`find` answers with one hash and one dictionary lookup."""

    def __init__(self, entries: Iterable[KeyEntry] = (), legacy: Iterable[str] = ()):
        self.by_hash: dict[str, KeyEntry | Identity] = {}
        self.names: dict[str, KeyEntry] = {}
        for secret in legacy:
            self.by_hash[digest(secret)] = legacy_identity(secret)
        for entry in entries:
            self.names[entry.name] = entry
            self.by_hash[entry.hash] = entry
            if entry.previous_hash:
                self.by_hash[entry.previous_hash] = entry

    def __len__(self) -> int:
        return len(self.by_hash)

    def find(self, secret: str, now: float) -> tuple[Identity | None, str]:
        """The identity of ``secret`` and "", or None and why it is refused: "" for a key
        nobody has, else that it was revoked, has expired, or was rotated."""
        hashed = digest(secret)
        found = self.by_hash.get(hashed)
        if found is None:
            return None, ""
        if isinstance(found, Identity):
            return found, ""
        ident = found.identity
        if found.revoked is not None and found.revoked <= now:
            return None, f"key {ident.name!r} was revoked"
        if ident.expires is not None and ident.expires <= now:
            return None, f"key {ident.name!r} has expired"
        if hashed == found.previous_hash and hashed != found.hash and (
                found.previous_until is None or found.previous_until <= now):
            return None, f"key {ident.name!r} was rotated: its new key replaces this one"
        return ident, ""


def _time(c: Checker, key: str) -> float | None:
    value = c.data.get(key)
    if value is None:
        return None
    if not isinstance(value, datetime):
        raise c.error(key, "must be a TOML date-time, such as 2027-01-31T00:00:00Z")
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.timestamp()


def _entry(path: str, text: str, name: str, table: Any) -> KeyEntry:
    where = f"keys.{name}" if NAME_RULE.fullmatch(name) else "keys"
    if not valid_name(name):
        raise ConfigError(f"key name {name[:64]!r} is not valid: letters, digits, '.', '_', "
                          "'@' and '-', at most 64, starting with a letter or digit",
                          path, key_line(text, name, "keys"), "keys")
    if not isinstance(table, dict):
        raise ConfigError("must be a table ([keys.NAME])", path, key_line(text, name, "keys"),
                          where)
    c = Checker(path, text, table, where)
    c.reject_unknown(FIELDS)
    hashed = c.string("hash")
    if hashed is None or not _HASH.fullmatch(hashed):
        raise c.error("hash", "must be \"sha256:\" and 64 lowercase hex digits (lokictl keys "
                      "add makes one)")
    klass = c.string("class", INTERACTIVE) or INTERACTIVE
    if klass not in CLASSES:
        raise c.error("class", f"must be one of {', '.join(CLASSES)}, not {klass[:32]!r}")
    models = c.string_list("models")
    if len(models) > MAX_PATTERNS or any(not m or len(m) > 256 for m in models):
        raise c.error("models", f"at most {MAX_PATTERNS} names or patterns, each 1 to 256 "
                      "characters")
    limits = Limits(**{k: c.integer(k, 1, _MAX_LIMIT, "a count") for k in LIMITS})
    previous = c.string("previous_hash", "") or ""
    if previous and not _HASH.fullmatch(previous):
        raise c.error("previous_hash", "must be \"sha256:\" and 64 lowercase hex digits")
    ident = Identity(name, klass, () if "*" in models else models, limits, _time(c, "expires"))
    return KeyEntry(ident, hashed, c.string("prefix", "") or "", _time(c, "created"),
                    _time(c, "revoked"), previous, _time(c, "previous_until"))


def parse(text: str, path: str = KEYS_FILE) -> dict[str, KeyEntry]:
    """The keys ``text`` holds, by name; ConfigError naming the line of the first fault.
    A hash held by two keys is an error (which one would a request be?)."""
    if len(text.encode("utf-8", "surrogatepass")) > MAX_KEYS_BYTES:
        raise ConfigError(f"over {MAX_KEYS_BYTES} bytes", path)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"TOML syntax error: {e}", path) from None
    unknown = sorted(set(data) - {"keys"})
    if unknown:
        raise ConfigError(f"unknown table or key {unknown[0][:64]!r}: this file holds "
                          "[keys.NAME] tables only", path, key_line(text, unknown[0]))
    tables = data.get("keys", {})
    if not isinstance(tables, dict):
        raise ConfigError("keys must be tables ([keys.NAME])", path, key_line(text, "keys"))
    if len(tables) > MAX_KEYS:
        raise ConfigError(f"over {MAX_KEYS} keys", path)
    entries: dict[str, KeyEntry] = {}
    seen: dict[str, str] = {}
    for name, table in tables.items():
        entry = _entry(path, text, name, table)
        for hashed in filter(None, (entry.hash, entry.previous_hash)):
            if seen.setdefault(hashed, name) != name:
                raise ConfigError(f"keys {seen[hashed]!r} and {name!r} have the same hash",
                                  path, key_line(text, "hash", f"keys.{name}"))
        entries[name] = entry
    return entries
