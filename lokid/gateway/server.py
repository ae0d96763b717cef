"""``lokid gateway``: the HTTP routes, the client keys, and the process around them.

aiohttp parses HTTP (no parser of ours). Routes:

- ``GET /health``: the gateway answers (200), and says whether lokid is reachable;
- ``GET /v1/models`` (and ``/models``, ``/v1/models/<id>``): every preset, running or
  not, in OpenAI's shape, its state under ``lokid`` (``external`` for an API elsewhere,
  its status then whether the daemon saw it answer);
- a request for an external preset goes to its ``url`` with its ``upstream_model`` and
  its key (:mod:`lokid.gateway.upstream`): no start, no group;
- anything else goes to an engine, chosen by the JSON body's ``model`` (a request
  without a body, such as ``GET /props``, by ``?model=``), or ``default_model``.

Refusals, in OpenAI's error shape: a body that is not a JSON object (400), no model and
no ``default_model`` (400), a model no preset has (404, naming the known ones), a body
over ``max_body`` (413, before it is read whole), a missing or wrong key when
``api_keys_file`` is set (401; ``/health`` needs none), a head that does not end in
time (408, :mod:`lokid.gateway.headtimeout`).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import signal
import socket
from collections.abc import Coroutine, Sequence
from typing import Any

import aiohttp
from aiohttp import web

from ..core.external import EXTERNAL
from .groups import Groups
from .headtimeout import HEAD_TIMEOUT, Connections
from .ondemand import Starter
from .presets import Presets
from .relay import relay, session
from .replies import UNAVAILABLE, GatewayError, model_entry
from .report import PRESET_KEY, Report
from .settings import Settings
from .shutdown import Draining, StoppableSite
from .slots import SlotCache
from .upstream import external_target, read_key, with_model

log = logging.getLogger("lokid.gateway")

KNOWN_SHOWN = 20   # models named in a 404, at most
KEEPALIVE = 75.0   # seconds an idle keep-alive connection stays open (aiohttp 3.8's, nginx's)
BACKLOG = 1024     # connections waiting to be accepted (a burst of clients, not refused)
MODELS_PATHS = ("/v1/models", "/models")


class Gateway:
    def __init__(self, settings: Settings, presets: Presets, keys: frozenset[str] = frozenset()):
        self.settings = settings
        self.presets = presets
        self.starter = Starter(presets)
        self.groups = Groups(presets, self.starter,
                             slots=SlotCache(lambda: self.client, self._engine_key))
        self.keys = tuple(k.encode() for k in keys)
        self.client: aiohttp.ClientSession | None = None
        self.report = Report(presets.bus, self.groups)   # requests and swaps, to lokid
        self.connections = Connections()   # each with its head's deadline

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.settings.max_body + 1,
                              middlewares=[self.connections.middleware,
                                           self.report.middleware])
        app.router.add_route("*", "/{tail:.*}", self.handle)
        app.on_startup.append(self._open)
        app.on_cleanup.append(self._close)
        return app

    async def _open(self, _app: web.Application) -> None:
        self.client = session()
        self.report.start()

    async def _close(self, _app: web.Application) -> None:
        await self.report.stop()
        if self.client is not None:
            await self.client.close()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        try:
            return await self._route(request)
        except GatewayError as e:
            headers = {"WWW-Authenticate": "Bearer"} if e.status == 401 else None
            return web.json_response(e.body(), status=e.status, headers=headers)

    async def _route(self, request: web.Request) -> web.StreamResponse:
        path = request.path
        if path == "/health" and request.method == "GET":
            return web.json_response({"status": "ok",
                                      "lokid": self.presets.unreachable or "reachable"})
        self._check_key(request)
        if request.method == "GET" and (path in MODELS_PATHS or path.startswith("/v1/models/")):
            return self._models(path)
        body = await self._body(request)
        name = self._model_of(request, body)
        preset = self.presets.presets.get(name)
        if preset is None or name in self.presets.broken:
            raise self._unknown(name)
        request[PRESET_KEY] = name   # counted by its answer's status (lokid.gateway.report)
        assert self.client is not None
        # the preset's own key, never the client's (lokid.gateway.upstream)
        key = read_key(name, preset.key_file) if preset.key_file else None
        if preset.kind == EXTERNAL:   # an API elsewhere: no start, no group
            return await relay(self.client, request, preset.upstream,
                               with_model(body, preset.upstream_model), keep_auth=False,
                               key=key, target=external_target(name, preset.upstream,
                                                               request.path,
                                                               request.query_string),
                               what=f"preset {name!r} (the external API at {preset.upstream})")
        async with self.groups.turn(preset) as url:   # its group's turn, its engine started
            return await relay(self.client, request, url, body, keep_auth=not self.keys,
                               key=key)

    def _engine_key(self, name: str) -> str | None:
        """The preset's own key for its engine (its api_key_file), as its requests get it."""
        preset = self.presets.presets.get(name)
        return read_key(name, preset.key_file) if preset is not None and preset.key_file \
            else None

    def _check_key(self, request: web.Request) -> None:
        if not self.keys:
            return
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        token = given.strip().encode()
        # compare_digest against every key: the time taken says nothing of which matched
        if scheme.lower() != "bearer" or not sum(hmac.compare_digest(token, k)
                                                 for k in self.keys):
            raise GatewayError(401, "a valid API key is required: send `Authorization: "
                               "Bearer <key>`", "authentication_error", "invalid_api_key")

    def _models(self, path: str) -> web.Response:
        broken = self.presets.broken
        entries = {name: model_entry(name, "broken", p.on_demand, broken[name])
                   if name in broken else model_entry(name, EXTERNAL, False, p.reachable)
                   if p.kind == EXTERNAL else model_entry(name, p.state, p.on_demand, p.status)
                   for name, p in sorted(self.presets.presets.items())}
        if path.startswith("/v1/models/"):
            name = path[len("/v1/models/"):]
            if name not in entries:
                raise self._unknown(name)
            return web.json_response(entries[name])
        return web.json_response({"object": "list", "data": list(entries.values())})

    async def _body(self, request: web.Request) -> bytes:
        limit = self.settings.max_body
        too_big = GatewayError(413, f"the request body is over the gateway's max_body "
                               f"({limit} bytes)", code="request_too_large")
        if request.content_length is not None and request.content_length > limit:
            raise too_big
        parts: list[bytes] = []
        size = 0
        async for chunk in request.content.iter_any():
            size += len(chunk)
            if size > limit:
                raise too_big
            parts.append(chunk)
        return b"".join(parts)

    def _model_of(self, request: web.Request, body: bytes) -> str:
        model: Any = None
        if body:
            try:
                data = json.loads(body)
            except (ValueError, UnicodeDecodeError) as e:
                raise GatewayError(400, f"the request body is not valid JSON: {e}",
                                   code="invalid_json") from None
            if not isinstance(data, dict):
                raise GatewayError(400, "the request body must be a JSON object",
                                   code="invalid_json")
            model = data.get("model")
        else:
            model = request.query.get("model")
        if model is None or model == "":
            model = self.settings.default_model
        if not isinstance(model, str) or not model:
            raise GatewayError(400, "which model? give \"model\" in the request (one of "
                               f"{self._known()})", code="model_required")
        return model

    def _known(self) -> str:
        names = sorted(self.presets.presets)
        shown = ", ".join(names[:KNOWN_SHOWN]) + (", ..." if len(names) > KNOWN_SHOWN else "")
        return shown or "none: lokid has no preset"

    def _unknown(self, name: str) -> GatewayError:
        if self.presets.unreachable and not self.presets.presets:
            return GatewayError(503, self.presets.unreachable, UNAVAILABLE, "lokid_unreachable")
        shown = name if len(name) <= 64 else name[:64] + "..."
        if name in self.presets.broken:
            return GatewayError(503, f"preset {shown!r} is broken: {self.presets.broken[name]}",
                                UNAVAILABLE, "model_broken")
        return GatewayError(404, f"no model {shown!r}: the known ones are {self._known()}",
                            code="model_not_found")


