"""A request a peer gateway read is never sent to a second replica (issue 45, item 4):
two stand-in peers (:mod:`support.hugeanswer`, a process of its own) list the same
model ready; the first, asked first, reads the whole request and closes a second later
without a word. The client is answered 502 naming that peer, and the second peer gets
nothing: it would have generated the answer twice (the README's "nothing is generated
twice"). Before the change, the closed connection was taken for one that never reached
the peer, and the second replica answered 200."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.enginekit import free_port, write_config
from support.gatewaykit import gateway_on, until

from lokid.core.fleet.peers import Peer
from lokid.core.serve.affinity import Affinity, Replica
from lokid.core.serve.prefixes import chain
from lokid.gateway.server import Gateway

pytestmark = [pytest.mark.slow]

STANDIN = Path(__file__).parent.parent / "support" / "hugeanswer.py"
MESSAGES = [{"role": "user", "content": "Hello"}]


def names() -> dict[str, str]:
    """The peers' names, mode → name, such that the closing one is asked first: two
    idle replicas of a prompt never seen are chosen by a hash of the prompt over their
    names (lokid.core.serve.affinity, issue 47), no longer the first listed."""
    for i in range(100):
        close, ok = f"close{i}", f"ok{i}"
        first = Affinity().choose(chain("shared", {"model": "shared", "messages": MESSAGES}),
                                  [Replica(close), Replica(ok)])
        if first.name == close:
            return {"close": close, "ok": ok}
    raise AssertionError("no pair of names puts the closing peer first")


NAMES = names()


@pytest.fixture
def standin(tmp_path: Path) -> Iterator[tuple[Path, dict[str, int]]]:
    """The stand-in's record file and its port per mode: ``close`` (reads the request,
    closes) and ``ok`` (answers)."""
    ports = {"close": free_port(), "ok": free_port()}
    record = tmp_path / "record"
    proc = subprocess.Popen([sys.executable, str(STANDIN), str(record), "1024"]
                            + [f"{m}:{p}" for m, p in ports.items()],
                            stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        yield record, ports
    finally:
        proc.terminate()
        proc.wait(30)


@pytest.fixture
def config(tmp_path: Path, engine: str) -> Path:
    return write_config(tmp_path, engine, [tmp_path])   # no preset here: the peers have it


@pytest.fixture
async def gateway(running: Any, bus_address: str, standin: tuple[Path, dict[str, int]]
                  ) -> AsyncIterator[Gateway]:
    _, ports = standin
    peers = tuple(Peer(NAMES[m], f"http://127.0.0.1:{ports[m]}") for m in ("close", "ok"))
    async with gateway_on(bus_address, peers=peers) as gw:
        async def both_up() -> bool:
            return all(s.up for s in gw.peers.states.values())

        await until(both_up, 20, "both peers read")
        yield gw


async def test_a_request_a_peer_read_is_not_sent_to_another_replica(
        gateway: Gateway, standin: tuple[Path, dict[str, int]]) -> None:
    """Asked unstreamed (relayed), then streamed (carried as bytes): neither is sent on."""
    record, _ = standin
    for stream in (False, True):
        body = {"model": "shared", "messages": MESSAGES,
                "max_tokens": 4, **({"stream": True} if stream else {})}
        record.unlink(missing_ok=True)
        async with httpx.AsyncClient(timeout=60) as c:
            r = await c.post(gateway.url + "/v1/chat/completions",  # type: ignore[attr-defined]
                             json=body)
        seen = record.read_text().splitlines() if record.exists() else []
        sent = len(json.dumps(body).encode())   # httpx's compact JSON is a little shorter
        assert [line.split()[:3] for line in seen] == [
            ["close", "POST", "/v1/chat/completions"]], (stream, seen)   # none to "ok"
        assert abs(int(seen[0].split()[3]) - sent) < 16   # the first read it whole
        assert r.status_code == 502, (stream, r.text)
        assert r.json()["error"]["message"].startswith(
            f"peer gateway '{NAMES['close']}' did not answer"), r.text
        assert "127.0.0.1" not in r.text   # the peer's address stays in the log
