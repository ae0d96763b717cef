"""Which host answers a request for a model, among this gateway and its peers (issue 30,
item 1): the rule, pure; the gateway gathers the views and relays.

Each host's view of a model is what its gateway's ``GET /v1/models`` says under
``lokid`` (state, requests in flight, and whether it fits now or would wait for memory,
from its placement); a peer that is down has no view. The rule, in order:

1. **A request that already made a hop** (it carries the hop mark) is answered here or
   not at all: a gateway never forwards a marked request, so peers that list each other
   cannot loop.
2. **This host's own preset, when it can take the request**: ready, loading, or on
   demand and fitting now, it answers here whatever a peer says (issue 45, item 3). A
   peer's view is its word, and nothing checks it: a peer listing this host's model
   "ready" with nothing in flight took every request for it, the local preset on demand
   never started. Peers serve a model this host has only when it cannot (broken,
   failed, unresponsive, stopping, or waiting for memory here), by the rules below.
3. **Ready replicas first**: among the hosts where the model's engine is ready, the
   one cache-affine routing chooses (:mod:`lokid.core.serve.affinity`, issue 47: the one
   known to hold the longest prefix of the prompt, within a bound on its load, a spill
   to the least loaded when it is full, a new prompt by its hash); without a prompt
   known, the one with the fewest requests in flight, a tie to the peer listed first.
   **Rule 2 yields to affinity** when a ready peer, within its load bound, is known to
   hold a longer prefix of the prompt than this host (it is the choice, and holds
   some): there the peer's engine re-reads only the new message where this host's would
   re-read the whole history (seconds for a long one, against a hop's milliseconds).
   It does not yield for load alone: a prompt no host is known to hold, or one whose
   holder is full, stays here while this host can take it (rule 2 as before), so a
   peer's word (its requests in flight) still cannot draw a local preset's requests
   away, and what it may claim instead (fingerprints it lists) is bounded in number and
   draws only within its load bound, the requests this gateway has in flight there
   counted. A host that is not ready holds no prefix (its engine starts with an empty
   cache).
4. **Else the host that can start it soonest**: a peer where it is on demand and fits
   now; else one where it is loading (its start is under way: the soonest); else this
   host or a peer where it would wait for memory (placement: it starts once room is
   made).
5. Nowhere: the reason names each host and why (a peer down, a preset broken there,
   none has the model).

The answer is every candidate in that order: the relay tries the next only when no
byte of the request reached the one before (connect refused, a pooled connection closed
before any answer), never after, so nothing is generated twice.

The same name on several hosts is one model with replicas; a peer's model of another
kind than this host's preset of that name (an engine here, an external API there) is no
replica: the gateway leaves it out, and shows the conflict (:mod:`lokid.gateway.peers`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..serve.affinity import Affinity, Choice, Replica
from ..serve.prefixes import Chain

LOCAL = ""          # the host name of this gateway in a Route
READY, LOADING = "ready", "loading"
STARTABLE = ("inactive", "stopping")   # on demand there: a request starts it


@dataclass(frozen=True)
class Model:
    """One host's view of a model (its gateway's /v1/models entry, ``lokid`` part)."""

    state: str                  # ready, loading, inactive, stopping, failed, broken…
    in_flight: int = 0
    on_demand: bool = False
    fits: bool | None = None    # placement: fits now (True), waits for memory (False),
    #                             unknown (None: no placement there, counted as fits)
    kind: str = "engine"        # or "external"
    slots: int = 0              # requests its engine runs at once (0: not known)


@dataclass(frozen=True)
class Host:
    name: str                                   # LOCAL for this gateway
    up: bool = True
    models: Mapping[str, Model] | None = None   # None while down or never read
    why_down: str = ""


@dataclass(frozen=True)
class Route:
    candidates: tuple[str, ...]   # host names in the order to try; () = nowhere
    why: str                      # one line: why the first, or why none


def _rank(host: Host, m: Model, index: int) -> tuple[int, int, int, int] | None:
    """Smaller is better; None when this host cannot take it now or later."""
    local = 0 if host.name == LOCAL else 1
    if m.state == READY:
        return (0, m.in_flight, local, index)
    startable = m.on_demand and m.state in STARTABLE
    if startable and m.fits is not False:
        return (1, local, 0, index)
    if m.state == LOADING:
        return (2, m.in_flight, local, index)
    if startable:   # waits for memory there: placement makes room
        return (3, local, 0, index)
    return None


def route(name: str, hosts: Sequence[Host], hopped: bool = False,
          chain: Chain | None = None, affinity: Affinity | None = None) -> Route:
    """The hosts that may answer a request for ``name``, best first (see the module
    docstring). ``hosts``: this gateway's (name LOCAL) first, then its peers in their
    configured order; ``hopped``: the request carries the hop mark; ``chain``: its
    prompt's prefixes, chosen among the ready replicas by ``affinity`` (rule 3)."""
    ranked: list[tuple[bool, tuple[int, int, int, int], str]] = []
    ready: list[Replica] = []
    missing: list[str] = []
    for index, host in enumerate(hosts):
        if hopped and host.name != LOCAL:
            continue
        if not host.up or host.models is None:
            if host.name != LOCAL:
                missing.append(f"{host.name} is down" + (f" ({host.why_down})"
                                                         if host.why_down else ""))
            continue
        m = host.models.get(name)
        if m is None:
            continue
        rank = _rank(host, m, index)
        if rank is None:
            missing.append(f"{_label(host.name)} has it {m.state}")
            continue
        # rule 2: this host's own first when it can take it now (False sorts first)
        here_first = host.name == LOCAL and (m.state in (READY, LOADING) or (
            m.on_demand and m.state == "inactive" and m.fits is not False))
        ranked.append((not here_first, rank, host.name))
        if rank[0] == 0:
            ready.append(Replica(host.name, m.in_flight, m.slots))
    choice = None
    if affinity is not None and chain is not None and ready:
        choice = affinity.choose(chain, ready)
        ranked = [_affine(r, choice) for r in ranked]
    ranked.sort()
    if not ranked:
        if hopped:
            return Route((), f"model {name!r} is not served here, and a request that came "
                         "from a peer gateway is not sent on")
        where = "; ".join(missing) if missing else "no host lists it"
        return Route((), f"model {name!r} cannot be answered: {where}")
    _, best_rank, best = ranked[0]
    if choice is not None and best == choice.name:
        return Route(tuple(h for _, _, h in ranked), choice.why)
    words = ("ready", "on demand, fits now", "loading", "on demand, waits for memory")
    why = f"{_label(best)}: {'its own preset, ' if best == LOCAL else ''}" \
        f"{words[best_rank[0]]}"
    if best_rank[0] in (0, 2):
        why += f", {best_rank[1]} request{'s' if best_rank[1] != 1 else ''} in flight"
    return Route(tuple(h for _, _, h in ranked), why)


def _affine(ranked: tuple[bool, tuple[int, int, int, int], str], choice: Choice
            ) -> tuple[bool, tuple[int, int, int, int], str]:
    """A ranked host with the affinity choice first among the ready ones; before this
    host's own too (rule 2 yields) when it holds a prefix of the prompt: more than this
    host does, or this host is full or past its bound (else this host is the choice)."""
    later, _rank, name = ranked
    if name != choice.name:
        return ranked
    return (later and not choice.held, (0, -1, 0, 0), name)


def _label(name: str) -> str:
    return "this host" if name == LOCAL else name
