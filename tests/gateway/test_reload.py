"""``lokid gateway`` reloaded by SIGHUP (``systemctl reload loki-gateway``) while it relays a
stream (issue 48, item 5): the real process, the real daemon (local runner) and the real
engine on a private bus.

Before, a changed ``listen``, ``cors_origins`` or ``peers`` needed a restart, which cut a
long stream at the stop's drain (30 s); SIGHUP, with no handler, killed the gateway. Now
lokid.toml's [gateway] is read again and put in force: the stream (on an address the
reload removes) runs to its end, the new address answers and the removed one refuses new
connections, its idle keep-alive connection is closed; the new origin is allowed and the
old refused; a peer removed is said; a broken lokid.toml changes nothing, said in one
line. The engine serves a model slow enough (3 layers, 384 wide, one thread) that the
stream is still going when the reloads are done.
"""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.enginekit import free_port, write_config, write_preset
from support.gatewaykit import health_answered
from support.models import write_slow_llama
from support.sse import data_lines

pytestmark = [pytest.mark.engine, pytest.mark.slow]

SLOW = 'model = "slow.gguf"\nctx = 4096\nextra_args = ["-t", "1"]\n'
TOKENS = 3000


@pytest.fixture
def config(tmp_path: Path, engine: str) -> Path:
    models = tmp_path / "models"
    models.mkdir()
    write_slow_llama(models / "slow.gguf")
    config = write_config(tmp_path, engine, [models])
    write_preset(config, "slow", f"{SLOW}port = {free_port()}\n[serve]\non_demand = true\n")
    return config


def gateway_table(listen: list[int], origin: str, peers: dict[str, int]) -> str:
    """lokid.toml's [gateway]: loopback ``listen`` ports, one allowed origin, ``peers``
    (name -> a loopback port where nothing listens: each is read, found down, read again)."""
    addresses = ", ".join(f'"127.0.0.1:{p}"' for p in listen)
    listed = ", ".join(f'{{ name = "{n}", url = "http://127.0.0.1:{p}" }}'
                       for n, p in peers.items())
    return (f"\n[gateway]\nlisten = [{addresses}]\ncors_origins = [\"{origin}\"]\n"
            f"peers = [{listed}]\n")


@asynccontextmanager
async def gateway_process(config: Path, bus_address: str, port: int, lines: list[str]
                          ) -> AsyncIterator[asyncio.subprocess.Process]:
    """The gateway from lokid.toml alone (no --listen: its [gateway] listen), its log
    lines gathered in ``lines`` as they come."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "lokid", "--config-dir", str(config), "gateway", "--bus",
        "session", "--bus-address", bus_address,
        stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)

    async def gather() -> None:
        assert proc.stderr is not None
        async for line in proc.stderr:
            lines.append(line.decode())

    reader = asyncio.create_task(gather())
    try:
        await health_answered(port, proc, lines)
        yield proc
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await reader


async def stream(port: int, started: asyncio.Event, events: list[dict[str, Any]]) -> None:
    body = {"model": "slow", "prompt": "Once", "n_predict": TOKENS, "ignore_eos": True,
            "stream": True, "temperature": 1.0}
    async with httpx.AsyncClient(timeout=300) as c:
        async with c.stream("POST", f"http://127.0.0.1:{port}/completion", json=body) as r:
            assert r.status_code == 200, await r.aread()
            async for data in data_lines(r):
                events.append(json.loads(data))
                if len(events) == 5:
                    started.set()


async def said(lines: list[str], text: str, count: int = 1) -> None:
    """Until ``text`` is in ``count`` of the gateway's log lines (30 s at most)."""
    deadline = time.monotonic() + 30
    while sum(text in line for line in lines) < count:
        assert time.monotonic() < deadline, f"no {text!r} in {lines}"
        await asyncio.sleep(0.05)


async def origin_status(port: int, origin: str) -> tuple[int, str | None]:
    async with httpx.AsyncClient(timeout=10) as c:
        r = await c.get(f"http://127.0.0.1:{port}/v1/models", headers={"Origin": origin})
        return r.status_code, r.headers.get("Access-Control-Allow-Origin")


