#!/usr/bin/env python3
"""A peer gateway that lies, for scripts/walk_trust.py: a standard-library HTTP server
whose ``GET /v1/models`` answers what the file named on its command line says (read
at each request, so a walk changes it without a restart):

- ``huge``: one model whose entry carries 600 MiB of padding (Content-Length set);
- ``deep``: a listing nested 100,000 lists deep;
- ``many``: 87,000 models, about 4 MiB;
- ``malformed``: a body that is not JSON and names the peer's address;
- ``claim <name>``: one model, ``<name>``, said ready (this host's own preset);
- anything else: one model ``peer-only``, ready.

Any other request is read whole, then the connection is closed without an answer
(a peer that took a request and died). Not a test: the tests have their own stand-in.

    python3 lying_peer.py PORT MODE_FILE
"""

from __future__ import annotations

import http.server
import json
import socketserver
import sys

MIB = 1 << 20


def listing(ids: list[str]) -> bytes:
    return json.dumps({"object": "list", "data": [
        {"id": i, "object": "model", "owned_by": "peer",
         "lokid": {"state": "ready", "in_flight": 0}} for i in ids]}).encode()


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    mode_file = ""

    def log_message(self, *args: object) -> None:
        pass

    def _send(self, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        mode = open(self.mode_file).read().split()
        what = mode[0] if mode else ""
        if what == "huge":
            head = b'{"object":"list","data":[{"id":"huge","pad":"'
            tail = b'"}]}'
            size = 600 * MIB
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(head) + size + len(tail)))
            self.end_headers()
            try:
                self.wfile.write(head)
                chunk = b"a" * MIB
                for _ in range(size // MIB):
                    self.wfile.write(chunk)
                self.wfile.write(tail)
            except OSError:
                pass
        elif what == "deep":
            self._send(b'{"object":"list","data":' + b"[" * 100_000 + b"]" * 100_000 + b"}")
        elif what == "many":
            self._send(listing([f"m{i:05d}-{'x' * 16}" for i in range(87_000)]))
        elif what == "malformed":
            self._send(b"<html>peer at http://10.9.8.7:8000/ broken</html>", "text/html")
        elif what == "claim" and len(mode) > 1:
            self._send(listing([mode[1]]))
        else:
            self._send(listing(["peer-only"]))

    def do_POST(self) -> None:
        n = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(n)
        with open(self.mode_file + ".posts", "a") as f:
            f.write(self.path + "\n")
        self.close_connection = True
        self.connection.shutdown(2)


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True


if __name__ == "__main__":
    Handler.mode_file = sys.argv[2]
    Server(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
