"""What a peer gateway's ``GET /v1/models`` may say, and what this gateway keeps of it
(issue 45, items 2 and 3). Part of the pure core: bytes in, a :class:`Listing` or a
:class:`ListingRefused` naming why out; :mod:`lokid.gateway.peers` reads the bytes.

A peer is another host, maybe broken, maybe lying. Rules, each for a failure it prevents:

- at most :data:`MAX_BYTES` are read (a Content-Length over it is refused before any
  byte, a body is cut where it passes it): a 600 MiB answer is never held. 256 models
  as lokid lists them take some 40 KiB;
- nesting: Python's json gives up on a listing nested past its recursion limit (some
  1,000 levels; a listing 100,000 lists deep is refused after 0.3 ms) with a
  RecursionError, which no rule caught: it ended that peer's reads for good without a
  line, its last listing left "up". It is a refusal now; and nothing past the four
  levels of a listing (``{"data": [{"lokid": {…}}]}``) is read: a value nested deeper
  in an entry is dropped. (A scan of the bytes for depth before parsing was tried: on a
  MiB of quotes or escapes it cost more than the parse it would have spared.);
- at most :data:`MAX_MODELS` models: 87,000 of them (4 MiB) made every client's
  ``/health`` wait for their parsing (p99 6.6 ms → 341 ms) and each ``/v1/models``
  1.1–1.8 s for their merging. Each ``/v1/models`` lists a peer's models again (their
  JSON): 1,024 cost it 7 ms a request (a client asking in a loop took /health's p99
  to 37 ms), 256 some 2 ms; a lokid host has tens of presets;
- a model id is 1 to :data:`MAX_ID` letters, digits and ``_ . - : @ +``, starting
  with a letter or a digit, in parts joined by ``/`` (``org/model:q4``), and no IP
  address (:func:`valid_id`): an entry whose id is not (a URL, markup, an address) is
  left out and counted, never shown; an id is never cut (a cut name would route to
  another model);
- of an entry's ``lokid`` facts only what the routing rule reads is kept, typed: its
  state a word, ``in_flight`` a count, ``on_demand`` and ``fits`` booleans, ``status``
  at most :data:`MAX_STATUS` printable characters; and what a client picks a model by
  (issue 46, item 5): ``alias_of`` a model id (the rule above), ``context_length`` a
  count, ``capabilities`` the known words only (:data:`lokid.core.model.modeltraits
  .CAPABILITIES`). An alias is an entry of its own, so it counts in :data:`MAX_MODELS`
  and its id follows the id rule. Anything else a peer writes there is dropped: no text
  of a peer's reaches a client beyond a model id and its status;
- what cache-affine routing reads (issue 47, item 2; :mod:`lokid.core.serve.affinity`):
  ``slots`` a count up to :data:`MAX_SLOTS`, and ``prefixes``, the fingerprints of the
  prompts the peer's engine holds, each 16 hex digits, at most :data:`MAX_PREFIXES` (a
  longer list, or one with anything else in it, is dropped whole: a peer that lists
  10,000 claims one replica holds every prompt), and never shown to a client
  (:func:`prefixes_of` takes them out of the facts).

A refusal's reason is ours, fixed text and figures: never the peer's bytes, which may
name its address or carry anything.
"""

from __future__ import annotations

import ipaddress
import json
import re
from dataclasses import dataclass
from typing import Any

from ..model.modeltraits import CAPABILITIES
from .route import READY, Model

MAX_BYTES = 1024 * 1024
MAX_MODELS = 256
MAX_ID = 128
MAX_STATUS = 200
MAX_IN_FLIGHT = 1_000_000
MAX_SLOTS = 4096
MAX_PREFIXES = 256     # a peer's prefix fingerprints kept per model
EXTERNAL = "external"

_PART = r"[A-Za-z0-9][A-Za-z0-9_.:@+-]*"
_ID = re.compile(f"{_PART}(?:/{_PART})*")   # "qwen", "org/model:q4"; no "http://…"
_WORD = re.compile(r"[a-z][a-z_-]{0,31}")
_PRINT = re.compile(r"[0-9a-f]{16}")


class ListingRefused(ValueError):
    """A peer's answer that is not taken: its message says why, in our words."""


@dataclass(frozen=True)
class Listing:
    models: dict[str, dict[str, Any]]   # model id → its typed lokid facts ({}: none)
    left_out: int = 0                   # entries whose id is no model name


