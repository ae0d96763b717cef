"""What a client of the gateway may reach: an allowlist of routes, matched on the raw path.

The gateway used to relay every path to an engine, and the client's path (decoded) to an
external API after a prefix check. Both gave clients what is the operator's (issue 28):

- ``/v1/../../admin/x`` (and its ``%2e%2e``, ``%2F``, ``..%2f`` forms) passed the check
  for ``/v1/`` on the decoded path, then the HTTP client resolved the dot segments and
  sent the external preset's key to ``/admin/x`` of its host. So a path is matched
  **whole and undecoded** against fixed routes (:data:`ENGINE_ROUTES`,
  :data:`EXTERNAL_ROUTES`), and the request goes to the route's own constant: no byte
  of the client's path ever reaches the URL of another host. A path with an escape, a
  dot segment, an empty segment or a trailing slash is no route;
- ``POST /slots/N?action=save|restore|erase`` let a client write files in the engine's
  slot directory, overwrite the gateway's swap cache, erase other users' slots and
  recover another user's prompt; ``GET /slots`` shows every slot's prompt and reply
  text (llama.cpp's ``get_slots``). Slots are the gateway's own business
  (:mod:`lokid.gateway.slots`): no client route reaches them;
- ``POST /props`` changes the engine's settings for every user, ``/lora-adapters``
  changes (or shows the paths of) its adapters, ``/metrics`` is the operator's,
  ``/v1/stream`` and ``/v1/streams/lookup`` re-attach to a conversation's stream by its
  id: none is an inference route, none is offered;
- ``GET /props`` is offered (clients read the context size, the chat template and the
  modalities from it) without ``model_path``, a server path (:func:`public_props`).

Every route of the engine, and why each one not offered is not:
:data:`lokid.gateway.routetable.ENGINE_TABLE` (docs/gateway.md's table).

What is offered: llama.cpp's inference routes (OpenAI's, Anthropic's, its own
completion, infill, embedding, rerank, tokenizer and template routes) to a local engine,
and OpenAI's ``/v1`` inference routes to an external API. Anything else is 404, a known
route asked with another method 405, both in OpenAI's error shape.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .replies import GatewayError

# OpenAI's inference routes (and Anthropic's, which llama.cpp and most servers of the
# kind serve beside them): what an external API is asked.
OPENAI_POST = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses",
               "/v1/messages", "/v1/messages/count_tokens", "/v1/rerank")

# llama.cpp b11434's inference routes (tools/server/server.cpp), each by its method.
ENGINE_POST = OPENAI_POST + (
    "/completion", "/completions", "/chat/completions", "/responses", "/infill",
    "/embedding", "/embeddings", "/rerank", "/reranking", "/v1/reranking",
    "/tokenize", "/detokenize", "/apply-template",
    "/chat/completions/input_tokens", "/v1/chat/completions/input_tokens",
    "/responses/input_tokens", "/v1/responses/input_tokens",
    # issue 48: a reasoning's end asked of a running completion, a decision model's
    # answer, and a transcription (a multipart form: lokid.gateway.formscan)
    "/v1/chat/completions/control", "/v1/systemone",
    "/v1/audio/transcriptions", "/audio/transcriptions")

ENGINE_ROUTES: Mapping[str, frozenset[str]] = {
    **{path: frozenset({"POST"}) for path in ENGINE_POST},
    "/props": frozenset({"GET", "HEAD"}),   # HEAD: the GET's head (issue 48)
}
# Routes that ask a running engine about its work: they start and swap nothing (503 when
# it is not running), as a GET (lokid.gateway.ondemand.check_safe): a control for a
# completion no stopped engine runs would start it, or swap its GPU group, for nothing
NO_START = frozenset({"/v1/chat/completions/control"})
EXTERNAL_ROUTES: Mapping[str, frozenset[str]] = {path: frozenset({"POST"})
                                                 for path in OPENAI_POST}
# What the external API's url ends with: the routes above are under it.
OPENAI_PREFIX = "/v1"
# Fields of GET /props that are the server's, not a client's.
PRIVATE_PROPS = ("model_path",)


def route(method: str, raw_path: str, routes: Mapping[str, frozenset[str]]) -> str:
    """The route ``raw_path`` (the request target's path, undecoded, without its query)
    names in ``routes``; GatewayError 404 for none, 405 for another method."""
    methods = routes.get(raw_path)
    if methods is None:
        shown = raw_path if len(raw_path) <= 64 else raw_path[:64] + "..."
        raise GatewayError(404, f"the gateway offers no route {shown!r}: it serves the "
                           "OpenAI, Anthropic and llama.cpp inference routes (such as "
                           "/v1/chat/completions) and /v1/models", code="route_not_supported")
    if method not in methods:
        raise GatewayError(405, f"{raw_path} takes {', '.join(sorted(methods))}, not "
                           f"{method[:16]}", code="method_not_allowed")
    return raw_path


def external_path(path: str) -> str:
    """What follows the external API's url for ``path`` (a route of
    :data:`EXTERNAL_ROUTES`): its part after ``/v1``."""
    assert path.startswith(OPENAI_PREFIX + "/"), path
    return path[len(OPENAI_PREFIX):]


def public_props(props: Any) -> Any:
    """GET /props's answer without the fields that are the server's."""
    if isinstance(props, dict):
        return {k: v for k, v in props.items() if k not in PRIVATE_PROPS}
    return props