async def test_a_reload_puts_the_new_settings_in_force_and_the_stream_ends_whole(
        running: Any, bus_address: str, config: Path) -> None:
    kept, removed, added = free_port(), free_port(), free_port()
    base = (config / "lokid.toml").read_text()
    peers = {"gone": free_port(), "stays": free_port()}
    (config / "lokid.toml").write_text(base + gateway_table(
        [kept, removed], "http://old.example", peers))
    lines: list[str] = []
    async with gateway_process(config, bus_address, kept, lines) as proc:
        assert await origin_status(kept, "http://old.example") == (200, "http://old.example")
        # an idle keep-alive connection on the address the reload removes
        idle = socket.create_connection(("127.0.0.1", removed), timeout=30)
        idle.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = b""
        while not answer.endswith(b"}"):   # its head and body, in one read or two
            answer += idle.recv(4096)
        assert answer.startswith(b"HTTP/1.1 200"), answer
        # the stream goes through that address too
        events: list[dict[str, Any]] = []
        started = asyncio.Event()
        task = asyncio.create_task(stream(removed, started, events))
        await asyncio.wait_for(started.wait(), 120)

        # a listen address added and one removed, another origin, a peer removed (the
        # one that stays is listed the same: it keeps its state)
        (config / "lokid.toml").write_text(base + gateway_table(
            [kept, added], "http://new.example", {"stays": peers["stays"]}))
        proc.send_signal(signal.SIGHUP)
        await said(lines, "reloaded:")
        in_flight_then = len(events)

        # the new address answers, the removed one refuses, its idle connection closed
        async with httpx.AsyncClient(timeout=10) as c:
            assert (await c.get(f"http://127.0.0.1:{added}/health")).status_code == 200
            with pytest.raises(httpx.ConnectError):
                await c.get(f"http://127.0.0.1:{removed}/health")
        idle.settimeout(20)
        assert await asyncio.to_thread(idle.recv, 4096) == b""
        idle.close()
        # the new origin allowed, the old one refused
        assert await origin_status(kept, "http://new.example") == (200, "http://new.example")
        assert (await origin_status(added, "http://old.example"))[0] == 403

        # a broken lokid.toml: nothing changes, one line says why
        (config / "lokid.toml").write_text(base + "\n[gateway\nlisten = 3\n")
        proc.send_signal(signal.SIGHUP)
        await said(lines, "reload refused")
        async with httpx.AsyncClient(timeout=10) as c:
            assert (await c.get(f"http://127.0.0.1:{added}/health")).status_code == 200
        assert await origin_status(kept, "http://new.example") == (200, "http://new.example")
        (config / "lokid.toml").write_text(base)   # the daemon's file valid again

        await asyncio.wait_for(task, 180)
        proc.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(proc.wait(), 60)
    log = "".join(lines)
    # the whole stream, not a cut: every token and the engine's last event
    assert events[-1].get("stop") is True and events[-1]["tokens_predicted"] == TOKENS, \
        events[-1]
    assert in_flight_then < len(events), (in_flight_then, len(events))
    assert not any("error" in e for e in events)
    assert code == 0, log
    reloaded = next(line for line in lines if "reloaded:" in line)
    for part in ("cors_origins", "peers (-gone)", f"+127.0.0.1:{added}",
                 f"-127.0.0.1:{removed}"):
        assert part in reloaded, reloaded
    refused = [line for line in lines if "reload refused" in line]
    assert len(refused) == 1 and "lokid.toml" in refused[0], refused
    assert "Traceback" not in log, log


async def models_status(port: int, key: str | None = None) -> int:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with httpx.AsyncClient(timeout=10) as c:
        return (await c.get(f"http://127.0.0.1:{port}/v1/models", headers=headers)).status_code


async def test_a_reload_reads_the_keys_again_and_holds_wide_addresses_to_them(
        running: Any, bus_address: str, config: Path, tmp_path: Path) -> None:
    local, wide = free_port(), free_port()
    base = (config / "lokid.toml").read_text()
    keys = tmp_path / "gateway-keys"

    def table(*listen: str, keyed: bool = False) -> str:
        addresses = ", ".join(f'"{a}"' for a in listen)
        return base + f"\n[gateway]\nlisten = [{addresses}]\n" + (
            f'api_keys_file = "{keys}"\n' if keyed else "")

    (config / "lokid.toml").write_text(table(f"127.0.0.1:{local}"))
    lines: list[str] = []
    async with gateway_process(config, bus_address, local, lines) as proc:
        # beyond loopback without keys: refused as at a start, nothing changes
        (config / "lokid.toml").write_text(table(f"127.0.0.1:{local}", f"0.0.0.0:{wide}"))
        proc.send_signal(signal.SIGHUP)
        await said(lines, "reload refused")
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", wide), timeout=10).close()
        assert await models_status(local) == 200
        # with a keys file: the wide address listens, and every request needs a key
        keys.write_text("first\n")
        (config / "lokid.toml").write_text(table(f"127.0.0.1:{local}", f"0.0.0.0:{wide}",
                                                 keyed=True))
        proc.send_signal(signal.SIGHUP)
        await said(lines, "reloaded:")
        assert await models_status(local) == 401
        assert await models_status(wide, "first") == 200
        # the key rotated in the file: in force at the next reload
        keys.write_text("second\n")
        proc.send_signal(signal.SIGHUP)
        await said(lines, "reloaded:", 2)
        assert await models_status(local, "first") == 401
        assert await models_status(local, "second") == 200
        # the file emptied by mistake: refused, the keys in force stay
        keys.write_text("# none\n")
        proc.send_signal(signal.SIGHUP)
        await said(lines, "reload refused", 2)
        assert await models_status(wide, "second") == 200
        assert await models_status(wide) == 401
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 60) == 0
    refused = [line for line in lines if "reload refused" in line]
    assert "beyond loopback" in refused[0] and "holds no key" in refused[1], refused
    assert "keys" in [line for line in lines if "reloaded:" in line][1], lines
    assert "Traceback" not in "".join(lines)
