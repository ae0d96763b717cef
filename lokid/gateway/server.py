"""``lokid gateway``: the HTTP routes, the client keys, and the process around them.

aiohttp parses HTTP (no parser of ours). Routes:

- ``GET /health`` (and ``/v1/health``, and ``HEAD`` of each: a load balancer's probe):
  the gateway answers (200), and says whether lokid is reachable;
- ``GET /v1/models`` (and ``/models``, ``/v1/models/<id>``; ``HEAD``): every preset that can
  answer, running or not, in OpenAI's shape, its state under ``lokid`` (``external``
  for an API elsewhere, its status then whether the daemon saw it answer;
  ``unresponsive`` for an engine whose /health did not answer). A broken preset is not
  listed (a model picker would offer what cannot answer); asked by name, it is shown
  with its reason;
- a request for an external preset goes to its ``url`` with its ``upstream_model`` and
  its key (:mod:`lokid.gateway.upstream`), on OpenAI's inference routes only: no
  start, no group; its answers name the preset, not the API's model;
- a request on an inference route (:mod:`lokid.gateway.routes`) goes to an engine,
  chosen by the JSON body's ``model`` (found without parsing the body,
  :mod:`lokid.gateway.bodyscan`; a transcription's form by its ``model`` field,
  :mod:`lokid.gateway.formscan`; a request without a body, such as ``GET /props``, by
  ``?model=``), or ``default_model``: a preset's name or one of its aliases
  (:meth:`lokid.gateway.presets.Presets.resolve`).

Refusals, in OpenAI's error shape: a route the gateway does not offer (404; 405 for
another method), a page's origin not in ``cors_origins`` (403, :mod:`lokid.gateway
.cors`), a body that is not a JSON object (400), no model and no ``default_model``
(400), a model no preset has (404, naming the known ones), a body over ``max_body``
once inflated (413), one that comes too slowly (408, :mod:`lokid.gateway.body`), a
missing or wrong key on a keyed gateway (401, :mod:`lokid.gateway.keys`; ``/health``
needs none), a model the key may not use (404, as for none: :mod:`lokid.gateway
.catalog`), a
head that does not end in time (408, :mod:`lokid.gateway.headtimeout`); without keys, a
``Host`` the gateway is not known by (421, :mod:`lokid.gateway.hosts`); a body longer
than its preset's context can hold (413, :mod:`lokid.gateway.prompts`), or while the
gateway holds its bound of bodies (503, :class:`lokid.gateway.body.Bodies`); a GET for a
preset whose engine is not ready (503: a GET starts nothing, :mod:`lokid.gateway
.ondemand`). What a client reads names no server path or address
(:func:`lokid.gateway.replies.public`); the gateway's log has them, one rate-limited
line per refusal (:mod:`lokid.gateway.faults`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import socket
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

import aiohttp
from aiohttp import web

from ..core.config.external import EXTERNAL
from ..core.fleet.route import LOCAL, READY, Model
from ..core.serve.keys import ANONYMOUS
from ..core.serve.prefixes import Chain
from . import prompts
from .admission import Admission
from .audit import Audit, journal_sender
from .body import BODIES_HELD, MAX_BODY_TEXT, Bodies, SlowBody, read_body
from .bodyscan import BodyError, Scan, walk, with_model
from .catalog import UNRESPONSIVE, Catalog
from .context import IDENTITY_KEY, ROUTE_KEY, WHERE_KEY
from .cors import Cors
from .faults import Faults, client_gone, reset_mid_body
from .formscan import FORM_ROUTES, Form, is_form, scan_form
from .groups import Groups
from .headtimeout import HEAD_TIMEOUT, KEEPALIVE, Connections
from .hosts import Hosts
from .keys import Keyring
from .limits import Limiter
from .ondemand import SAFE_METHODS, Starter, check_safe
from .peers import HOP_HEADER, TOLD, Peers, told
from .placer import Placer
from .presets import Preset, Presets
from .relay import (
    EXTERNAL_KEEPALIVE,
    LOCAL_KEEPALIVE,
    ClientGone,
    Renamer,
    Unreached,
    relay,
    session,
)
from .reload import Reloader
from .replicas import LocalReplicas, Scaler, told_too
from .replies import SERVER, UNAVAILABLE, GatewayError, error_body, public
from .report import CLIENT_GONE, PRESET_KEY, STATUS_KEY, Report
from .routes import (
    ENGINE_ROUTES,
    EXTERNAL_ROUTES,
    NO_START,
    external_path,
    public_props,
    route,
)
from .routetable import HEALTH_PATHS, LISTING_METHODS
from .serverlog import install as install_serverlog
from .settings import Settings
from .shutdown import Draining, StoppableSite
from .silence import Liveness, Patience
from .slots import SlotCache
from .upstream import read_key
from .usage import PEER_PRESET_KEY, Usage
from .waiting import Waiting
from .waitnotes import Answered, telling

log = logging.getLogger("lokid.gateway")

BACKLOG = 1024     # connections waiting to be accepted (a burst of clients, not refused)
MODELS_PATHS = ("/v1/models", "/models")
# Bytes of an engine's /props read to drop what is the server's: llama-server's is a few
# KiB (its chat template the most of it); an answer beyond is refused (issue 45, item 2).
MAX_PROPS = 4 * 1024 * 1024


class Gateway:
    def __init__(self, settings: Settings, presets: Presets,
                 keys: frozenset[str] | Keyring = frozenset()):
        self.settings = settings
        self.presets = presets
        self.starter = Starter(presets)
        slots = SlotCache(lambda: self.client, self._engine_key)
        self.placer = Placer(presets, settings.placement, slots)   # room by memory
        self.groups = Groups(presets, self.starter, slots=slots, placed=self.placer.admitted)
        # who a request is (lokid.gateway.keys): api_keys_file's keys, the named keys file
        self.keyring = keys if isinstance(keys, Keyring) else Keyring(keys,
                                                                      settings.keys_file)
        self.client: aiohttp.ClientSession | None = None     # to the engines
        self.external: aiohttp.ClientSession | None = None   # to external APIs
        self.hops: aiohttp.ClientSession | None = None   # to peer gateways: never pooled
        self.usage = Usage(Audit(journal_sender()))   # who used what (lokid.gateway.usage)
        self.report = Report(presets.bus, self.groups, self.usage)   # to lokid, each second
        self.connections = Connections()   # each with its head's deadline
        self.cors = Cors(settings.cors_origins)
        self.hosts = Hosts(settings.allowed_hosts)   # the names a keyless gateway answers to
        self.bodies = Bodies(BODIES_HELD * settings.max_body)   # all bodies held, bounded
        self.liveness = Liveness(lambda: self.client)
        self.faults = Faults()
        self.peers = Peers(settings.peers, lambda: self.client,   # other lokid gateways
                           presets.report_peers)
        self.catalog = Catalog(presets, self.placer, self.liveness, self.peers)   # /v1/models
        # each engine's gate: its slots in flight, fair share between keys (issue 46)
        self.admission = Admission(settings.max_queue, settings.max_queue_per_key,
                                   lambda: self.client, self._engine_key)
        self.limits = Limiter(presets.bus)   # keys' rates and budgets (lokid.gateway.limits)
        self.waiting = Waiting(presets.bus, self.admission.share, self.groups, self.placer,
                               presets)   # who waits, where and why: told to lokid
        # a preset's replicas: which engine takes a request, and how many run (issue 47)
        self.replicas = LocalReplicas(lambda: self.peers.affinity)
        self.scaler = Scaler(presets.bus, presets, self.admission.share, self.placer,
                             self.replicas, self.admission.resize)
        self.usage.hooks.append(self.limits.on_figures)   # the tokens each key spent

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.settings.max_body + 1,
                              middlewares=[self.connections.middleware,
                                           self.report.middleware, self.usage.middleware,
                                           self.cors.middleware,
                                           self.bodies.middleware])
        app.router.add_route("*", "/{tail:.*}", self.handle)
        app.on_response_prepare.append(self.cors.on_prepare)
        app.on_response_prepare.append(self.usage.on_prepare)   # its first byte
        app.on_startup.append(self._open)
        app.on_cleanup.append(self._close)
        self.limits.install(app)
        return app

    async def _open(self, _app: web.Application) -> None:
        self.client = session(LOCAL_KEEPALIVE, self.presets.socket_at)   # engines' sockets
        self.external = session(EXTERNAL_KEEPALIVE)
        self.hops = session(fresh=True)   # only a failed connect goes to another replica
        self.report.start()
        self.waiting.start()
        self.scaler.start()
        self.peers.start()
        self.hosts.start()   # this machine's names
        self.keyring.start()   # the named keys file looked at, changes in force in < 1 s

    async def _close(self, _app: web.Application) -> None:
        await self.report.stop()
        self.usage.audit.flush()   # the audit records not yet written
        await self.waiting.stop()
        await self.scaler.stop()
        await self.peers.stop()
        await self.keyring.stop()
        for client in (self.client, self.external, self.hops):
            if client is not None:
                await client.close()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        try:
            return await self._route(request)
        except Answered as e:   # told it waited, then failed: its error the last event
            return e.response
        except GatewayError as e:
            if e.status < 500:
                self.faults.client(e.status, e.code, request.method, request.path, e.message)
            headers = {"WWW-Authenticate": "Bearer"} if e.status == 401 else \
                getattr(e, "headers", None)   # a 429's Retry-After
            response = web.json_response(e.body(), status=e.status, headers=headers)
            if isinstance(e, SlowBody):
                response.force_close()   # what is left of its body is not read
            return response
        except ClientGone as e:
            request[STATUS_KEY] = CLIENT_GONE
            return e.response
        except asyncio.CancelledError:   # Python 3.12+: a reset mid-body (faults.py)
            lost = reset_mid_body(request)
            if lost is not None:
                self.faults.gone(lost, request.method, request.path)
            raise
        except Exception as e:   # a defect of ours: a 500 in OpenAI's shape, a line
            if client_gone(request, e):   # reset while sending its body (issue 45, item 6)
                request[STATUS_KEY] = CLIENT_GONE
                self.faults.gone(e, request.method, request.path)
                return web.Response(status=CLIENT_GONE)
            self.faults.defect(e, request.method, request.path)
            return web.json_response(error_body(f"the gateway failed: {type(e).__name__}",
                                                SERVER, "gateway_error"), status=500)

    async def _route(self, request: web.Request) -> web.StreamResponse:
        path = request.path
        if path in HEALTH_PATHS and request.method in LISTING_METHODS:   # HEAD: no body
            return web.json_response({"status": "ok",
                                      "lokid": "unreachable" if self.presets.unreachable
                                      else "reachable"})
        if not self.keyring.keyed:   # a page's request (DNS rebinding) names another host
            self.hosts.check(request.headers.get("Host"))
        identity = request[IDENTITY_KEY] = self.keyring.identify(request.headers)   # or 401
        hopped = HOP_HEADER in request.headers   # sent by a peer: answered from here only
        if request.method in LISTING_METHODS and (path in MODELS_PATHS
                                                  or path.startswith("/v1/models/")):
            return self.catalog.models(path, hopped or not self.peers, identity,
                                       self._told if hopped else None)
        raw_path = request.raw_path.partition("?")[0]
        if raw_path not in ENGINE_ROUTES and raw_path not in EXTERNAL_ROUTES:
            route(request.method, raw_path, ENGINE_ROUTES)   # 404 before reading a body
        request[ROUTE_KEY] = raw_path   # one the gateway offers: its audit record's
        limit = self._read_limit(raw_path)
        body = await read_body(request, limit, self.bodies, MAX_BODY_TEXT
                               if limit == self.settings.max_body else "the largest prompt "
                               "this gateway's presets take")
        form = self._form(raw_path, request, body)   # a transcription's (issue 48)
        scan = None if form is not None else await self._scan(body)
        asked = self._model_of(request, scan, form)
        name = self.presets.resolve(asked)   # an alias: its preset (lokid.core.config.aliases)
        if name != asked and self.peers and not hopped and scan is not None:
            body = with_model(body, scan, name)   # a peer knows the preset by its name
        self.catalog.refused(name, not hopped, identity)   # a key's scope: 404 as for none
        preset = self.presets.presets.get(name)
        self.limits.check(request.get(IDENTITY_KEY, ANONYMOUS))   # 429 past a key's limit
        # carried as bytes (lokid.gateway.tunnel)
        stream = scan.stream if scan is not None else form is not None and form.stream
        # its prompt's prefixes: where it goes, and what this host tells peers it holds
        several = self.replicas.several(preset)   # engines on this host (issue 47)
        chain = self.peers.chain(raw_path, body, name) if self.peers or hopped or several \
            else None
        if self.peers and not hopped:
            answer = await self._via_peers(request, raw_path, body, name, preset, stream,
                                           chain)
            if answer is not None:
                return answer
        if preset is None or name in self.presets.broken:
            raise self.catalog.unknown(name, everywhere=not hopped)
        request[PRESET_KEY] = name   # counted by its answer's status (lokid.gateway.report)
        if chain and preset.kind != EXTERNAL and not several:
            self.peers.served_here(chain, name, preset.ready_at
                                   if preset.state == READY else None)
        # the preset's own key, never the client's (lokid.gateway.upstream)
        key = read_key(name, preset.key_file) if preset.key_file else None
        if preset.kind == EXTERNAL:   # an API elsewhere: no start, no group
            assert self.external is not None
            if raw_path not in EXTERNAL_ROUTES:
                raise GatewayError(404, f"preset {name!r} is an external API: only the OpenAI "
                                   "inference routes (such as /v1/chat/completions) reach "
                                   f"it, not {raw_path[:64]}", code="route_not_supported")
            route(request.method, raw_path, EXTERNAL_ROUTES)
            target = preset.upstream + external_path(raw_path) + (
                f"?{request.query_string}" if request.query_string else "")
            patience = Patience(self.settings.first_byte_timeout,
                                self.settings.stream_idle_timeout)
            request[WHERE_KEY] = "external"
            async with self.admission.gate(request, preset, "", raw_path):   # per-key limit
                return await relay(self.external, request, preset.upstream,
                                   with_model(body, scan, preset.upstream_model)
                                   if scan is not None else body,
                                   keep_auth=False, patience=patience, key=key, target=target,
                                   what=f"the external API of preset {name!r}",
                                   renamer=Renamer(preset.upstream_model, name)
                                   if preset.upstream_model else None)
        route(request.method, raw_path, ENGINE_ROUTES)
        bound = prompts.bound(preset.engine_argv)   # before its engine spends on it
        if raw_path not in prompts.BULK_ROUTES and bound is not None and len(body) > bound:
            raise GatewayError(413, prompts.too_long(name, len(body), preset.engine_argv),
                               code="context_length_exceeded")
        if request.method in SAFE_METHODS or raw_path in NO_START:   # starts, swaps nothing
            group = self.groups.groups.get(preset.group) if preset.group else None
            check_safe(preset, name not in self.placer.evicting and name not in
                       self.placer.closing and (group is None or not group.swapping
                                                and group.turn in ("", name)),
                       "a GET" if request.method in SAFE_METHODS else f"a POST to {raw_path}")
        assert self.client is not None
        # a streaming client that waits told so ([gateway] wait_comments), its group's
        # turn (a batch key's starts no swap over a person's), its engine
        tell = self.settings.wait_comments and stream and request.version >= (1, 1)
        async with telling(request, name, self.admission.share, self.waiting) if tell \
                else contextlib.nullcontext() as teller, \
                self.waiting.turn(preset, request.get(IDENTITY_KEY, ANONYMOUS)) as url:
            await self.liveness.check(name, url)
            patience = self.liveness.patience(name, url, self.settings.first_byte_timeout,
                                              self.settings.stream_idle_timeout)
            if raw_path == "/props":
                return await self._props(request, url, key, patience)
            request[WHERE_KEY] = "local"
            async with self.admission.gate(request, preset, url, raw_path):   # its slot
                told = await teller.stop() if teller is not None else None
                resent = False   # sent again after an engine found gone: once at most
                while True:   # its engine among its replicas (issue 47)
                    with self.replicas.pick(preset, url, chain, self.admission.engine_slots(
                            preset, url)) as (index, to):
                        try:
                            return await relay(
                                self.client, request, to, body, keep_auth=False,
                                patience=patience, key=key, told=told, stream=stream,
                                what=f"the engine of preset {name!r}",
                                elsewhere=self.replicas.several(preset))
                        except Unreached as e:   # a replica killed: another takes it
                            if (e.sent and resent) or not self.replicas.unreached(preset,
                                                                                  index):
                                raise
                            resent = resent or e.sent

    async def _via_peers(self, request: web.Request, raw_path: str, body: bytes, name: str,
                         preset: Preset | None, stream: bool, chain: Chain | None
                         ) -> web.StreamResponse | None:
        """The answer of the peer gateway the routing rule chose (lokid.core.fleet.route),
        or None when this host answers (its preset, or its refusal). A peer none of whose
        request reached it is marked down and the next candidate tried; one that took
        any of it answers whatever happens (nothing is generated twice)."""
        local = None if preset is None or name in self.presets.broken \
            else self._local_model(preset)
        await self.peers.first_reads()   # just started: each peer read once first
        decision = self.peers.route(name, local, chain=chain)   # cache-affine (issue 47)
        for host in decision.candidates:
            if host == LOCAL:
                return None
            self.peers.sent(chain, host)
            try:
                return await self._to_peer(host, request, raw_path, body, name, stream)
            except Unreached as e:
                self.peers.down(host, "a request could not reach it "
                                f"({type(e.cause).__name__})")
        if preset is not None or not self.peers.knows(name):
            return None   # this host's own answer, or no host has such a model (404)
        raise GatewayError(503, public(self.peers.route(name, None).why), UNAVAILABLE,
                           "model_unavailable")

    async def _to_peer(self, host: str, request: web.Request, raw_path: str, body: bytes,
                       name: str, stream: bool) -> web.StreamResponse:
        """The request relayed to peer gateway ``host``: on the route asked (a constant of
        lokid.gateway.routes, never the client's path), with the peer's key and the hop
        mark, never the client's key."""
        route(request.method, raw_path, ENGINE_ROUTES)
        peer = self.peers.states[host].peer
        key = self.peers.key(peer)
        target = peer.url + raw_path + (f"?{request.query_string}" if request.query_string
                                        else "")
        patience = Patience(self.settings.first_byte_timeout, self.settings.stream_idle_timeout)
        assert self.hops is not None
        request[WHERE_KEY], request[PEER_PRESET_KEY] = f"peer:{host}", name   # its usage
        with self.peers.sending(host, name):
            return await relay(self.hops, request, peer.url, body, keep_auth=False,
                               patience=patience, key=key, target=target,
                               what=f"peer gateway {host!r}", hop=HOP_HEADER, stream=stream)

    def _told(self, entries: dict[str, dict[str, Any]]) -> None:
        """What a peer is shown of this host's engines: their slots and the prompt
        prefixes they were last sent (lokid.gateway.peers.told)."""
        told(entries, {n: self.admission.slots(p, "") for n, p in self.presets.presets.items()
                       if p.kind != EXTERNAL and n not in self.presets.broken},
             self.peers.affinity)
        told_too(entries, self.presets, self.peers.affinity, TOLD)   # its replicas' (issue 47)

    def _read_limit(self, raw_path: str) -> int:
        """How much of a body on ``raw_path`` is read (lokid.gateway.prompts): no more
        than the presets here take; ``max_body`` where a peer may take it."""
        if self.peers:
            return self.settings.max_body
        return prompts.read_limit(self.settings.max_body, raw_path, (
            None if p.kind == EXTERNAL else prompts.bound(p.engine_argv)
            for n, p in self.presets.presets.items() if n not in self.presets.broken))

    def _local_model(self, p: Preset) -> Model:
        """This host's view of preset ``p`` for the routing rule."""
        if p.kind == EXTERNAL:
            return Model(READY, kind=EXTERNAL)
        state = UNRESPONSIVE if self.liveness.state(p.name) else p.shown_state
        fits = None
        if state != READY and p.on_demand:
            fits = self.placer.fits(p, self.placer.residents(self.placer.clock()))
        return Model(state, max(p.in_flight, self.placer.own[p.name]), p.on_demand, fits,
                     slots=self.admission.slots(p, ""))   # full: passed over (issue 47)

    async def _props(self, request: web.Request, url: str, key: str | None,
                     patience: Patience) -> web.StreamResponse:
        """GET /props, without what is the server's (lokid.gateway.routes); read whole
        to be parsed, so bounded (MAX_PROPS: 502 beyond). A HEAD asks the engine's GET:
        its Content-Length is then the answer's, without ``model_path`` (aiohttp sends
        no body to a HEAD)."""
        assert self.client is not None
        asked = request.clone(method="GET") if request.method == "HEAD" else request
        response = await relay(self.client, asked, url, b"", keep_auth=False,
                               patience=patience, key=key, what="the engine",
                               whole=MAX_PROPS)
        if not isinstance(response, web.Response) or response.status != 200 \
                or response.body is None:
            return response
        try:
            props = json.loads(bytes(response.body))  # type: ignore[arg-type]
        except ValueError:
            return response
        return web.json_response(public_props(props), status=200)

    async def _scan(self, body: bytes) -> Scan | None:
        """Where the body's model is (lokid.gateway.bodyscan), the event loop served
        between steps of a long walk; None for no body."""
        if not body:
            return None
        try:
            for result in walk(body):
                if result is not None:
                    return result
                await asyncio.sleep(0)
        except BodyError as e:
            raise GatewayError(e.status, str(e), code=e.code) from None
        raise AssertionError("walk() ended without its scan")

    def _engine_key(self, name: str) -> str | None:
        """The preset's own key for its engine (its api_key_file), as its requests get it."""
        preset = self.presets.presets.get(name)
        return read_key(name, preset.key_file) if preset is not None and preset.key_file \
            else None

    def _form(self, raw_path: str, request: web.Request, body: bytes) -> Form | None:
        """The model and stream of a form's body on a form route
        (lokid.gateway.formscan); None for any other body."""
        if raw_path not in FORM_ROUTES or not is_form(request.headers.get("Content-Type", "")):
            return None
        try:
            return scan_form(body, request.headers.get("Content-Type", ""))
        except BodyError as e:
            raise GatewayError(e.status, str(e), code=e.code) from None

    def _model_of(self, request: web.Request, scan: Scan | None,
                  form: Form | None = None) -> str:
        model: Any = form.model if form is not None else scan.model if scan is not None \
            else request.query.get("model")
        if scan is not None and scan.model_kind:
            raise GatewayError(400, f"\"model\" must be a string (a preset's name), not "
                               f"{scan.model_kind[len('not '):]}", code="model_required")
        if model is None or model == "":
            model = self.settings.default_model
        if not isinstance(model, str) or not model:
            known = self.catalog.known(HOP_HEADER not in request.headers,
                                       request.get(IDENTITY_KEY, ANONYMOUS))
            raise GatewayError(400, "which model? give \"model\" in the request (one of "
                               f"{known})",
                               code="model_required")
        return model

def runner_kwargs() -> dict[str, Any]:
    """aiohttp 3.9 made handler cancellation (a client gone cancels its request) an
    option, off by default; 3.8 (Debian 12) knows no such option and cancels no handler
    (its connection_lost only fails the body's reads): there a client gone is noticed
    where the gateway reads or writes, and a request waiting at an engine's gate looks at
    its connection itself (:mod:`lokid.gateway.admission`).
    An idle keep-alive connection is closed after KEEPALIVE by the gateway itself
    (:mod:`lokid.gateway.headtimeout`: Debian's 3.8 and 3.11 arm no timer for a
    connection that never sent a byte); aiohttp's own is set to the same."""
    major, minor = (int(x) for x in aiohttp.__version__.split(".")[:2])
    # auto_decompress=False: the gateway inflates a body itself, bounded
    # (lokid.gateway.body); aiohttp inflated each chunk whole before any bound
    kwargs: dict[str, Any] = {"keepalive_timeout": KEEPALIVE, "auto_decompress": False}
    if (major, minor) >= (3, 9):
        kwargs["handler_cancellation"] = True
    return kwargs


async def start_sites(gateway: Gateway, sockets: Sequence[socket.socket] = (),
                      head_timeout: float = HEAD_TIMEOUT,
                      draining: Draining | None = None) -> web.AppRunner:
    """Serve on ``sockets`` (systemd's, already listening) when given, else bind
    ``settings.listen``; a request whose head does not end in ``head_timeout`` seconds
    is answered 408, a silent or idle connection is closed (:mod:`lokid.gateway.headtimeout`,
    whose bounds ``gateway.connections`` holds). ``draining``: the requests in
    flight counted for a graceful stop (:mod:`lokid.gateway.shutdown`)."""
    app = gateway.app()
    if draining is not None:
        draining.attach(app)
    runner = web.AppRunner(app, access_log=None, **runner_kwargs())
    await runner.setup()
    if not sockets:
        sockets = [socket.create_server((host, port), family=socket.AF_INET6 if ":" in host
                                        else socket.AF_INET, backlog=BACKLOG)
                   for host, port in gateway.settings.listen]
    gateway.connections.head = head_timeout
    for sock in sockets:
        await StoppableSite(runner, sock, gateway.connections).start()
    return runner


def run(main: Coroutine[Any, Any, None]) -> None:
    """``asyncio.run(main)``, on uvloop's event loop where uvloop is installed (Debian's
    python3-uvloop, a Recommends): every chunk of a stream the gateway relays is a read
    and a write of the loop, which uvloop does in C. Without it, asyncio's own loop:
    the same behaviour, a little more CPU per chunk."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(main)
        return
    # the policy, not uvloop.run(): Debian 12's 0.17 has no run(), and Python 3.11's
    # asyncio.run() takes no loop factory
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    try:
        asyncio.run(main)
    finally:
        asyncio.set_event_loop_policy(None)


async def serve(settings: Settings, bus_type: str, bus_address: str | None,
                keys: frozenset[str] | Keyring, sockets: Sequence[socket.socket] = (),
                reread: Callable[[], tuple[Settings, tuple[str, ...]]] | None = None,
                fixed: str = "") -> None:
    """The gateway until SIGTERM or SIGINT; on ``sockets`` when systemd passed them.
    SIGHUP: lokid.toml read again by ``reread`` (:mod:`lokid.gateway.reload`; ``fixed``:
    why ``listen`` is not the file's)."""
    from dbus_fast import BusType

    from ..core.errors import LokiError
    from ..dbus.wire import SafeMessageBus
    from ..host.notify import Notifier

    try:
        bus = await SafeMessageBus(bus_address=bus_address, bus_type=BusType.SYSTEM
                                   if bus_type == "system" else BusType.SESSION).connect()
    except (OSError, ValueError, EOFError) as e:
        raise LokiError(f"the gateway cannot reach the {bus_type} bus: {e}") from None
    presets = Presets(bus)
    await presets.attach()
    gateway = Gateway(settings, presets, keys)

    def drain_of(name: str) -> float | None:
        preset = presets.presets.get(name)
        return preset.drain if preset is not None else None

    draining = Draining(drain_of)
    install_serverlog()   # aiohttp's lines on malformed requests: one a kind, throttled
    runner = await start_sites(gateway, sockets, draining=draining)
    log.info("gateway listening on %s%s", "systemd's sockets " if sockets else "",
             ", ".join(f"{h}:{p}" for h, p in settings.listen))
    notifier = Notifier()
    done = asyncio.Event()

    def asked_to_stop() -> None:
        if done.is_set():
            draining.hurry()   # a second signal: end the requests in flight now
        done.set()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, asked_to_stop)
    reloader = Reloader(gateway, runner, draining, reread, fixed, notifier.send, BACKLOG) \
        if reread is not None else None
    if reloader is not None:   # before READY=1: a reload then would kill the default way
        loop.add_signal_handler(signal.SIGHUP, reloader.asked)
    notifier.send("READY=1")
    try:
        await done.wait()
    finally:
        notifier.send("STOPPING=1", f"STATUS=stopping: {len(draining.flights)} request(s) "
                      "in flight end first")
        if reloader is not None:   # a reload under way ends first, none after
            await reloader.settled()
        # accepting stops, the requests in flight end within their bounds (the presets'
        # drain, capped): then aiohttp's cleanup has nothing left to wait for
        await draining.stop(runner)
        await runner.cleanup()
        bus.disconnect()
