"""The engine's own figures read from its answer (issue 46, item 2): what a request cost,
in the engine's words, never an estimate.

An answer of llama-server carries ``timings`` (``prompt_n``: prompt tokens it computed,
``cache_n``: prompt tokens it took from its cache, ``predicted_n``: tokens generated,
``prompt_ms`` and ``predicted_ms``: its time on each); an API elsewhere (an external
preset) and the engine's embeddings and rerank answers carry OpenAI's ``usage`` only.
:func:`figures_of` reads either from a whole answer or from the tail of a stream
(:class:`Tail`), ``timings`` first.

Rules, each for a failure it prevents:

- prompt tokens are ``prompt_n + cache_n`` and cached ``cache_n``: ``prompt_n`` alone is
  what the engine computed, and a prompt served from its cache would be counted short
  (OpenAI's ``usage.prompt_tokens`` counts the whole prompt too, and
  ``prompt_tokens_details.cached_tokens`` the part from cache);
- an answer is never parsed whole to learn two fields: the key (``"timings"``, else
  ``"usage"``) is found from the answer's end, and only its value is decoded, from a
  window of :data:`WINDOW` bytes (an embeddings answer of 1 MiB cost 10 ms of the event
  loop in ``json.loads``). A match counts only where it is a key (``{`` or ``,`` before
  it, ``:`` after it): inside a JSON string a quote is escaped, so a prompt or an answer
  that says ``"timings":`` is never read as one;
- a stream is never held: :class:`Tail` keeps its last :data:`TAIL` bytes (the last
  event that has the figures: llama-server writes ``timings`` in its last event, and
  ``usage`` with ``stream_options.include_usage`` in the one after), whatever the
  stream's length;
- Anthropic's stream (``/v1/messages``) says its prompt in its first event
  (``message_start``'s ``usage``) and its output in a late one (``message_delta``'s):
  :class:`Tail` keeps the stream's first :data:`HEAD` bytes too, and a last ``usage``
  with no prompt takes the prompt from there (a long stream's tail has lost it).
  llama-server b11434 leaves ``message_start`` out of some streams (1 in 6 to 12 asked
  directly here): such an answer says no prompt, and its prompt is counted 0;
- a value that is not a count (negative, not a whole number, absurd) is no figure: the
  answer has none (:data:`UNKNOWN`), rather than a count that poisons the totals.

Part of the gateway; no I/O. :func:`tail_of` is the request's tail, for the relay and the
tunnel (:mod:`lokid.gateway.usage` reads it at the answer's end).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from aiohttp import web

WINDOW = 4096            # bytes after a key decoded for its value (a timings object: ~250)
TAIL = 64 * 1024         # bytes of a stream's end kept for its figures
HEAD = 8 * 1024          # bytes of a stream's beginning kept (Anthropic's message_start)
_MAX = 10 ** 12          # beyond: no figure (an engine's lie, not a count)
_DECODER = json.JSONDecoder()
_SPACE = b" \t\r\n"


@dataclass(frozen=True)
class Figures:
    """A request's cost as its answer says it. ``known``: read from the answer (False: it
    had none, or it was cut off before them: the counts are then 0)."""
    prompt_tokens: int = 0
    cached_tokens: int = 0
    generated_tokens: int = 0
    engine_ms: float = 0.0
    known: bool = False

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.generated_tokens


UNKNOWN = Figures()


def _count(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if value != value or value < 0 or value > _MAX or int(value) != value:
        return None
    return int(value)


def _ms(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if 0 <= value <= _MAX else None


def from_timings(t: dict[str, Any]) -> Figures | None:
    """llama-server's ``timings``; None when they are not its counts."""
    if "prompt_n" not in t and "predicted_n" not in t:
        return None
    prompt, cached = _count(t.get("prompt_n", 0)), _count(t.get("cache_n", 0))
    generated = _count(t.get("predicted_n", 0))
    prompt_ms, predicted_ms = _ms(t.get("prompt_ms", 0)), _ms(t.get("predicted_ms", 0))
    if prompt is None or cached is None or generated is None or prompt_ms is None \
            or predicted_ms is None:
        return None
    return Figures(prompt + cached, cached, generated, prompt_ms + predicted_ms, True)