def runner_kwargs() -> dict[str, Any]:
    """aiohttp 3.9 made handler cancellation (a client gone cancels its request) an
    option, off by default; 3.8 (Debian 12) always cancels and knows no such option.
    An idle keep-alive connection is closed after KEEPALIVE in both (3.14's default is
    an hour: a thousand idle clients would hold their sockets that long)."""
    major, minor = (int(x) for x in aiohttp.__version__.split(".")[:2])
    kwargs: dict[str, Any] = {"keepalive_timeout": KEEPALIVE}
    if (major, minor) >= (3, 9):
        kwargs["handler_cancellation"] = True
    return kwargs


async def start_sites(gateway: Gateway, sockets: Sequence[socket.socket] = (),
                      head_timeout: float = HEAD_TIMEOUT,
                      draining: Draining | None = None) -> web.AppRunner:
    """Serve on ``sockets`` (systemd's, already listening) when given, else bind
    ``settings.listen``; a request whose head does not end in ``head_timeout`` seconds
    is answered 408 (:mod:`lokid.gateway.headtimeout`). ``draining``: the requests in
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
    for sock in sockets:
        await StoppableSite(runner, sock, head_timeout, gateway.connections).start()
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
                keys: frozenset[str], sockets: Sequence[socket.socket] = ()) -> None:
    """The gateway until SIGTERM or SIGINT; on ``sockets`` when systemd passed them."""
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
    runner = await start_sites(gateway, sockets, draining=draining)
    log.info("gateway listening on %s%s", "systemd's sockets " if sockets else "",
             ", ".join(f"{h}:{p}" for h, p in settings.listen))
    notifier = Notifier()
    notifier.send("READY=1")
    done = asyncio.Event()

    def asked_to_stop() -> None:
        if done.is_set():
            draining.hurry()   # a second signal: end the requests in flight now
        done.set()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, asked_to_stop)
    try:
        await done.wait()
    finally:
        notifier.send("STOPPING=1", f"STATUS=stopping: {len(draining.flights)} request(s) "
                      "in flight end first")
        # accepting stops, the requests in flight end within their bounds (the presets'
        # drain, capped): then aiohttp's cleanup has nothing left to wait for
        await draining.stop(runner)
        await runner.cleanup()
        bus.disconnect()
