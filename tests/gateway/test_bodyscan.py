"""The body walk (lokid.gateway.bodyscan) and the routes allowlist (lokid.gateway.routes):
pure rules, table-tested (issue 28, items 6, 7, 9 and 11)."""

from __future__ import annotations

import json

import pytest

from lokid.gateway.bodyscan import MAX_DEPTH, BodyError, scan_body, with_model
from lokid.gateway.replies import GatewayError, public
from lokid.gateway.routes import ENGINE_ROUTES, EXTERNAL_ROUTES, public_props, route


@pytest.mark.parametrize("body, model", [
    (b'{"model": "alpha", "messages": []}', "alpha"),
    (b'{"messages": [{"role": "user", "content": "\\"model\\": \\"beta\\""}], "model":"alpha"}',
     "alpha"),                                              # a "model" inside a string
    (b'{"nested": {"model": "beta"}, "model": "alpha"}', "alpha"),   # not top level
    (b'{"nested": {"model": "beta"}}', None),
    (b' \n{"mod\\u0065l": "alpha"}', "alpha"),   # an escaped key, as the engine reads it
    (b'{"model": "a", "model": "b"}', "b"),                  # json.loads: the last one
    (b'{"model": "\\u00e9t\\u00e9"}', "\u00e9t\u00e9"),
    (b'{"x": "[[[{{{", "model": "alpha"}', "alpha"),         # brackets in a string
])
def test_the_top_level_model_is_found(body: bytes, model: str | None) -> None:
    assert scan_body(body).model == model
    assert json.loads(body).get("model") == model   # what a parser reads, too


@pytest.mark.parametrize("body, status, words", [
    (b'["alpha"]', 400, "JSON object"),
    (b'{"model": "alpha", "messages": [', 400, "ends inside"),
    (b'{"model": "alpha", "messages": [}', 400, "closes a ["),
    (b'{"model": "alpha"} trailing', 400, "follows"),
    (b'{"model": "alp', 400, "does not end"),
    (b'{"a": ' + b"[" * (MAX_DEPTH + 5) + b"]" * (MAX_DEPTH + 5) + b"}", 400, "nested"),
    (b'{"a": ' + b"[" * 1000 + b"]" * 1000 + b"}", 400, "nested"),  # RecursionError before
    (b'{"m": [' + b"{}," * 300_000 + b'{}], "model": "a"}', 413, "too many"),
])
def test_bodies_that_cannot_be_routed_are_refused(body: bytes, status: int, words: str) -> None:
    with pytest.raises(BodyError) as e:
        scan_body(body)
    assert e.value.status == status and words in str(e.value)


def test_a_non_string_model_is_named() -> None:
    assert scan_body(b'{"model": {"x": 1}}').model_kind == "not a string"


def test_the_upstream_model_replaces_each_top_level_one_in_the_bytes() -> None:
    body = b'{"model":"r","messages":[{"content":"\\ud800 lone"}],"model" : "r2"}'
    out = with_model(body, scan_body(body), "up/model")
    # only the model changed: the client's unpaired surrogate is relayed as it came
    assert out == (b'{"model":"up/model","messages":[{"content":"\\ud800 lone"}],'
                   b'"model" : "up/model"}')
    assert json.loads(out)["model"] == "up/model"
    body = b'{"mod\\u0065l": "r", "messages": []}'
    assert json.loads(with_model(body, scan_body(body), "up"))["model"] == "up"
    for body in (b'{"messages": []}', b"{}", b"{ }"):   # none: one added first
        assert json.loads(with_model(body, scan_body(body), "up"))["model"] == "up"


@pytest.mark.parametrize("path", [
    "/v1/../../admin/x", "/v1/%2e%2e/%2e%2e/admin/x", "/v1/..%2f..%2fadmin",
    "/v1%2Fchat/completions",
    "/v1/chat/completions/", "//v1/chat/completions", "/v1/./chat/completions",
    "/v1/chat%2Fcompletions", "/v1/models/../../x",
])
def test_no_path_but_a_route_reaches_an_external_api(path: str) -> None:
    with pytest.raises(GatewayError) as e:
        route("POST", path, EXTERNAL_ROUTES)
    assert e.value.status == 404


def test_what_a_client_may_reach() -> None:
    assert route("POST", "/v1/chat/completions", EXTERNAL_ROUTES) == "/v1/chat/completions"
    assert route("POST", "/completion", ENGINE_ROUTES) == "/completion"
    assert route("GET", "/props", ENGINE_ROUTES) == "/props"
    for method, path in (("POST", "/slots/0"), ("GET", "/slots"), ("GET", "/metrics"),
                         ("POST", "/lora-adapters"), ("GET", "/v1/stream"),
                         ("POST", "/v1/streams/lookup"), ("POST", "/completion/../slots/0")):
        with pytest.raises(GatewayError) as e:
            route(method, path, ENGINE_ROUTES)
        assert e.value.status == 404, path
    with pytest.raises(GatewayError) as e:
        route("POST", "/props", ENGINE_ROUTES)   # changes the engine for every user
    assert e.value.status == 405
    assert "/completion" not in EXTERNAL_ROUTES
    assert public_props({"model_path": "/srv/m.gguf", "total_slots": 4}) == {"total_slots": 4}


def test_clients_read_reasons_without_server_paths_or_addresses() -> None:
    text = ("/etc/loki/presets/x.toml:2: model: 'absent.gguf' not found in model_dirs "
            "(/srv/models, /var/lib/loki/models); ready at http://127.0.0.1:8101")
    shown = public(text)
    assert "/etc/loki" not in shown and "/srv" not in shown and "127.0.0.1" not in shown
    assert "x.toml:2" in shown and "absent.gguf" in shown
    assert public("offloaded 3/4 layers to GPU") == "offloaded 3/4 layers to GPU"
