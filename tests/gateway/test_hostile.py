"""Hostile clients against the real gateway (issue 28, items 3 and 6 to 13): the real
daemon on a private bus (its local runner), a real llama-server for preset alpha, and an
"external API" that is a real aiohttp server recording every request it is sent. Each
attack is run against the gateway with and without client keys."""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
import os
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.enginekit import write_config, write_preset
from support.gatewaykit import app_on_loopback, gateway_on

from lokid.gateway import body as gateway_body
from lokid.gateway import silence
from lokid.gateway.report import PRESET_KEY

pytestmark = [pytest.mark.engine, pytest.mark.slow]

SECRET = "sk-upstream-hostile-9e1"
CLIENT_KEY = "client-key-hostile"


@pytest.fixture
async def recorder() -> AsyncIterator[tuple[str, list[tuple[str, str, dict[str, str]]]]]:
    """Any path answered 200, and each request kept: (method, raw path, headers)."""
    from aiohttp import web

    seen: list[tuple[str, str, dict[str, str]]] = []

    async def anything(request: web.Request) -> web.Response:
        await request.read()
        seen.append((request.method, request.raw_path, dict(request.headers)))
        return web.json_response({"id": "r", "object": "chat.completion", "model": "up",
                                  "choices": []},
                                 headers={"Access-Control-Allow-Origin": "*"})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", anything)
    async with app_on_loopback(app) as url:
        yield url, seen


@pytest.fixture
def config(tmp_path: Path, engine: str, models: Any, ports: dict[str, int],
           recorder: tuple[str, list[Any]]) -> Path:
    assert Path(models.llama).name == "llama.gguf"   # written now
    config = write_config(tmp_path, engine, [models.dir])
    write_preset(config, "alpha", f'model = "llama.gguf"\nctx = 2048\nport = {ports["alpha"]}\n'
                 '[serve]\non_demand = true\n')
    key = tmp_path / "remote.key"
    key.write_text(SECRET + "\n")
    key.chmod(0o600)
    write_preset(config, "remote", f'kind = "external"\nurl = "{recorder[0]}/api/v1"\n'
                 f'upstream_model = "up"\napi_key_file = "{key}"\n')
    write_preset(config, "nomodel", 'model = "absent.gguf"\n')
    return config


