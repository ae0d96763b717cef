"""A stand-in for what answers the gateway (an external API, a peer gateway), run as its
own process: each port it listens on answers in one way, and what it was asked and how
much it sent are kept in files the test reads (issue 45, items 2 and 4).

    python hugeanswer.py RECORD SIZE MODE:PORT [MODE:PORT ...]

Modes, each on its port:

- ``length``: a JSON answer of SIZE bytes with its Content-Length, on one line;
- ``chunked``: the same JSON in chunks, no length (what many APIs send unstreamed);
- ``close``: the request is read whole, and the connection closed a second later with
  no answer (the peer that took a request and died);
- ``ok``: a short JSON answer.

``GET .../v1/models`` answers a lokid listing of one ready model: ``shared`` on the
``close`` and ``ok`` ports (two replicas of one model), ``<mode>-model`` elsewhere. Any
other request is recorded as a line ``MODE METHOD PATH BODY-BYTES`` in RECORD; the
bytes of an answer sent so far go to ``RECORD.<mode>.sent`` each MiB. The JSON answer
is ``{"model": <the request's model>, ..., "pad": "aaa…"}``, written from one reused
buffer: the stand-in's memory stays small whatever SIZE is, and each write waits for
the reader (``drain``), so what it sent is what the gateway took.
"""

from __future__ import annotations

import asyncio
import functools
import json
import sys
from pathlib import Path

BLOCK = 1024 * 1024


def listing(mode: str) -> bytes:
    name = "shared" if mode in ("close", "ok") else f"{mode}-model"
    return json.dumps({"object": "list", "data": [{
        "id": name, "object": "model", "created": 0, "owned_by": "lokid",
        "lokid": {"state": "ready", "on_demand": False, "status": "", "in_flight": 0,
                  "fits": True}}]}).encode()


class Standin:
    def __init__(self, record: Path, size: int):
        self.record, self.size = record, size

    def note(self, line: str) -> None:
        with self.record.open("a") as f:
            f.write(line + "\n")

    def sent(self, mode: str, n: int) -> None:
        path = Path(f"{self.record}.{mode}.sent")
        path.with_suffix(".tmp").write_text(str(n))
        path.with_suffix(".tmp").replace(path)

    async def serve(self, mode: str, reader: asyncio.StreamReader,
                    writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path = lines[0].split(" ")[:2]
                length = 0
                for line in lines[1:]:
                    name, _, value = line.partition(":")
                    if name.strip().lower() == "content-length":
                        length = int(value.strip())
                body = await reader.readexactly(length)
                if method == "GET" and path.endswith("/v1/models"):
                    data = listing(mode)
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                 b"Content-Length: %d\r\n\r\n%b" % (len(data), data))
                    await writer.drain()
                    continue
                self.note(f"{mode} {method} {path} {len(body)}")
                try:
                    model = json.loads(body).get("model", "")
                except ValueError:
                    model = ""
                if mode == "close":
                    await asyncio.sleep(1.0)
                    return
                if mode == "ok":
                    data = json.dumps({"object": "chat.completion", "model": model,
                                       "choices": []}).encode()
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                 b"Content-Length: %d\r\n\r\n%b" % (len(data), data))
                    await writer.drain()
                    continue
                await self.huge(mode, model, writer)
                return
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        finally:
            writer.close()

    async def huge(self, mode: str, model: str, writer: asyncio.StreamWriter) -> None:
        start = b'{"object":"chat.completion","model":%b,"pad":"' % json.dumps(model).encode()
        end = b'"}'
        pad = self.size - len(start) - len(end)
        chunked = mode == "chunked"
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                     + (b"Transfer-Encoding: chunked\r\n" if chunked else
                        b"Content-Length: %d\r\n" % self.size) + b"\r\n")
        block = b"a" * BLOCK
        sent = 0

        async def send(data: bytes) -> None:
            nonlocal sent
            writer.write(b"%x\r\n%b\r\n" % (len(data), data) if chunked else data)
            await writer.drain()
            sent += len(data)
            self.sent(mode, sent)

        await send(start)
        while pad > 0:
            await send(block[:min(pad, BLOCK)])
            pad -= min(pad, BLOCK)
        await send(end)
        if chunked:
            writer.write(b"0\r\n\r\n")
            await writer.drain()


async def main() -> None:
    record, size = Path(sys.argv[1]), int(sys.argv[2])
    standin = Standin(record, size)
    servers = []
    for spec in sys.argv[3:]:
        mode, _, port = spec.partition(":")

        servers.append(await asyncio.start_server(
            functools.partial(standin.serve, mode), "127.0.0.1", int(port)))
    print("ready", flush=True)
    await asyncio.gather(*(s.serve_forever() for s in servers))


if __name__ == "__main__":
    asyncio.run(main())