def from_usage(u: dict[str, Any]) -> Figures | None:
    """OpenAI's ``usage`` (``prompt_tokens``, ``completion_tokens``, cached in
    ``prompt_tokens_details``), or Anthropic's (``input_tokens`` + cache reads,
    ``output_tokens``); None when it is neither."""
    if "prompt_tokens" in u or "completion_tokens" in u:
        prompt = _count(u.get("prompt_tokens", 0))
        generated = _count(u.get("completion_tokens", 0))
        details = u.get("prompt_tokens_details")
        cached = _count(details.get("cached_tokens", 0) or 0) \
            if isinstance(details, dict) else 0
    elif "input_tokens" in u or "output_tokens" in u:
        cached = _count(u.get("cache_read_input_tokens", 0) or 0)
        inputs = _count(u.get("input_tokens", 0) or 0)
        created = _count(u.get("cache_creation_input_tokens", 0) or 0)
        prompt = None if None in (inputs, cached, created) else \
            inputs + cached + created  # type: ignore[operator]
        generated = _count(u.get("output_tokens", 0) or 0)
    else:
        return None
    if prompt is None or generated is None or cached is None or cached > prompt:
        return None
    return Figures(prompt, cached, generated, 0.0, True)


def _value_at(data: bytes, key: bytes) -> Any:
    """The value of the last ``key`` in ``data`` that is a JSON key; None if none."""
    end = len(data)
    while True:
        pos = data.rfind(key, 0, end)
        if pos < 0:
            return None
        end = pos
        before = pos - 1
        while before >= 0 and data[before] in _SPACE:
            before -= 1
        after = pos + len(key)
        while after < len(data) and data[after] in _SPACE:
            after += 1
        if before < 0 or data[before] not in b"{," or data[after:after + 1] != b":":
            continue
        text = data[after + 1:after + 1 + WINDOW].decode("utf-8", "replace").lstrip()
        try:
            return _DECODER.raw_decode(text)[0]
        except ValueError:
            return None


def figures_of(data: bytes) -> Figures:
    """The figures in an answer (whole, or a stream's tail): its last ``timings``, else
    its last ``usage``; :data:`UNKNOWN` when it has neither."""
    if b'"timings"' in data:
        timings = _value_at(data, b'"timings"')
        if isinstance(timings, dict):
            got = from_timings(timings)
            if got is not None:
                return got
    if b'"usage"' in data:
        usage = _value_at(data, b'"usage"')
        if isinstance(usage, dict):
            got = from_usage(usage)
            if got is not None:
                return got
    return UNKNOWN


class Tail:
    """A stream's last :data:`TAIL` bytes, fed each part of it as the gateway relays it
    (unframed: no chunk sizes), never more held; :meth:`figures` at its end."""

    __slots__ = ("parts", "size", "head")

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.size = 0
        self.head = b""

    def feed(self, data: bytes) -> None:
        if len(self.head) < HEAD:
            self.head += data[:HEAD - len(self.head)]
        self.parts.append(data)
        self.size += len(data)
        if self.size > 2 * TAIL:   # trimmed now and then: a join per ~64 KiB, not per part
            kept = b"".join(self.parts)[-TAIL:]
            self.parts, self.size = [kept], len(kept)

    def figures(self) -> Figures:
        """The figures of the last event that has them: looked for in the last parts
        first (where llama-server's last event is), in the whole tail if not there."""
        near, size = [], 0
        for part in reversed(self.parts):
            near.append(part)
            size += len(part)
            if size >= WINDOW:
                break
        got = figures_of(b"".join(reversed(near)))
        if not got.known and len(near) < len(self.parts):
            got = figures_of(b"".join(self.parts)[-TAIL:])
        at = self.head.find(b'"message_start"')
        if got.known and not got.prompt_tokens and at >= 0:
            end = self.head.find(b"\n\n", at)   # that event only: not a later usage
            start = figures_of(self.head[:end] if end >= 0 else self.head)
            if start.known:
                return Figures(start.prompt_tokens, start.cached_tokens,
                               got.generated_tokens, got.engine_ms, True)
        return got


TAIL_KEY: Any = web.RequestKey("lokid_tail", Tail) if hasattr(web, "RequestKey") \
    else "lokid_tail"


def tail_of(request: web.Request) -> Tail:
    """The tail a stream's relay feeds with the answer's bytes (unframed)."""
    tail = request.get(TAIL_KEY)
    if tail is None:
        tail = request[TAIL_KEY] = Tail()
    return tail
