"""Every route llama-server b11434 registers, and what the gateway does with it (issue 48).

Clients nobody here wrote found routes the engine answers and the gateway did not
(``HEAD /health``, ``GET /v1/health``, ``/v1/chat/completions/control``,
``/v1/audio/transcriptions``: 404). So the engine's list is kept here route by route,
each with how the gateway offers it or why it does not, and docs/gateway.md's table is this
one (tests/gateway/test_route_table.py reads both, and the engine build's own routes:
a route the engine gains that this table does not name fails it).

Taken from the engine's source (tools/server/server.cpp and server-http.cpp of
b11434: its ``ctx_http.get/post/del`` and ``srv->Get`` calls). cpp-httplib answers
``HEAD`` on every ``GET`` route with the ``GET``'s status and headers, and ``OPTIONS``
(a CORS preflight) on any path; the gateway answers both itself.

Pure data: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import formscan
from .routes import ENGINE_ROUTES


@dataclass(frozen=True)
class EngineRoute:
    """One route of the engine: its methods, its path, and the gateway's answer to it:
    ``offered`` says how it routes (an empty one: not offered), ``why`` why not."""

    methods: str
    path: str
    offered: str = ""
    why: str = ""


BY_BODY = "to the engine of the body's `model`"
BY_FORM = "to the engine of the form's `model` field (multipart)"
GATEWAY = "answered by the gateway itself"
OPERATOR = "the operator's: reach it on the engine's own address"

ENGINE_TABLE: tuple[EngineRoute, ...] = (
    EngineRoute("GET HEAD", "/health", GATEWAY + " (no key needed), as a load balancer asks"),
    EngineRoute("GET HEAD", "/v1/health", GATEWAY + ", as `/health`"),
    EngineRoute("GET HEAD", "/v1/models", GATEWAY + ": every preset (and alias)"),
    EngineRoute("GET HEAD", "/models", GATEWAY + ", as `/v1/models`"),
    EngineRoute("GET HEAD", "/props", "to the engine of `?model=`, without `model_path`; "
                "starts nothing"),
    EngineRoute("POST", "/props", why="changes the engine's settings for every user"),
    EngineRoute("GET", "/metrics", why=OPERATOR + " (lokid writes its own figures for "
                "node_exporter)"),
    *(EngineRoute("POST", p, BY_BODY) for p in (
        "/completion", "/completions", "/v1/completions", "/chat/completions",
        "/v1/chat/completions", "/v1/responses", "/responses", "/v1/messages", "/infill",
        "/embedding", "/embeddings", "/v1/embeddings", "/rerank", "/reranking",
        "/v1/rerank", "/v1/reranking", "/v1/systemone", "/tokenize", "/detokenize",
        "/apply-template", "/chat/completions/input_tokens",
        "/v1/chat/completions/input_tokens", "/responses/input_tokens",
        "/v1/responses/input_tokens", "/v1/messages/count_tokens")),
    EngineRoute("POST", "/v1/chat/completions/control", BY_BODY + " (as llama.cpp's "
                "router does): a preset with several replicas may send it to one that is "
                "not running the completion, which answers `no active completion`"),
    EngineRoute("POST", "/v1/audio/transcriptions", BY_FORM),
    EngineRoute("POST", "/audio/transcriptions", BY_FORM),
    EngineRoute("GET POST", "/lora-adapters", why="changes (or shows the paths of) the "
                "engine's adapters for every user"),
    EngineRoute("GET", "/slots", why="shows every slot's prompt and reply text"),
    EngineRoute("POST", "/slots/:id_slot", why="saves, restores and erases slots: the "
                "gateway's own, for swaps"),
    EngineRoute("GET DELETE", "/v1/stream", why="re-attaches to (or ends) a conversation's "
                "stream by its id, whoever started it"),
    EngineRoute("POST", "/v1/streams/lookup", why="finds a conversation's stream by its id, "
                "whoever started it"),
    EngineRoute("GET POST", "/cors-proxy", why="the web UI's proxy to any URL (403 unless "
                "`--ui-mcp-proxy`)"),
    EngineRoute("GET POST", "/tools", why="runs the server's tools (403 unless "
                "`--tools`/MCP servers are set)"),
    EngineRoute("POST", "/predict", why="Vertex AI's route, registered only with "
                "`AIP_MODE=PREDICTION` in the engine's environment (lokid sets none)"),
    EngineRoute("POST DELETE", "/models", why="router mode only (`llama-server` without a "
                "model): lokid is the router, its presets are the models"),
    EngineRoute("POST", "/models/load", why="router mode only: a request starts a preset "
                "on demand"),
    EngineRoute("POST", "/models/unload", why="router mode only: `lokictl unload`"),
    EngineRoute("GET", "/models/sse", why="router mode only: lokid's D-Bus signals"),
    EngineRoute("GET", "/", why="the engine's web UI: a page of its own that "
                "talks to that one engine, not to the gateway"),
    EngineRoute("GET", "/index.html", why="the web UI"),
    EngineRoute("GET", "/sw.js", why="the web UI's service worker"),
)

# Where the gateway answers a method itself, before any engine: health and the models.
HEALTH_PATHS = ("/health", "/v1/health")
LISTING_METHODS = frozenset({"GET", "HEAD"})


def offered_by_engine_routes() -> dict[str, frozenset[str]]:
    """The table's offered engine routes (those relayed to an engine by
    :mod:`lokid.gateway.routes`), with their methods."""
    return {r.path: frozenset(r.methods.split()) for r in ENGINE_TABLE
            if r.offered and not r.offered.startswith(GATEWAY)}


def check() -> list[str]:
    """What disagrees between this table and :data:`ENGINE_ROUTES` (and the form
    routes): empty when they agree."""
    table = offered_by_engine_routes()
    wrong = [f"{p}: the table offers {sorted(m)}, the gateway {sorted(ENGINE_ROUTES.get(p, ()))}"
             for p, m in table.items() if ENGINE_ROUTES.get(p) != m]
    wrong += [f"{p}: the gateway offers it, the table does not" for p in ENGINE_ROUTES
              if p not in table]
    wrong += [f"{p}: a form route not in the table" for p in formscan.FORM_ROUTES
              if p not in table]
    return wrong


def markdown() -> str:
    """The table as docs/gateway.md shows it (the test compares the two)."""
    rows = ["| Route | Methods | The gateway |", "|---|---|---|"]
    for r in ENGINE_TABLE:
        answer = f"offered: {r.offered}" if r.offered else f"not offered: {r.why}"
        rows.append(f"| `{r.path}` | {r.methods} | {answer} |")
    return "\n".join(rows) + "\n"
