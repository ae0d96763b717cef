#!/usr/bin/env python3
"""What an attacker (and an honest client beside one) does to a gateway, for
scripts/walk_trust.py, which runs this inside the container with Debian's python3
(standard library only). Each subcommand prints one JSON line.

    silent PORT N SECONDS   open N connections that send nothing; every 5 s, how many
                            the gateway closed, and /health's time meanwhile
    malformed PORT N        N requests aiohttp cannot parse, each on its own connection
    health PORT N [HOST]    N sequential GET /health (with that Host): p50, p99, codes
    bomb PORT N MODEL       N concurrent 64 KiB gzip bodies inflating to 62 MiB (under max_body)
    reset PORT N            N requests whose client resets while sending the body
"""

from __future__ import annotations

import gzip
import json
import socket
import sys
import threading
import time


def _get(port: int, path: str, host: str = "127.0.0.1", timeout: float = 10.0
         ) -> tuple[int, float]:
    t0 = time.monotonic()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
                      .encode())
            data = b""
            while True:
                part = s.recv(65536)
                if not part:
                    break
                data += part
        code = int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/") else 0
    except OSError:
        code = 0
    return code, time.monotonic() - t0


def silent(port: int, n: int, seconds: float) -> dict[str, object]:
    socks = []
    refused = 0
    for _ in range(n):
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            s.setblocking(False)
            socks.append(s)
        except OSError:
            refused += 1
    t0 = time.monotonic()
    timeline = []
    while time.monotonic() - t0 < seconds:
        time.sleep(5)
        closed = 0
        for s in socks:
            try:
                if s.recv(1) == b"":
                    closed += 1
            except BlockingIOError:
                pass
            except OSError:
                closed += 1
        code, took = _get(port, "/health")
        timeline.append({"t": round(time.monotonic() - t0), "closed": closed,
                         "health": code, "health_s": round(took, 3)})
        if closed == len(socks):
            break
    for s in socks:
        s.close()
    return {"opened": len(socks), "refused": refused, "timeline": timeline}


def malformed(port: int, n: int) -> dict[str, object]:
    bad = [b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
           b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 64,
           b"GET /\x00 HTTP/1.1\r\n\r\n",
           b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
           b"\r\nzz\r\n"]
    answered = 0
    for i in range(n):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                s.sendall(bad[i % len(bad)])
                if s.recv(100).startswith(b"HTTP/"):
                    answered += 1
        except OSError:
            pass
    code, took = _get(port, "/health")
    return {"sent": n, "answered": answered, "health": code, "health_s": round(took, 3)}


def health(port: int, n: int, host: str) -> dict[str, object]:
    times, codes = [], {}
    for _ in range(n):
        code, took = _get(port, "/health", host)
        times.append(took)
        codes[code] = codes.get(code, 0) + 1
    times.sort()
    return {"n": n, "p50_ms": round(times[n // 2] * 1000, 1),
            "p99_ms": round(times[min(n - 1, int(n * 0.99))] * 1000, 1), "codes": codes}


def bomb(port: int, n: int, model: str) -> dict[str, object]:
    inner = b'{"model": "' + model.encode() + b'", "messages": [{"role": "user", ' \
            b'"content": "' + b"a " * (31 << 20) + b'"}]}'
    body = gzip.compress(inner, 9)
    results: list[tuple[int, float]] = []

    def one() -> None:
        t0 = time.monotonic()
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=600) as s:
                s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                          b"Content-Type: application/json\r\nContent-Encoding: gzip\r\n"
                          b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(body)
                          + body)
                head = s.recv(200)
            code = int(head.split(b" ", 2)[1]) if head.startswith(b"HTTP/") else 0
        except OSError:
            code = 0
        results.append((code, time.monotonic() - t0))
    threads = [threading.Thread(target=one) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {"gzip_bytes": len(body), "inflated_bytes": len(inner),
            "answers": sorted((c, round(s, 1)) for c, s in results)}


def reset(port: int, n: int) -> dict[str, object]:
    for _ in range(n):
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                      b"Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n"
                      b'{"model": "a", "messages": [')
            time.sleep(0.05)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            s.close()
        except OSError:
            pass
    code, took = _get(port, "/health")
    return {"sent": n, "health": code}


if __name__ == "__main__":
    cmd, port = sys.argv[1], int(sys.argv[2])
    if cmd == "silent":
        out = silent(port, int(sys.argv[3]), float(sys.argv[4]))
    elif cmd == "malformed":
        out = malformed(port, int(sys.argv[3]))
    elif cmd == "health":
        out = health(port, int(sys.argv[3]), sys.argv[4] if len(sys.argv) > 4 else "127.0.0.1")
    elif cmd == "bomb":
        out = bomb(port, int(sys.argv[3]), sys.argv[4])
    elif cmd == "reset":
        out = reset(port, int(sys.argv[3]))
    else:
        raise SystemExit(__doc__)
    print(json.dumps(out))
