#!/usr/bin/env python3
"""``lokid gateway`` with a timestamp at each step of a request's path, for finding where
its time goes (issue 47, item 3); not a benchmark itself, and nothing of it is in lokid.

Run as the gateway's command head (``gateway_process(..., head=(python, this file))``):
it wraps a few of the gateway's functions from outside (nothing in lokid changes), then
runs ``lokid.cli``. Each request that carries ``X-Trace: <id>`` gets
``time.perf_counter_ns()`` (CLOCK_MONOTONIC: the same clock as its client's, in another
process) and the gateway thread's CPU time (``cpu_<step>``) at:

- ``in``: the first middleware (aiohttp parsed its head, its task runs);
- ``body``: its body read; ``scan``: its model found; ``turn``: its group's turn and
  engine (:meth:`lokid.gateway.silence.Liveness.check` follows it); ``gate``: its slot
  (:class:`lokid.gateway.admission.Gate`);
- ``opening``: the tunnel's connect begins; ``connect``: its connection to the engine
  made; ``sent``: the request written;
- ``head``: the engine's first bytes read; ``first``: the first part carried to the
  client (after the answer's head); ``out``: the handler returned.

It also counts the streams' reads from the engine and those that held exactly one whole
chunk (carried as they are). At the gateway's exit (SIGTERM) the records go to
``$LOKID_TRACE`` as JSON lines; with
``LOKID_PROFILE`` set, a cProfile of the whole run goes to that file too.
"""

from __future__ import annotations

import atexit
import contextvars
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

RECORDS: list[dict[str, Any]] = []
CHUNKS = {"reads": 0, "one": 0}   # a stream's reads, and those that were one whole chunk
CURRENT: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "trace", default=None)
now = time.perf_counter_ns


def stamp(name: str, record: dict[str, Any] | None = None) -> None:
    record = record if record is not None else CURRENT.get()
    if record is not None and name not in record:
        record[name] = now()
        record["cpu_" + name] = time.thread_time_ns()


def install() -> None:
    from aiohttp import web

    from lokid.gateway import admission, server, silence, tunnel

    srv: Any = server   # names they import, replaced in their namespace
    tun: Any = tunnel
    gateway: Any = server.Gateway   # classes whose methods are wrapped
    engine: Any = tunnel._Engine
    liveness: Any = silence.Liveness
    gate: Any = admission.Gate

    app = gateway.app

    def traced_app(self: Any) -> Any:
        application = app(self)

        @web.middleware
        async def first(request: web.Request, handler: Any) -> Any:
            trace = request.headers.get("X-Trace")
            if trace is None:
                return await handler(request)
            record = {"id": trace, "in": now(), "cpu_in": time.thread_time_ns()}
            RECORDS.append(record)
            CURRENT.set(record)
            try:
                return await handler(request)
            finally:
                stamp("out", record)

        application.middlewares.insert(0, first)
        return application

    gateway.app = traced_app

    read_body = srv.read_body

    async def traced_read_body(*args: Any, **kwargs: Any) -> Any:
        body = await read_body(*args, **kwargs)
        stamp("body")
        return body

    srv.read_body = traced_read_body
    scan = gateway._scan

    async def traced_scan(self: Any, body: bytes) -> Any:
        result = await scan(self, body)
        stamp("scan")
        return result

    gateway._scan = traced_scan
    check = liveness.check

    async def traced_check(self: Any, name: str, url: str) -> None:
        stamp("turn")
        await check(self, name, url)

    liveness.check = traced_check
    enter = gate.__aenter__

    async def traced_enter(self: Any) -> None:
        await enter(self)
        stamp("gate")

    gate.__aenter__ = traced_enter
    open_engine = tun.open_engine

    async def traced_open(*args: Any, **kwargs: Any) -> Any:
        stamp("opening")
        got = await open_engine(*args, **kwargs)
        stamp("connect")
        return got

    tun.open_engine = traced_open
    head = tunnel.request_head

    def traced_head(*args: Any, **kwargs: Any) -> bytes:
        out = head(*args, **kwargs)
        stamp("sent")   # written at once after: transport.write(head + body)
        return out

    tun.request_head = traced_head
    engine_init = engine.__init__

    def traced_init(self: Any, *args: Any, **kwargs: Any) -> None:
        engine_init(self, *args, **kwargs)
        self._trace = CURRENT.get()

    engine.__init__ = traced_init
    received = engine.data_received

    def traced_received(self: Any, data: bytes) -> None:
        stamp("head", self._trace)
        received(self, data)

    engine.data_received = traced_received
    carry_part = engine._carry

    def traced_carry(self: Any, data: bytes) -> None:
        carry_part(self, data)
        stamp("first", self._trace)

    engine._carry = traced_carry
    one_chunk = tunnel._one_chunk

    def counted_one_chunk(data: bytes) -> int:
        begins = one_chunk(data)
        CHUNKS["reads"] += 1
        CHUNKS["one"] += bool(begins)
        return begins

    tun._one_chunk = counted_one_chunk


def dump() -> None:
    out = os.environ.get("LOKID_TRACE")
    if out:
        with open(out, "w") as f:
            for r in RECORDS:
                f.write(json.dumps(r) + "\n")
            f.write(json.dumps({"id": "_chunks", **CHUNKS}) + "\n")


def main() -> None:
    install()
    atexit.register(dump)
    profile = os.environ.get("LOKID_PROFILE")
    from lokid.cli import main as cli_main

    sys.argv = ["lokid", *sys.argv[1:]]
    if profile:
        import cProfile

        profiler = cProfile.Profile()
        atexit.register(lambda: profiler.dump_stats(profile))
        profiler.enable()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    sys.exit(cli_main())


if __name__ == "__main__":
    main()
