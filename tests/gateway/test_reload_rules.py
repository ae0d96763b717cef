"""The rules of the gateway's reload (issue 48, item 5) without a process: which
connections a removed listener took (a wildcard's connections carry the address they
reached), a peer still listed the same keeps its state, and a request let in by the CORS
policy keeps it when a reload changes it while the request runs. The reload itself, in the
real process with the real engine: tests/gateway/test_reload.py."""

from __future__ import annotations

import asyncio

from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from lokid.core.fleet.peers import Peer
from lokid.gateway.cors import Cors
from lokid.gateway.peers import Peers
from lokid.gateway.reload import accepted_by, at


def test_an_address_is_a_value_as_the_socket_says_it() -> None:
    assert at("::0001", 8000) == at("::1", 8000)
    assert at("fe80::1%eth0", 80) == at("fe80::1", 80)
    assert at("127.0.0.1", 8000) != at("127.0.0.1", 8001)


def test_a_listeners_connections_are_those_it_accepted() -> None:
    wildcard, local = at("0.0.0.0", 8000), at("127.0.0.2", 8001)
    assert accepted_by(wildcard, at("10.1.2.3", 8000))      # reached through 0.0.0.0
    assert accepted_by(wildcard, at("127.0.0.1", 8000))
    assert not accepted_by(wildcard, at("127.0.0.1", 8001))   # another port
    assert not accepted_by(wildcard, at("::1", 8000))         # v6: another listener
    assert accepted_by(at("::", 8000), at("::1", 8000))
    assert accepted_by(local, at("127.0.0.2", 8001))
    assert not accepted_by(local, at("127.0.0.1", 8001))


async def test_a_peer_listed_the_same_keeps_its_state() -> None:
    a, b = Peer("a", "http://127.0.0.1:9"), Peer("b", "http://127.0.0.1:10")
    peers = Peers([a, b], lambda: None)
    peers.start()
    kept, reading, old_b = peers.states["a"], peers.tasks["a"], peers.tasks["b"]
    try:
        moved = Peer("b", "http://127.0.0.1:11")   # the same name, another url
        removed, added = peers.reconfigure([a, moved, Peer("c", "http://127.0.0.1:12")])
        assert (removed, added) == (["b"], ["b", "c"])
        assert peers.states["a"] is kept and peers.tasks["a"] is reading   # untouched
        assert peers.states["b"].peer == moved and peers.tasks["b"] is not old_b
        assert set(peers.tasks) == {"a", "b", "c"}   # the new ones read
        await asyncio.sleep(0)
        assert old_b.cancelled()
        assert peers.reconfigure([a]) == (["b", "c"], [])
        assert set(peers.states) == set(peers.tasks) == {"a"}
    finally:
        await peers.stop()


async def test_a_request_keeps_the_cors_policy_it_was_let_in_by() -> None:
    cors = Cors(("http://old.example",))
    request = make_mocked_request("GET", "/v1/models", headers={"Origin": "http://old.example"})

    async def handler(_request: web.Request) -> web.StreamResponse:
        cors.set(("http://new.example",))   # a reload while the request runs
        return web.Response()

    response = await cors.middleware(request, handler)
    await cors.on_prepare(request, response)
    assert response.headers["Access-Control-Allow-Origin"] == "http://old.example"
    later = make_mocked_request("GET", "/v1/models", headers={"Origin": "http://old.example"})
    refused = await cors.middleware(later, handler)
    assert refused.status == 403
