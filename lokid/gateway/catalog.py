"""``GET /v1/models``: what a client may ask this gateway for, and the refusals that
name it (a model no preset has, a broken one, lokid unreachable).

Every preset that can answer is listed, running or not, in OpenAI's shape, its state
under ``lokid`` (``external`` for an API elsewhere, its status then whether the daemon
saw it answer; ``unresponsive`` for an engine whose /health did not answer). A broken
preset is not listed (a model picker would offer what cannot answer); asked by name, it
is shown with its reason. With peers, their models are added (:func:`with_peers`).
Each entry says what a client picks a model by (:func:`described`): its context length
and capabilities, and its aliases, each also listed as a model of its own.

A client's key may be limited to some models (:meth:`lokid.core.serve.keys.Identity.allows`):
it is shown only those, here and the peers', and any other is answered as a model that
does not exist (404 model_not_found, :meth:`Catalog.refused`), by the list, by
``/v1/models/<id>`` and by the known names a refusal lists: a key must not learn which
models the gateway serves beyond its own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aiohttp import web

from ..core.config.external import EXTERNAL
from ..core.fleet.route import READY
from ..core.place.policy import Resident
from ..core.serve.keys import ANONYMOUS, Identity
from .peers import UNAVAILABLE as UNAVAILABLE_PEER
from .peers import Peers
from .placer import Placer
from .presets import Preset, Presets
from .replies import UNAVAILABLE, GatewayError, model_entry, public
from .silence import Liveness

KNOWN_SHOWN = 20   # models named in a 404, at most
UNRESPONSIVE = "unresponsive"   # a ready engine whose /health did not answer (silence)


class Catalog:
    def __init__(self, presets: Presets, placer: Placer, liveness: Liveness, peers: Peers):
        self.presets = presets
        self.placer = placer
        self.liveness = liveness
        self.peers = peers

    def allowed(self, identity: Identity, name: str) -> bool:
        """Whether ``identity`` may use the model ``name``: its key's patterns match the
        name asked or, for a preset here, its name or any of its aliases."""
        if identity.allows(name):
            return True
        preset = self.presets.presets.get(self.presets.resolve(name))   # an alias: its preset
        return preset is not None and any(
            identity.allows(n) for n in (preset.name, *preset.aliases))

    def models(self, path: str, here_only: bool = True, identity: Identity = ANONYMOUS,
               told: Callable[[dict[str, dict[str, Any]]], None] | None = None
               ) -> web.Response:
        """Every preset a client can ask for; a broken one only by its name (a model
        picker does not offer what cannot answer: /v1/models/<name> says why). Unless
        ``here_only``, the peers' models too (lokid.gateway.peers: :func:`with_peers`).
        Only what ``identity`` may use. ``told``: adds what a peer is told (for a
        request with the hop mark: lokid.gateway.peers.told)."""
        broken = self.presets.broken
        residents = self.placer.residents(self.placer.clock())   # once for every entry
        entries = {name: model_entry(name, "broken", p.on_demand, public(broken[name]))
                   if name in broken else model_entry(name, EXTERNAL, False, public(p.reachable))
                   if p.kind == EXTERNAL else self._entry(p, residents)
                   for name, p in sorted(self.presets.presets.items())}
        described(entries, self.presets)   # context, capabilities; each alias an entry
        if told is not None:
            told(entries)
        if not here_only:
            broken = with_peers(entries, broken, self.peers.listing())
        if identity.models:
            entries = {n: e for n, e in entries.items() if self.allowed(identity, n)}
        if path.startswith("/v1/models/"):
            name = path[len("/v1/models/"):]
            if name not in entries:
                raise self.unknown(name, not here_only, identity)
            return web.json_response(entries[name])
        return web.json_response({"object": "list", "data": [
            e for name, e in sorted(entries.items()) if name not in broken]})

    def _entry(self, p: Preset, residents: list[Resident]) -> dict[str, Any]:
        self.liveness.forget(p.name, p.state)
        unresponsive = self.liveness.state(p.name)
        in_flight = max(p.in_flight, self.placer.own[p.name])
        if unresponsive:
            return model_entry(p.name, UNRESPONSIVE, p.on_demand, public(unresponsive),
                               in_flight, False)
        return model_entry(p.name, p.shown_state, p.on_demand,
                           "unloading" if p.unloading else public(p.status), in_flight,
                           self.placer.fits(p, residents))

    def known(self, everywhere: bool = False, identity: Identity = ANONYMOUS) -> str:
        """The models a client may ask for here; ``everywhere``: its peers' too (what they
        listed), for a request that may be sent on; of those, what ``identity`` may use."""
        names = sorted(n for n in {n for n in self.presets.presets
                                   if n not in self.presets.broken}
                       | (set(self.peers.listing()) if everywhere and self.peers else set())
                       if self.allowed(identity, n))
        shown = ", ".join(names[:KNOWN_SHOWN]) + (", ..." if len(names) > KNOWN_SHOWN else "")
        return shown or "none: lokid has no preset that can answer"

    def unknown(self, name: str, everywhere: bool = False,
                identity: Identity = ANONYMOUS) -> GatewayError:
        """The refusal of a model that cannot be used: lokid unreachable, a broken preset
        (why), or none such, which is also the refusal of a model ``identity`` may not use
        (:meth:`refused`: as if it did not exist)."""
        if self.presets.unreachable and not self.presets.presets:
            return GatewayError(503, "lokid is not reachable (lokid.service); the gateway's "
                                "log says why", UNAVAILABLE, "lokid_unreachable")
        shown = name if len(name) <= 64 else name[:64] + "..."
        if name in self.presets.broken and self.allowed(identity, name):
            return GatewayError(503, f"preset {shown!r} is broken: "
                                f"{public(self.presets.broken[name])}",
                                UNAVAILABLE, "model_broken")
        return GatewayError(404, f"no model {shown!r}: the known ones are "
                            f"{self.known(everywhere, identity)}",
                            code="model_not_found")

    def refused(self, name: str, everywhere: bool, identity: Identity) -> None:
        """GatewayError 404 model_not_found when ``identity`` may not use ``name``, worded
        as for a model no preset has: a scoped key learns nothing of the others."""
        if not self.allowed(identity, name):
            shown = name if len(name) <= 64 else name[:64] + "..."
            raise GatewayError(404, f"no model {shown!r}: the known ones are "
                               f"{self.known(everywhere, identity)}", code="model_not_found")


def described(entries: dict[str, dict[str, Any]], presets: Presets) -> None:
    """Each preset's entry with what a client picks a model by (issue 46, item 5): under
    ``lokid`` its ``context_length`` (null: not known) and ``capabilities`` (the daemon's,
    lokid.core.model.modeltraits), and ``aliases`` beside ``id`` (llama.cpp's router names the
    field so); a preset running several engines, each as ``lokid.engines`` (index, state,
    requests in flight: its replicas, issue 47; no address); and each alias as an entry
    of its own, ``lokid.alias_of`` its preset, so that a model picker offers it and
    ``/v1/models/<alias>`` answers. A broken preset's aliases are not listed (a picker
    would offer what cannot answer)."""
    for name, p in list(presets.presets.items()):
        entry = entries.get(name)
        if entry is None:
            continue
        entry["aliases"] = list(p.aliases)
        entry["lokid"].update(context_length=p.context_length or None,
                              capabilities=list(p.capabilities))
        if len(p.engines) > 1:   # its replicas (issue 47): each engine, never its address
            entry["lokid"]["engines"] = [{"index": e.index, "state": e.state,
                                          "in_flight": e.in_flight} for e in p.engines]
        if name in presets.broken:
            continue
        for alias in p.aliases:
            if alias not in entries:   # a name wins over an alias (lokid.core.config.aliases)
                entries[alias] = {**entry, "id": alias, "aliases": [],
                                  "lokid": {**entry["lokid"], "alias_of": name}}


def with_peers(entries: dict[str, dict[str, Any]], broken: dict[str, str],
               listing: dict[str, dict[str, dict[str, Any]]]) -> dict[str, str]:
    """``entries`` (this host's) with the peers' models added: a name served here gets the
    peers' facts under ``lokid.replicas`` (peer → facts); a name served by peers only is
    listed with the facts of the first peer where it is ready (else the first up),
    its ``host`` named, and the others' as replicas. A name broken here that a peer serves
    is the peer's. The names still broken (not listed) are returned."""
    broken = dict(broken)
    for name in sorted(listing):
        replicas = listing[name]
        mine = entries.get(name)
        if mine is not None and "alias_of" in mine["lokid"]:   # a local alias wins
            mine["lokid"]["conflict"] = (
                f"{', '.join(sorted(replicas))} list{'s' if len(replicas) == 1 else ''} a "
                f"model named {name!r}: this host's alias of preset "
                f"{mine['lokid']['alias_of']!r} is the one routed to")
            continue
        if mine is not None and name not in broken:
            external = mine["lokid"]["state"] == EXTERNAL
            other = sorted(h for h, f in replicas.items() if "state" in f
                           and f["state"] != UNAVAILABLE_PEER
                           and (f["state"] == EXTERNAL) != external)
            if other:   # another kind of model under this name: the local preset wins
                mine["lokid"]["conflict"] = (
                    f"{', '.join(other)} serve{'s' if len(other) == 1 else ''} another kind "
                    f"of model named {name!r} ({'an engine' if external else 'an external API'}"
                    "): this host's preset is the one routed to")
            mine["lokid"]["replicas"] = {h: f for h, f in replicas.items() if h not in other}
            continue
        broken.pop(name, None)
        host = min(replicas, key=lambda h: (replicas[h].get("state") != READY,
                                            replicas[h].get("state") == UNAVAILABLE_PEER))
        facts = {**replicas[host], "host": host, "replicas": replicas}
        entries[name] = {**model_entry(name, "", False, ""), "lokid": facts}
    return broken
