"""lokid.core.fleet.route with cache-affine routing, and what a peer's listing may say of
it (issue 47, item 2): the rule among a model's replicas on this host and its peers."""

from __future__ import annotations

import json
from typing import Any

from lokid.core.fleet.listing import MAX_PREFIXES, model_of, prefixes_of, read_listing
from lokid.core.fleet.route import LOCAL, Host, Model, route
from lokid.core.serve.affinity import Affinity
from lokid.core.serve.prefixes import Chain, chain, hex_of

SYSTEM = "You answer briefly. " * 50


def conv(n: int, who: str = "a") -> Chain:
    msgs: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    for k in range(1, n + 1):
        msgs.append({"role": "user", "content": f"{who} {k}"})
        if k < n:
            msgs.append({"role": "assistant", "content": f"{who} answer {k}"})
    return chain("qwen", {"messages": msgs})


def hosts(**views: Model | None) -> list[Host]:
    """This host (``here``) then peers, each with model qwen as given (None: none)."""
    return [Host(LOCAL if h == "here" else h, True, {"qwen": m} if m else {})
            for h, m in views.items()]


def test_among_peers_a_conversation_returns_to_its_host_not_the_least_loaded() -> None:
    aff = Affinity()
    view = hosts(here=None, b=Model("ready", 0), c=Model("ready", 1))
    first = route("qwen", view, chain=conv(1), affinity=aff)
    aff.record(conv(1), first.candidates[0])
    other = "c" if first.candidates[0] == "b" else "b"
    # the holder now has more in flight than the other, within the bound
    loads = {first.candidates[0]: 1, other: 0}
    view = hosts(here=None, b=Model("ready", loads["b"]), c=Model("ready", loads["c"]))
    again = route("qwen", view, chain=conv(2), affinity=aff)
    assert again.candidates == (first.candidates[0], other), again
    assert "holds 2 of the prompt's 4 prefixes" in again.why
    # without affinity (no chain) the least loaded, as before
    assert route("qwen", view).candidates[0] == other


def test_own_preset_first_yields_only_to_a_peer_holding_the_prefix() -> None:
    aff = Affinity()
    aff.record(conv(1, "a"), "b")
    view = hosts(here=Model("ready", 0), b=Model("ready", 1))
    r = route("qwen", view, chain=conv(2, "a"), affinity=aff)
    assert r.candidates == ("b", LOCAL) and r.why.startswith("b holds"), r
    # a conversation only here stays here though b is less loaded
    aff.record(conv(1, "z"), LOCAL)
    view = hosts(here=Model("ready", 1), b=Model("ready", 0))
    assert route("qwen", view, chain=conv(2, "z"), affinity=aff).candidates[0] == LOCAL
    # a prompt nobody holds, with another system prompt: own first (rule 2), for load too
    new = chain("qwen", {"messages": [{"role": "user", "content": "fresh"}]})
    for mine in (Model("ready", 7, slots=1), Model("loading", 2),
                 Model("inactive", on_demand=True, fits=True)):
        view = hosts(here=mine, b=Model("ready", 0))
        assert route("qwen", view, chain=new, affinity=aff).candidates == (LOCAL, "b"), mine
    # the holder past its load bound: no yield, this host answers (nothing is held here)
    view = hosts(here=Model("ready", 0), b=Model("ready", 9))
    assert route("qwen", view, chain=conv(2, "a"), affinity=aff).candidates[0] == LOCAL
    # this host not ready: the peer holding the prefix answers, not a start here
    view = hosts(here=Model("inactive", on_demand=True, fits=True), b=Model("ready", 3))
    assert route("qwen", view, chain=conv(2, "a"), affinity=aff).candidates == ("b", LOCAL)


def test_a_full_peer_spills_to_the_free_one() -> None:
    aff = Affinity()
    aff.record(conv(1), "b")
    view = hosts(here=None, b=Model("ready", 2, slots=2), c=Model("ready", 1, slots=2))
    r = route("qwen", view, chain=conv(2), affinity=aff)
    assert r.candidates == ("c", "b") and "full" in r.why, r


def test_the_hop_mark_still_keeps_it_here() -> None:
    aff = Affinity()
    aff.record(conv(1), "b")
    view = hosts(here=Model("ready", 3), b=Model("ready", 0))
    assert route("qwen", view, hopped=True, chain=conv(2), affinity=aff).candidates == (LOCAL,)


def listing(**lokid: Any) -> bytes:
    return json.dumps({"data": [{"id": "qwen", "lokid": {"state": "ready", **lokid}}]}
                      ).encode()


def test_a_listing_s_slots_and_prefixes_are_bounded_and_kept_from_clients() -> None:
    prints = hex_of(conv(3).prints)
    facts = read_listing(listing(slots=4, prefixes=prints)).models["qwen"]
    assert model_of(facts).slots == 4
    assert prefixes_of(facts) == conv(3).prints and "prefixes" not in facts
    # past the bound, or anything but 16 hex digits in it: dropped whole
    for bad in ([f"{i:016x}" for i in range(MAX_PREFIXES + 1)], prints + ["../etc"],
                prints + [prints[0].upper()], prints + [17], "abc"):
        facts = read_listing(listing(prefixes=bad)).models["qwen"]
        assert prefixes_of(facts) == (), bad
    for slots in (0, -1, True, 10**9, "4"):
        assert model_of(read_listing(listing(slots=slots)).models["qwen"]).slots == 0
