"""What a gateway learns and tells of prompt prefixes (issue 47, item 2): the real
:class:`lokid.gateway.peers.Peers` fed a peer's listing as bytes (the HTTP read itself
is tests/gateway/test_affinity_peers.py's), its routing read back. A peer's fingerprints
route only the conversations they name, are never shown to a client, and are forgotten
when the peer goes down or its engine stops; this host forgets its own when its engine
starts again; what it tells is bounded."""

from __future__ import annotations

import json
from typing import Any

from lokid.core.fleet.peers import Peer
from lokid.core.fleet.route import LOCAL, Model
from lokid.core.serve.affinity import LISTED
from lokid.core.serve.prefixes import Chain, chain, hex_of
from lokid.gateway.peers import TOLD, Peers, told

SYSTEM = "You answer in French. " * 40


def conv(n: int, who: str = "a", model: str = "qwen", system: str = SYSTEM) -> Chain:
    msgs: list[dict[str, Any]] = [{"role": "system", "content": system}]
    for k in range(1, n + 1):
        msgs.append({"role": "user", "content": f"{who} {k}"})
        if k < n:
            msgs.append({"role": "assistant", "content": f"{who} answer {k}"})
    return chain(model, {"messages": msgs})


def listing(state: str = "ready", prints: tuple[int, ...] = (), **more: Any) -> bytes:
    return json.dumps({"object": "list", "data": [{"id": "qwen", "object": "model", "lokid": {
        "state": state, "in_flight": 0, "on_demand": True, "status": "", "slots": 2,
        "prefixes": hex_of(prints), **more}}]}).encode()


def fed(peers: Peers, data: bytes) -> bool:
    s = peers.states["b"]
    changed = peers._take(s, data)
    s.up = True   # as a read that succeeded leaves it
    return changed


async def test_a_peer_s_prefixes_route_its_conversations_and_reach_no_client() -> None:
    peers = Peers((Peer("b", "http://127.0.0.1:9"),), lambda: None)
    here = Model("ready", 0, slots=2)
    fed(peers, listing(prints=conv(1, "a").prints))
    assert peers.route("qwen", here, chain=conv(2, "a")).candidates == ("b", LOCAL)
    # a new conversation with the system prompt it holds goes there too; one with
    # another system prompt stays here (this host's own first)
    assert peers.route("qwen", here, chain=conv(1, "y")).candidates[0] == "b"
    other = conv(2, "z", system="Another prompt.")
    assert peers.route("qwen", here, chain=other).candidates[0] == LOCAL
    # the listing clients are shown has its slots, never its fingerprints
    shown = peers.listing()["qwen"]["b"]
    assert shown["slots"] == 2 and "prefixes" not in shown
    assert f"{conv(1, 'a').prints[-1]:016x}" not in json.dumps(peers.listing())


async def test_forgotten_when_its_engine_stops_or_it_goes_down() -> None:
    peers = Peers((Peer("b", "http://127.0.0.1:9"),), lambda: None)
    here = Model("ready", 0, slots=2)
    fed(peers, listing(prints=conv(1).prints))
    fed(peers, listing("loading"))   # its engine starts again: its cache is empty
    assert peers.route("qwen", here, chain=conv(2)).candidates[0] == LOCAL
    data = listing(prints=conv(1).prints)
    fed(peers, data)
    assert peers.route("qwen", here, chain=conv(2)).candidates[0] == "b"
    peers.down("b", "a request could not reach it")
    assert len(peers.affinity) == 0
    # back up with the very same bytes: parsed again, what it holds learned again
    assert fed(peers, data) is True
    assert peers.route("qwen", here, chain=conv(2)).candidates[0] == "b"
    # the model gone from its listing: forgotten too
    fed(peers, json.dumps({"data": []}).encode())
    assert len(peers.affinity) == 0


async def test_this_host_forgets_its_own_when_its_engine_starts_again() -> None:
    peers = Peers((), lambda: None)
    peers.served_here(conv(1, "a"), "qwen", None)   # its start, for this request
    peers.served_here(conv(1, "b"), "qwen", 10.0)   # ready since 10.0: both kept
    assert set(peers.affinity.held("qwen", LOCAL)) >= {conv(1, "a").prints[-1],
                                                        conv(1, "b").prints[-1]}
    peers.served_here(conv(1, "c"), "qwen", 20.0)   # started again since
    held = peers.affinity.held("qwen", LOCAL)
    assert conv(1, "c").prints[-1] in held and conv(1, "a").prints[-1] not in held
    assert conv(1, "b").prints[-1] not in held
    peers.served_here(Chain("qwen"), "qwen", 30.0)   # no prompt: nothing changes
    assert peers.affinity.held("qwen", LOCAL) == held


async def test_what_a_peer_is_told_is_bounded() -> None:
    peers = Peers((), lambda: None)
    models = [f"m{i}" for i in range(8)]
    for name in models:
        for i in range(LISTED):
            peers.served_here(conv(1, f"c{i}", model=name), name, 1.0)
    entries: dict[str, dict[str, Any]] = {name: {"id": name, "lokid": {}} for name in
                                          models + ["external"]}
    told(entries, {name: 4 for name in models}, peers.affinity)
    counts = [len(entries[n]["lokid"]["prefixes"]) for n in models]
    assert sum(counts) == TOLD and max(counts) == LISTED, counts
    assert all(entries[n]["lokid"]["slots"] == 4 for n in models)
    assert entries["external"]["lokid"] == {}
    assert len(json.dumps(entries)) < 64 * 1024
