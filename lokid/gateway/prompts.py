"""How long a request's body may be for a preset: its prompt bounded by its context
(issue 45, item 8).

A 64 KiB gzip body inflated to a 64 MiB prompt (under ``max_body``), and a tiny model's
engine spent over 7 minutes of CPU tokenizing it before it could say that the prompt
does not fit its context. A prompt the context cannot hold is known by its size before
any token is made. Rules, each for the failure it prevents:

- a body sent to a preset's engine is at most ``ctx`` × :data:`BYTES_PER_TOKEN` +
  :data:`OVERHEAD` bytes, inflated, ``ctx`` the context its engine runs with (the last
  ``-c``/``--ctx-size`` of its command line: the running engine's, else the next
  start's). A token of text is 3 to 5 bytes of JSON (a CJK character sent as a
  ``\\uXXXX`` escape, 6 bytes, is about one token), a run of spaces or dashes a few
  dozen: 64 bytes a token on average is beyond any prompt that fits; the overhead is the
  request's own fields (sampling settings, a tool's schema is counted in the tokens).
  A longer body is refused 413 naming the bound, before the engine is started or sent
  anything (:meth:`lokid.gateway.server.Gateway._route`);
- no bound but ``max_body`` where the size says nothing of the tokens: a preset with a
  projector (``--mmproj``, ``-hf`` which may fetch one: images and audio travel in
  base64), a context not fixed (``-c 0``: the model's own, unknown here), an external
  API (its own business), and the routes whose body holds many inputs or none that
  fills a context (:data:`BULK_ROUTES`: a batch of embeddings, documents to rerank,
  text to tokenize, an audio file to transcribe, issue 48);
- the gateway reads no more of a body than the largest bound of the presets it may go
  to (:func:`read_limit`): a 64 MiB bomb for a gateway whose presets take 2 MiB costs
  2 MiB of its memory, not 64.

Pure: no I/O, no aiohttp.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence

from ..core.launch.flags import flag_value, has_flag

BYTES_PER_TOKEN = 64
OVERHEAD = 64 * 1024
BULK_ROUTES = frozenset({"/v1/embeddings", "/embedding", "/embeddings", "/rerank",
                         "/reranking", "/v1/rerank", "/v1/reranking", "/tokenize",
                         "/detokenize", "/v1/audio/transcriptions",
                         "/audio/transcriptions"})
CTX = ("-c", "--ctx-size")
PROJECTOR = ("-mm", "--mmproj", "-mmu", "--mmproj-url", "-hf", "-hfr", "--hf-repo")
NO_PROJECTOR = ("--no-mmproj",)


def context_of(argv: Sequence[str]) -> int:
    """The context an engine started with ``argv`` has, in tokens; 0 when not fixed."""
    value = flag_value(list(argv[1:]), *CTX)
    try:
        return max(0, int(value)) if value is not None else 0
    except ValueError:
        return 0


def bound(argv: Sequence[str]) -> int | None:
    """The most bytes a body for the engine of ``argv`` may have; None: ``max_body``'s.
    Found once per command line (the flags' walk took 15-35 us, and a request asked it
    for each preset it may go to, then for its own: issue 47)."""
    return _bound(tuple(argv))


@functools.lru_cache(maxsize=1024)
def _bound(argv: tuple[str, ...]) -> int | None:
    args = list(argv[1:])
    if not argv or (has_flag(args, *PROJECTOR) and not has_flag(args, *NO_PROJECTOR)):
        return None
    ctx = context_of(argv)
    return ctx * BYTES_PER_TOKEN + OVERHEAD if ctx > 0 else None


def too_long(name: str, size: int, argv: Sequence[str]) -> str:
    """What a client reads of a body over the bound of preset ``name``."""
    return (f"the request body is {size} bytes: over the {bound(argv)} bytes preset "
            f"{name!r} takes (its context of {context_of(argv)} tokens at "
            f"{BYTES_PER_TOKEN} bytes a token, and {OVERHEAD // 1024} KiB): a prompt that "
            "long cannot fit its context")


def read_limit(max_body: int, route: str, bounds: Iterable[int | None]) -> int:
    """How much of a body on ``route`` is read: ``max_body``, or less when every preset
    it may go to (``bounds``: theirs, None for one bounded by ``max_body`` only) takes
    less."""
    if route in BULK_ROUTES:
        return max_body
    largest = 0
    for b in bounds:
        if b is None:
            return max_body
        largest = max(largest, b)
    return min(max_body, largest) if largest else max_body
