"""lokid.core.fleet.route: which host answers a request for a model, among this gateway
and its peers (issue 30, item 1)."""

from __future__ import annotations

from lokid.core.fleet.route import LOCAL, Host, Model, route


def hosts(**views: dict[str, Model] | None) -> list[Host]:
    """LOCAL first (keyword ``here``), then the peers in the order given; None: down."""
    out = []
    for name, models in views.items():
        host = LOCAL if name == "here" else name
        out.append(Host(host, up=models is not None, models=models,
                        why_down="connect refused" if models is None else ""))
    return out


def test_ready_replicas_by_fewest_in_flight_ties_to_the_first_peer() -> None:
    r = route("qwen", hosts(here={}, b={"qwen": Model("ready", 2)},
                            c={"qwen": Model("ready", 1)}, d={"qwen": Model("ready", 1)}))
    assert r.candidates == ("c", "d", "b") and r.why == "c: ready, 1 request in flight"


def test_this_hosts_own_preset_answers_here_whatever_a_peer_says() -> None:
    """Issue 45, item 3: a peer saying "ready, nothing in flight" for this host's model
    took its requests; this host's preset answers while it can take them."""
    liar = {"qwen": Model("ready", 0)}
    for mine in (Model("ready", 7), Model("inactive", on_demand=True, fits=True),
                 Model("inactive", on_demand=True), Model("loading", 3)):
        r = route("qwen", hosts(here={"qwen": mine}, b=liar))
        assert r.candidates == (LOCAL, "b"), mine
        assert r.why.startswith("this host: its own preset, "), r.why
    # it cannot: a peer with it is the one to ask
    for mine in (Model("inactive", on_demand=True, fits=False), Model("failed"),
                 Model("stopping", on_demand=True), Model("unresponsive", 2)):
        assert route("qwen", hosts(here={"qwen": mine}, b=liar)).candidates[0] == "b", mine


def test_else_the_host_that_can_start_it_soonest() -> None:
    views = hosts(here={"m": Model("inactive", on_demand=True, fits=False)},
                  b={"m": Model("loading", 3)},
                  c={"m": Model("inactive", on_demand=True, fits=True)})
    r = route("m", views)
    # fits now on c, loading on b, waits for memory here
    assert r.candidates == ("c", "b", LOCAL) and r.why == "c: on demand, fits now"
    # a preset here that fits now goes first, before a ready peer too: no hop
    assert route("m", hosts(here={"m": Model("inactive", on_demand=True)},
                            c={"m": Model("inactive", on_demand=True)})).candidates == \
        (LOCAL, "c")
    assert route("m", hosts(here={"m": Model("inactive", on_demand=True)},
                            c={"m": Model("ready")})).candidates == (LOCAL, "c")


def test_a_hop_is_never_sent_on() -> None:
    views = hosts(here={"x": Model("inactive", on_demand=True)}, b={"x": Model("ready")})
    assert route("x", views, hopped=True).candidates == (LOCAL,)
    r = route("y", hosts(here={}, b={"y": Model("ready")}), hopped=True)
    assert r.candidates == () and "came from a peer gateway is not sent on" in r.why


def test_nowhere_says_why_per_host() -> None:
    r = route("q", hosts(here={"q": Model("broken")}, b=None,
                         c={"q": Model("inactive", on_demand=False)}))
    assert r.candidates == ()
    assert r.why == ("model 'q' cannot be answered: this host has it broken; b is down "
                     "(connect refused); c has it inactive")
    assert route("z", hosts(here={}, b={})).why == \
        "model 'z' cannot be answered: no host lists it"
