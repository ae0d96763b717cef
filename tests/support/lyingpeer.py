"""A peer gateway that lies (issue 45, items 2 and 3): a real HTTP server in a process of
its own (the standard library's, so nothing of lokid's or aiohttp's is on its side),
whose ``GET /v1/models`` answers what its mode file says, read at each request so a
test changes it without a restart:

- ``good [NAME...]``: a lokid listing of each NAME ready (default: ``peer-only``);
- ``claim NAME``: NAME ready with nothing in flight (a name this host serves);
- ``alias NAME MODEL``: MODEL ready and NAME its alias, as a lokid gateway lists them
  (issue 46, item 5: ``lokid.alias_of``, capabilities, context length, ``aliases``);
- ``huge``: one entry padded to 600 MiB (Content-Length set), sent as fast as it is read;
- ``endless``: a chunked body that never ends (no Content-Length);
- ``deep``: a listing nested 100,000 lists deep (Python's json gives up at ~1,000);
- ``many``: 87,000 models, some 4 MiB (issue 45's figure);
- ``big``: ``many``'s shape at the most this gateway accepts (``big N`` for N models);
- ``malformed``: an HTML page naming an address;
- ``nothttp``: bytes that are no HTTP answer, naming an address;
- ``badids``: entries whose ids are no model names (an address, markup, 300 characters)
  and one good entry, ``fine``, whose status names an address.

Every other request is read whole, counted in ``MODE_FILE.posts``, and the connection
closed without an answer (a peer that took a request and died).

    python3 lyingpeer.py PORT MODE_FILE [CERT_PEM KEY_PEM]
"""

from __future__ import annotations

import contextlib
import http.server
import json
import socket
import socketserver
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

MIB = 1 << 20
ADDRESS = "http://10.9.8.7:8000"   # what a lie names: must never reach a client
HUGE_HEAD = b'{"object":"list","data":[{"id":"huge","pad":"'
HUGE = len(HUGE_HEAD) + 600 * MIB + 4   # the huge answer's Content-Length


def listing(ids: list[str], state: str = "ready") -> bytes:
    return json.dumps({"object": "list", "data": [
        {"id": i, "object": "model", "owned_by": "peer",
         "lokid": {"state": state, "on_demand": False, "status": "", "in_flight": 0,
                   "fits": True}} for i in ids]}).encode()


def answer(mode: list[str]) -> bytes | None:
    """The body of ``mode`` (None: the modes streamed by the handler)."""
    what = mode[0] if mode else "good"
    if what == "claim":
        return listing(mode[1:2])
    if what == "alias":
        data = json.loads(listing([mode[2], mode[1]]))
        for entry in data["data"]:
            entry["lokid"].update(capabilities=["chat", "completion", "telepathy"],
                                  context_length=8192)
            entry["aliases"] = [mode[1]] if entry["id"] == mode[2] else []
        data["data"][1]["lokid"]["alias_of"] = mode[2]
        return json.dumps(data).encode()
    if what == "deep":
        return b'{"object":"list","data":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    if what == "many":   # as terse as an OpenAI API's: just under 4 MiB
        return json.dumps({"object": "list", "data": [
            {"id": f"m{i:05d}-{'x' * 10}", "object": "model"} for i in range(87_000)]},
            separators=(",", ":")).encode()
    if what == "big":
        return listing([f"m{i:05d}" for i in range(int(mode[1]) if len(mode) > 1 else 1000)])
    if what == "malformed":
        return f"<html>peer at {ADDRESS}/ broken</html>".encode()
    if what == "badids":
        data = json.loads(listing(["fine"]))
        data["data"][0]["lokid"]["status"] = f"see {ADDRESS}/x"
        data["data"] += [{"id": i, "lokid": {"state": "ready"}} for i in
                         (ADDRESS, "<script>alert(1)</script>", "a" * 300, "", 7)]
        return json.dumps(data).encode()
    if what in ("huge", "endless", "nothttp"):
        return None
    return listing(mode[1:] or ["peer-only"])


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    mode_file = ""

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        with open(self.mode_file + ".gets", "a") as f:
            f.write(self.path + "\n")
        mode = Path(self.mode_file).read_text().split()
        body = answer(mode)
        try:
            if body is not None:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            elif mode[0] == "nothttp":
                self.wfile.write(f"SSH-2.0 {ADDRESS} says hello\r\n\x00\x01".encode())
                self.close_connection = True
            else:
                self._stream(mode[0])
        except OSError:   # the gateway stopped reading: what it should do
            self.close_connection = True

    def _stream(self, what: str) -> None:
        head = HUGE_HEAD
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        if what == "huge":
            self.send_header("Content-Length", str(HUGE))
        else:
            self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        chunk = b"a" * MIB
        if what == "huge":
            self.wfile.write(head)
            for _ in range(600):
                self.wfile.write(chunk)
            self.wfile.write(b'"}]}')
            return
        self.wfile.write(b"%x\r\n%s\r\n" % (len(head), head))
        while True:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        with open(self.mode_file + ".posts", "a") as f:
            f.write(self.path + "\n")
        self.close_connection = True
        self.connection.shutdown(socket.SHUT_RDWR)


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True


@dataclass
class LyingPeer:
    url: str
    mode_file: Path

    def say(self, *mode: str) -> None:
        self.mode_file.write_text(" ".join(mode))

    def posts(self) -> list[str]:
        """The paths of the requests other than GET it took (and dropped)."""
        return self._lines("posts")

    def gets(self) -> int:
        """How many GETs it answered."""
        return len(self._lines("gets"))

    def _lines(self, kind: str) -> list[str]:
        path = Path(f"{self.mode_file}.{kind}")
        return path.read_text().splitlines() if path.exists() else []


def self_signed(directory: Path, host: str = "127.0.0.1") -> tuple[Path, Path]:
    """A certificate for ``host`` (and its key), signed by itself: the CA a test trusts."""
    cert, key = directory / "peer.pem", directory / "peer.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2", "-subj",
                    f"/CN={host}", "-addext", f"subjectAltName=IP:{host}",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    return cert, key


@contextlib.contextmanager
def lying_peer(directory: Path, *mode: str, tls: tuple[Path, Path] | None = None
               ) -> Iterator[LyingPeer]:
    """The lying peer in its own process for the block (its URL on 127.0.0.1)."""
    from support.enginekit import free_port

    port = free_port()
    peer = LyingPeer(f"{'https' if tls else 'http'}://127.0.0.1:{port}",
                     directory / "peer.mode")
    peer.say(*(mode or ("good",)))
    argv = [sys.executable, __file__, str(port), str(peer.mode_file)]
    proc = subprocess.Popen(argv + ([str(p) for p in tls] if tls else []))
    try:
        deadline = time.monotonic() + 20
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port),
                                                                        timeout=1):
                break
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("the lying peer did not start")
            time.sleep(0.05)
        yield peer
    finally:
        proc.terminate()
        proc.wait(10)


if __name__ == "__main__":
    Handler.mode_file = sys.argv[2]
    server = Server(("127.0.0.1", int(sys.argv[1])), Handler)
    if len(sys.argv) > 4:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(sys.argv[3], sys.argv[4])
        server.socket = context.wrap_socket(server.socket, server_side=True)
    server.serve_forever()