def over_size(content_length: int | None) -> str | None:
    """Why an answer announcing ``content_length`` bytes is refused unread, or None."""
    if content_length is not None and content_length > MAX_BYTES:
        return f"its /v1/models is {content_length} bytes: at most {MAX_BYTES}"
    return None


def valid_id(name: Any) -> bool:
    """Whether a peer's ``name`` may be listed and routed: the id rule above, and no
    address (an IP, with a port or not)."""
    if not isinstance(name, str) or len(name) > MAX_ID or _ID.fullmatch(name) is None:
        return False
    for candidate in (name, name.rsplit(":", 1)[0]):
        try:
            ipaddress.ip_address(candidate)
            return False
        except ValueError:
            pass
    return True


def read_listing(data: bytes) -> Listing:
    """The models of a peer's /v1/models answer ``data``; ListingRefused saying why for
    one that is too big, too deep, not JSON, not a model list, or lists too many."""
    if len(data) > MAX_BYTES:
        raise ListingRefused(f"its /v1/models is over {MAX_BYTES} bytes")
    try:
        parsed = json.loads(data)
    except RecursionError:
        raise ListingRefused("its /v1/models nests deeper than JSON is read here") from None
    except ValueError:
        raise ListingRefused("its /v1/models answer is not JSON") from None
    entries = parsed.get("data") if isinstance(parsed, dict) else None
    if not isinstance(entries, list):
        raise ListingRefused("its /v1/models answer is not a model list")
    if len(entries) > MAX_MODELS:
        raise ListingRefused(f"its /v1/models lists {len(entries)} models: at most "
                             f"{MAX_MODELS}")
    models: dict[str, dict[str, Any]] = {}
    left_out = 0
    for entry in entries:
        name = entry.get("id") if isinstance(entry, dict) else None
        if not valid_id(name):
            left_out += 1
            continue
        assert isinstance(entry, dict) and isinstance(name, str)
        models.setdefault(name, facts_of(entry.get("lokid")))
    return Listing(models, left_out)


def facts_of(facts: Any) -> dict[str, Any]:
    """What is kept of an entry's ``lokid`` facts: the keys the routing rule reads, each
    of its type, or left out."""
    if not isinstance(facts, dict):
        return {}
    kept: dict[str, Any] = {}
    if "state" in facts:
        state = facts["state"]
        kept["state"] = state if isinstance(state, str) and _WORD.fullmatch(state) \
            else "unknown"
    for key in ("on_demand", "fits"):
        if isinstance(facts.get(key), bool):
            kept[key] = facts[key]
    if "fits" in facts and facts["fits"] is None:
        kept["fits"] = None
    in_flight = facts.get("in_flight")
    if isinstance(in_flight, int) and not isinstance(in_flight, bool) \
            and 0 <= in_flight <= MAX_IN_FLIGHT:
        kept["in_flight"] = in_flight
    status = facts.get("status")
    if isinstance(status, str):
        kept["status"] = "".join(c for c in status[:MAX_STATUS] if c.isprintable())
    if valid_id(facts.get("alias_of")):
        kept["alias_of"] = facts["alias_of"]
    length = facts.get("context_length")
    if isinstance(length, int) and not isinstance(length, bool) and 0 < length < 2**32:
        kept["context_length"] = length
    can = facts.get("capabilities")
    if isinstance(can, list):
        kept["capabilities"] = [c for c in CAPABILITIES if c in can]
    slots = facts.get("slots")
    if isinstance(slots, int) and not isinstance(slots, bool) and 0 < slots <= MAX_SLOTS:
        kept["slots"] = slots
    prints = facts.get("prefixes")
    if isinstance(prints, list) and len(prints) <= MAX_PREFIXES and all(
            isinstance(p, str) and _PRINT.fullmatch(p) for p in prints):
        kept["prefixes"] = tuple(int(p, 16) for p in prints)
    return kept


def prefixes_of(facts: dict[str, Any]) -> tuple[int, ...]:
    """The prefix fingerprints of an entry's kept facts, taken out of them: they are
    for routing, never shown to a client."""
    prints = facts.pop("prefixes", ())
    return prints if isinstance(prints, tuple) else ()


def model_of(facts: dict[str, Any]) -> Model:
    """An entry's kept facts as the routing rule reads them; an entry without them (an
    OpenAI API, not a lokid gateway) counts as ready."""
    if "state" not in facts:
        return Model(READY)
    state = facts["state"]
    if state == EXTERNAL:
        return Model(READY, kind=EXTERNAL)
    return Model(state, facts.get("in_flight", 0), facts.get("on_demand") is True,
                 facts.get("fits"), slots=facts.get("slots", 0))