async def raw(url: str, request: bytes) -> tuple[int, dict[str, str], bytes]:
    """One request as bytes (no client library normalises its path); the answer."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(request)
    await writer.drain()
    data = await asyncio.wait_for(reader.read(), 60)
    writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return int(lines[0].split()[1]), headers, body


def auth(keyed: bool) -> dict[str, str]:
    return {"Authorization": f"Bearer {CLIENT_KEY}"} if keyed else {}


@pytest.mark.parametrize("keyed", [False, True])
async def test_no_path_of_the_external_host_but_its_routes(
        running: Any, bus_address: str, recorder: tuple[str, list[Any]], keyed: bool) -> None:
    keys = frozenset({CLIENT_KEY}) if keyed else frozenset()
    async with gateway_on(bus_address, keys=keys) as gw:
        a = "".join(f"{k}: {v}\r\n" for k, v in auth(keyed).items())
        for path in ("/v1/../../admin/x", "/v1/%2e%2e/%2e%2e/admin/x", "/v1/..%2f..%2fadmin/x",
                     "/v1%2F..%2F..%2Fadmin/x", "/v1/chat/completions/../../../admin/x"):
            status, _, body = await raw(gw.url, (  # type: ignore[attr-defined]
                f"POST {path}?model=remote HTTP/1.1\r\nHost: localhost\r\n{a}Content-Length: 2\r\n"
                "Connection: close\r\n\r\n{}").encode())
            assert status == 404, (path, body)
        assert keyed_requests(recorder[1]) == []   # the key went nowhere
        async with httpx.AsyncClient(base_url=gw.url, headers=auth(keyed)) as c:  # type: ignore[attr-defined]
            r = await c.post("/v1/chat/completions", json={"model": "remote", "messages": []})
            assert r.status_code == 200 and r.json()["model"] == "remote"
            # the API's CORS answer does not reach the client
            assert "access-control-allow-origin" not in r.headers
            # an unpaired surrogate, escaped: relayed as it came, not a 500
            r = await c.post("/v1/chat/completions", content=b'{"model": "remote", "messages": '
                             b'[{"role": "user", "content": "\\ud800"}]}')
            assert r.status_code == 200, r.text
    sent = keyed_requests(recorder[1])
    assert [(m, p) for m, p, _ in sent] == [("POST", "/api/v1/chat/completions")] * 2
    assert all(h["Authorization"] == f"Bearer {SECRET}" for _, _, h in sent)


def keyed_requests(seen: list[tuple[str, str, dict[str, str]]]) -> list[Any]:
    """What the gateway sent with the preset's key (the daemon's reachability check,
    GET <url>/models, goes without one)."""
    return [r for r in seen if "Authorization" in r[2]]


@pytest.mark.parametrize("keyed", [False, True])
async def test_slots_and_the_operators_routes_are_not_offered(
        running: Any, bus_address: str, keyed: bool, tmp_path: Path) -> None:
    keys = frozenset({CLIENT_KEY}) if keyed else frozenset()
    async with gateway_on(bus_address, keys=keys) as gw, \
            httpx.AsyncClient(base_url=gw.url, headers=auth(keyed), timeout=60) as c:  # type: ignore[attr-defined]
        r = await c.post("/completion", json={"model": "alpha", "prompt": "Hi", "n_predict": 2})
        assert r.status_code == 200, r.text   # started, served
        for method, path in (("POST", "/slots/0?action=save&model=alpha"),
                             ("POST", "/slots/0?action=restore&model=alpha"),
                             ("POST", "/slots/0?action=erase&model=alpha"),
                             ("GET", "/slots?model=alpha"), ("GET", "/metrics?model=alpha"),
                             ("POST", "/lora-adapters?model=alpha"),
                             ("GET", "/v1/stream?model=alpha")):
            r = await c.request(method, path, json={"model": "alpha", "filename": "x.bin"})
            assert r.status_code == 404, (method, path, r.text)
        r = await c.post("/props?model=alpha", json={"model": "alpha"})
        assert r.status_code == 405
        r = await c.get("/props?model=alpha")
        assert r.status_code == 200 and "model_path" not in r.json() and "total_slots" in r.json()
        # a broken preset's reason, in words: no path of the server's
        for r in (await c.post("/v1/chat/completions", json={"model": "nomodel"}),
                  await c.get("/v1/models/nomodel")):
            assert "absent.gguf" in r.text and str(tmp_path) not in r.text, r.text
        assert "nomodel" not in [m["id"] for m in (await c.get("/v1/models")).json()["data"]]
        assert str(tmp_path) not in (await c.get("/v1/models")).text
        assert "127.0.0.1" not in (await c.get("/v1/models")).text   # no engine's address


@pytest.mark.parametrize("keyed", [False, True])
async def test_a_page_elsewhere_is_refused_before_anything_runs(
        running: Any, bus_address: str, keyed: bool) -> None:
    keys = frozenset({CLIENT_KEY}) if keyed else frozenset()
    page = "https://chat.example.org"
    async with gateway_on(bus_address, keys=keys, cors_origins=(page,)) as gw, \
            httpx.AsyncClient(base_url=gw.url, headers=auth(keyed), timeout=60) as c:  # type: ignore[attr-defined]
        evil = {"Origin": "http://evil.example", "Content-Type": "text/plain"}
        r = await c.post("/completion", content=b'{"model": "alpha", "prompt": "x"}',
                         headers=evil)
        assert r.status_code == 403 and "access-control-allow-origin" not in r.headers
        assert r.json()["error"]["code"] == "origin_not_allowed"
        assert gw.presets.presets["alpha"].state == "inactive"   # nothing was started
        r = await c.options("/v1/chat/completions", headers={
            "Origin": page, "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type"})
        assert r.status_code == 204 and r.headers["access-control-allow-origin"] == page
        assert "POST" in r.headers["access-control-allow-methods"]
        r = await c.post("/completion", json={"model": "alpha", "prompt": "Hi", "n_predict": 2},
                         headers={"Origin": page})
        assert r.status_code == 200
        # the gateway's answer alone: the engine's own (it reflects any origin) is not relayed
        assert r.headers.get_list("access-control-allow-origin") == [page]
    async with gateway_on(bus_address, keys=keys) as gw, \
            httpx.AsyncClient(base_url=gw.url, headers=auth(keyed), timeout=60) as c:  # type: ignore[attr-defined]
        r = await c.post("/completion", json={"model": "alpha", "prompt": "Hi", "n_predict": 2},
                         headers={"Origin": page})   # none allowed by default
        assert r.status_code == 403
        r = await c.post("/completion", json={"model": "alpha", "prompt": "Hi", "n_predict": 2})
        assert r.status_code == 200 and "access-control-allow-origin" not in r.headers


async def test_bodies_that_inflate_nest_or_trickle(running: Any, bus_address: str,
                                                   monkeypatch: pytest.MonkeyPatch,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(gateway_body, "GRACE", 1.0)
    async with gateway_on(bus_address) as gw, \
            httpx.AsyncClient(base_url=gw.url, timeout=60) as c:  # type: ignore[attr-defined]
        # 63 MiB of {} in ~64 KB of gzip: no parse, no 1.7 GB; refused by the walk's bound
        bomb = gzip.compress(b'{"m": [' + b"{}," * (21 * 1024 * 1024) + b'{}], "model": "alpha"}')
        assert len(bomb) < 200_000
        r = await c.post("/completion", content=bomb, headers={"Content-Encoding": "gzip"})
        assert r.status_code == 413, r.text
        # max_body bounds the inflated size
        async with gateway_on(bus_address, max_body=4096) as small, \
                httpx.AsyncClient(base_url=small.url, timeout=60) as c2:  # type: ignore[attr-defined]
            r = await c2.post("/completion", content=gzip.compress(b" " * 100_000 + b"{}"),
                              headers={"Content-Encoding": "gzip"})
            assert r.status_code == 413 and "inflated" in r.text
        # a valid gzip body works (the engine is sent it inflated, without the encoding)
        r = await c.post("/completion", headers={"Content-Encoding": "gzip"}, content=gzip.compress(
            json.dumps({"model": "alpha", "prompt": "Hi", "n_predict": 2}).encode()))
        assert r.status_code == 200, r.text
        r = await c.post("/completion", content=b"not gzip", headers={"Content-Encoding": "gzip"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_encoding"
        r = await c.post("/completion", content=b"{}", headers={"Content-Encoding": "zstd"})
        assert r.status_code == 415
        r = await c.post("/completion", content=b'{"model": "alpha", "x": ' + b"[" * 1000
                         + b"]" * 1000 + b"}")
        assert r.status_code == 400 and "nested" in r.text
        # a body trickled byte by byte: 408 once its grace is over, its connection closed
        status, headers, _ = await raw(gw.url, b"POST /completion HTTP/1.1\r\nHost: localhost\r\n"  # type: ignore[attr-defined]
                                       b"Content-Length: 100\r\n\r\n{")
        assert status == 408 and headers.get("connection") == "close"
    assert "Traceback" not in caplog.text


def engine_pid(port: int) -> int:
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if cmd and cmd[0].endswith(b"llama-server") and str(port).encode() in cmd:
                return int(pid)
    raise AssertionError(f"no llama-server on port {port}")


async def test_a_hung_engine_ends_its_stream_and_is_not_called_ready(
        running: Any, bus_address: str, ports: dict[str, int],
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(silence, "CHECK_AFTER", 1.0)
    monkeypatch.setattr(silence, "PROBE_TIMEOUT", 1.0)
    monkeypatch.setattr(silence, "RECHECK", 0.5)
    async with gateway_on(bus_address) as gw, \
            httpx.AsyncClient(base_url=gw.url, timeout=60) as c:  # type: ignore[attr-defined]
        r = await c.post("/completion", json={"model": "alpha", "prompt": "Hi", "n_predict": 1})
        assert r.status_code == 200
        pid = engine_pid(ports["alpha"])
        t0 = time.monotonic()
        events = []
        try:
            async with c.stream("POST", "/completion", json={
                    "model": "alpha", "prompt": "Once", "n_predict": 100000, "stream": True,
                    "ignore_eos": True}) as s:
                async for line in s.aiter_lines():
                    events.append(line)
                    if len(events) == 4:
                        os.kill(pid, signal.SIGSTOP)   # hung mid-stream
            assert any('"error"' in e and "does not answer /health" in e for e in events), \
                events[-3:]
            took = time.monotonic() - t0   # not asserted (no timing in tests): shown
            models = (await c.get("/v1/models")).json()["data"]
            assert [m["lokid"]["state"] for m in models if m["id"] == "alpha"] == ["unresponsive"]
            r = await c.post("/completion", json={"model": "alpha", "prompt": "x"})
            assert r.status_code == 503 and r.json()["error"]["code"] == "model_unresponsive"
        finally:
            os.kill(pid, signal.SIGCONT)
        await asyncio.sleep(0.6)
        r = await c.post("/completion", json={"model": "alpha", "prompt": "Hi", "n_predict": 1})
        assert r.status_code == 200, r.text   # it answers again: the mark is gone
        models = (await c.get("/v1/models")).json()["data"]
        assert [m["lokid"]["state"] for m in models if m["id"] == "alpha"] == ["ready"]
        logging.getLogger(__name__).info("the hung stream ended after %.1f s", took)


async def test_a_hung_engine_before_a_streams_head_is_a_504_and_not_called_ready(
        running: Any, bus_address: str, ports: dict[str, int],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The tunnel's wait for an answer's head (silence.HeadWatch, issue 47: a timer, not
    a task around the wait) keeps within()'s rule: an engine silent past CHECK_AFTER
    whose /health does not answer ends the request 504 and is shown unresponsive."""
    monkeypatch.setattr(silence, "CHECK_AFTER", 1.0)
    monkeypatch.setattr(silence, "PROBE_TIMEOUT", 1.0)
    monkeypatch.setattr(silence, "RECHECK", 0.5)
    async with gateway_on(bus_address) as gw, \
            httpx.AsyncClient(base_url=gw.url, timeout=60) as c:  # type: ignore[attr-defined]
        r = await c.post("/completion", json={"model": "alpha", "prompt": "Hi", "n_predict": 1})
        assert r.status_code == 200
        pid = engine_pid(ports["alpha"])
        os.kill(pid, signal.SIGSTOP)   # its kernel still takes the connection and the bytes
        try:
            r = await c.post("/completion", json={"model": "alpha", "prompt": "Once",
                                                  "n_predict": 8, "stream": True})
            assert r.status_code == 504, r.text
            assert r.json()["error"]["code"] == "upstream_timeout"
            assert "does not answer /health" in r.json()["error"]["message"]
            models = (await c.get("/v1/models")).json()["data"]
            assert [m["lokid"]["state"] for m in models if m["id"] == "alpha"] == \
                ["unresponsive"]
        finally:
            os.kill(pid, signal.SIGCONT)
        await asyncio.sleep(0.6)
        r = await c.post("/completion", json={"model": "alpha", "prompt": "Hi", "n_predict": 1,
                                              "stream": True})
        assert r.status_code == 200, r.text   # it streams again: the mark is gone
        assert b"data: " in r.content


async def test_a_client_gone_mid_stream_is_a_499_not_a_traceback(
        running: Any, bus_address: str, caplog: pytest.LogCaptureFixture) -> None:
    async with gateway_on(bus_address) as gw, \
            httpx.AsyncClient(base_url=gw.url, timeout=60) as c:  # type: ignore[attr-defined]
        counted: list[tuple[str, int]] = []
        count = gw.report.count

        def counting(request: Any, status: int) -> None:   # what is sent to the daemon
            counted.append((request.get(PRESET_KEY), status))
            count(request, status)

        gw.report.count = counting  # type: ignore[method-assign]
        for _ in range(3):
            async with c.stream("POST", "/completion", json={
                    "model": "alpha", "prompt": "Once", "n_predict": 100000, "stream": True,
                    "ignore_eos": True}) as s:
                async for _line in s.aiter_lines():
                    break   # gone
        deadline = time.monotonic() + 10
        while counted.count(("alpha", 499)) < 3:
            assert time.monotonic() < deadline, counted
            await asyncio.sleep(0.05)
        assert ("alpha", 500) not in counted
    assert "Traceback" not in caplog.text and "Error handling request" not in caplog.text
