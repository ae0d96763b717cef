"""A stand-in for the Hugging Face hub's HTTP API (issue 48), for the model pull's tests.

The hub is the one party of a pull that cannot be had here, so this stands in for it at its
own boundary, a socket: a real HTTP server in a process of its own (the standard library's,
so nothing of lokid's or httpx's is on its side), which a test, or later a real systemd unit
in a container, fetches from as it would from the hub.

    python3 -m tests.support.hubstand --root DIR --port N [--host 127.0.0.1] [--page 1000]
                                      [--token T] [--cdn-base URL]

prints ``ready <port>`` once listening (``--port 0`` picks one). It serves the repositories
``DIR/<org>/<name>/<files…>`` at revision ``main`` only (any other revision is a 404):

- ``GET /api/models/<org>/<name>/tree/main?recursive=true``: the hub's listing, every file
  with ``type``, ``oid``, ``size``, ``path`` and, for ``.gguf`` files, ``lfs`` (``oid``: the
  SHA-256, ``size``, ``pointerSize``), directories as ``type: directory``; more than
  ``--page`` entries are paginated with ``Link: <url>; rel="next"``, as the hub does.
- ``GET|HEAD /<org>/<name>/resolve/main/<path>``: a 302 to ``/_cdn/<org>/<name>/<path>`` on
  this server or on ``--cdn-base`` (a second instance: another origin), with
  ``X-Linked-Etag: "<sha256>"`` and ``X-Linked-Size``, as the hub answers for LFS files.
- ``GET|HEAD /_cdn/<org>/<name>/<path>``: the bytes, with ``Range: bytes=a-`` / ``a-b``
  (206 and ``Content-Range``; 416 past the end), ``Content-Length`` always (unless a fault
  removes it).
- ``--token T``: the API and resolve routes answer 401 without ``Authorization: Bearer T``
  (``/_cdn/`` never asks, as the hub's CDN does not).
- ``GET /_log``: every request so far (method, path, whether it carried Authorization, its
  Range), so a test sees where a token went, whether a request was made at all, and what
  a resume asked for.
- ``POST /_faults`` with a JSON object sets the faults (``{}`` resets them):
  ``cut_after`` (send that many bytes of a body, then close the connection abruptly; once,
  or ``cut_times`` times), ``lie_length`` (add N to Content-Length and to Content-Range's
  total), ``corrupt_at`` (flip the byte at that offset of the file as served), ``status``
  (answer every API and resolve request with that code), ``ignore_range`` (a 200 with the
  whole body whatever the Range), ``extra_bytes`` (send N bytes more than the file has,
  Content-Length still the file's: a server that overruns), ``no_length`` (no
  Content-Length, the body ends with the connection: with ``extra_bytes``, an overrun the
  client sees), ``slow`` (sleep that many ms per 64 KiB sent), ``loop`` (resolve URLs
  redirect to themselves).

Test code: the standard library only. Tests start it with :func:`start_hub`.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import http.server
import json
import os
import selectors
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

BLOCK = 64 << 10
REPO_ROOT = Path(__file__).resolve().parents[2]


class Hub:
    """What the server knows: its options, the faults set now and the request log."""

    def __init__(self, root: Path, page: int, token: str | None, cdn_base: str | None) -> None:
        self.root = root.resolve()
        self.page = page
        self.token = token
        self.cdn_base = cdn_base.rstrip("/") if cdn_base else None
        self.lock = threading.Lock()
        self.faults: dict[str, Any] = {}
        self.cuts = 0
        self.log: list[dict[str, Any]] = []
        self.hashes: dict[tuple[str, int, int], str] = {}

    def sha256(self, path: Path) -> str:
        st = path.stat()
        key = (str(path), st.st_size, st.st_mtime_ns)
        with self.lock:
            known = self.hashes.get(key)
        if known is None:
            h = hashlib.sha256()
            with open(path, "rb") as f:
                while data := f.read(1 << 20):
                    h.update(data)
            known = h.hexdigest()
            with self.lock:
                self.hashes[key] = known
        return known

    def fault(self, name: str) -> Any:
        with self.lock:
            return self.faults.get(name)

    def take_cut(self) -> int | None:
        """The bytes to send before cutting this body, or None (and counts the cut)."""
        with self.lock:
            after = self.faults.get("cut_after")
            if after is None or self.cuts >= int(self.faults.get("cut_times", 1)):
                return None
            self.cuts += 1
            return int(after)

    def repo_dir(self, org: str, name: str) -> Path | None:
        for part in (org, name):
            if part in ("", ".", "..") or "/" in part:
                return None
        d = self.root / org / name
        return d if d.is_dir() else None

    def file_in(self, repo: Path, rel: str) -> Path | None:
        parts = rel.split("/")
        if any(p in ("", ".", "..") for p in parts):
            return None
        f = repo.joinpath(*parts).resolve()
        if not f.is_relative_to(repo.resolve()) or not f.is_file():
            return None
        return f

    def entries(self, repo: Path, recursive: bool) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        found = sorted(repo.rglob("*") if recursive else repo.iterdir())
        for p in found:
            rel = p.relative_to(repo).as_posix()
            oid = hashlib.sha1(rel.encode()).hexdigest()   # any hex will do (a git oid)
            if p.is_dir():
                out.append({"type": "directory", "oid": oid, "size": 0, "path": rel})
                continue
            size = p.stat().st_size
            entry: dict[str, Any] = {"type": "file", "oid": oid, "size": size, "path": rel}
            if rel.lower().endswith(".gguf"):
                entry["size"] = size
                entry["lfs"] = {"oid": self.sha256(p), "size": size, "pointerSize": 134}
            out.append(entry)
        return out


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Server

    def log_message(self, format: str, *args: Any) -> None:
        pass   # the log is /_log; stderr stays quiet

    @property
    def hub(self) -> Hub:
        return self.server.hub

    def do_GET(self) -> None:
        self.route(head=False)

    def do_HEAD(self) -> None:
        self.route(head=True)

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        if urllib.parse.urlsplit(self.path).path != "/_faults":
            self.plain(404, "not found")
            return
        try:
            faults = json.loads(body or b"{}")
            assert isinstance(faults, dict)
        except (ValueError, AssertionError):
            self.plain(400, "faults: a JSON object")
            return
        with self.hub.lock:
            self.hub.faults = faults
            self.hub.cuts = 0
        self.answer(200, b'{"ok": true}', "application/json", head=False)

    # --- routing ------------------------------------------------------------------------

    def route(self, head: bool) -> None:
        split = urllib.parse.urlsplit(self.path)
        path = split.path
        if path == "/_log":
            with self.hub.lock:
                data = json.dumps(self.hub.log).encode()
            self.answer(200, data, "application/json", head=head)
            return
        with self.hub.lock:
            self.hub.log.append({"method": self.command, "path": self.path,
                                 "auth": "Authorization" in self.headers,
                                 "range": self.headers.get("Range")})
        segs = [urllib.parse.unquote(s) for s in path.split("/")[1:]]
        if segs[:1] == ["_cdn"] and len(segs) >= 4:
            self.cdn(segs[1], segs[2], "/".join(segs[3:]), head)
            return
        api = segs[:2] == ["api", "models"] and len(segs) == 6 and segs[4] == "tree"
        resolve = len(segs) >= 5 and segs[2] == "resolve"
        if not (api or resolve):
            self.plain(404, "not found")
            return
        status = self.hub.fault("status")
        if status:
            self.plain(int(status), f"fault: status {status}",
                       extra={"Retry-After": "1"} if int(status) == 429 else None)
            return
        token = self.hub.token
        if token and self.headers.get("Authorization") != f"Bearer {token}":
            self.plain(401, "Invalid credentials in Authorization header")
            return
        if api:
            query = urllib.parse.parse_qs(split.query)
            self.tree(segs[2], segs[3], segs[5], query, head)
        else:
            self.resolve(segs[0], segs[1], segs[3], "/".join(segs[4:]), head)

    def tree(self, org: str, name: str, revision: str, query: dict[str, list[str]],
             head: bool) -> None:
        repo = self.hub.repo_dir(org, name)
        if repo is None or revision != "main":
            self.plain(404, "Repository not found" if repo is None else "Revision not found")
            return
        entries = self.hub.entries(repo, query.get("recursive", ["false"])[0] == "true")
        start = int(query.get("cursor", ["0"])[0] or 0)
        page = entries[start:start + self.hub.page]
        extra: dict[str, str] = {}
        if start + self.hub.page < len(entries):
            nq = dict(query)
            nq["cursor"] = [str(start + self.hub.page)]
            here = self.server.server_address
            host = self.headers.get("Host", f"{here[0]!s}:{here[1]}")
            nxt = (f"http://{host}/api/models/{urllib.parse.quote(org)}/"
                   f"{urllib.parse.quote(name)}/tree/main?{urllib.parse.urlencode(nq, True)}")
            extra["Link"] = f'<{nxt}>; rel="next"'
        self.answer(200, json.dumps(page).encode(), "application/json", head=head, extra=extra)

    def resolve(self, org: str, name: str, revision: str, rel: str, head: bool) -> None:
        repo = self.hub.repo_dir(org, name)
        f = self.hub.file_in(repo, rel) if repo is not None and revision == "main" else None
        if f is None:
            self.plain(404, "Entry not found")
            return
        if self.hub.fault("loop"):   # a mirror redirecting to itself
            self.answer(302, b"", "text/plain", head=head, extra={"Location": self.path})
            return
        base = self.hub.cdn_base or f"http://{self.headers.get('Host')}"
        where = "/".join(urllib.parse.quote(s) for s in ["_cdn", org, name, *rel.split("/")])
        extra = {"Location": f"{base}/{where}",
                 "X-Linked-Etag": f'"{self.hub.sha256(f)}"',
                 "X-Linked-Size": str(f.stat().st_size)}
        self.answer(302, b"", "text/plain", head=head, extra=extra)

    # --- the bytes ----------------------------------------------------------------------

    def cdn(self, org: str, name: str, rel: str, head: bool) -> None:
        repo = self.hub.repo_dir(org, name)
        f = self.hub.file_in(repo, rel) if repo is not None else None
        if f is None:
            self.plain(404, "not found")
            return
        total = f.stat().st_size
        start, end, status = 0, total, 200
        rng = self.headers.get("Range")
        if rng and not self.hub.fault("ignore_range"):
            try:
                unit, _, spec = rng.partition("=")
                a, _, b = spec.partition("-")
                assert unit.strip() == "bytes"
                start = int(a)
                end = min(int(b) + 1, total) if b.strip() else total
            except (ValueError, AssertionError):
                self.plain(400, "bad range")
                return
            if start >= total:
                self.answer(416, b"", "text/plain", head=head,
                            extra={"Content-Range": f"bytes */{total}"})
                return
            status = 206
        lie = int(self.hub.fault("lie_length") or 0)
        extra_bytes = int(self.hub.fault("extra_bytes") or 0)
        no_length = bool(self.hub.fault("no_length"))
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("ETag", f'"{self.hub.sha256(f)}"')
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{total + lie}")
        if no_length:
            self.send_header("Connection", "close")
        else:
            self.send_header("Content-Length", str(end - start + lie))
        self.end_headers()
        if head:
            return
        # a body that does not match its head leaves the connection unusable: close it
        if lie or extra_bytes or no_length:
            self.close_connection = True
        self.send_body(f, start, end, extra_bytes)

    def send_body(self, f: Path, start: int, end: int, extra_bytes: int) -> None:
        cut = self.hub.take_cut()
        corrupt = self.hub.fault("corrupt_at")
        slow = float(self.hub.fault("slow") or 0) / 1000
        sent = 0
        with open(f, "rb") as src:
            src.seek(start)
            pos = start
            while pos < end or extra_bytes > 0:
                if pos < end:
                    data = bytearray(src.read(min(BLOCK, end - pos)))
                    if corrupt is not None and pos <= int(corrupt) < pos + len(data):
                        data[int(corrupt) - pos] ^= 0xFF
                else:
                    data = bytearray(b"\xa5" * min(BLOCK, extra_bytes))
                    extra_bytes -= len(data)
                if cut is not None and sent + len(data) >= cut:
                    self.wfile.write(bytes(data[:cut - sent]))
                    self.abort()
                    return
                self.wfile.write(bytes(data))
                sent += len(data)
                pos += len(data)
                if slow:
                    time.sleep(slow)

    def abort(self) -> None:
        """Close the connection mid-body, as a dying server or a cut network does. A FIN,
        not a reset: a reset may drop bytes the client had not read yet, and a test could
        not tell how many it keeps."""
        self.wfile.flush()
        self.close_connection = True
        # rfile and wfile hold the descriptor open past close(): shutdown ends it now
        self.connection.shutdown(socket.SHUT_RDWR)

    # --- plain answers ------------------------------------------------------------------

    def plain(self, status: int, text: str, extra: dict[str, str] | None = None) -> None:
        self.answer(status, json.dumps({"error": text}).encode(), "application/json",
                    head=self.command == "HEAD", extra=extra)

    def answer(self, status: int, body: bytes, ctype: str, *, head: bool,
               extra: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if not head:
            self.wfile.write(body)


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], hub: Hub) -> None:
        self.hub = hub
        super().__init__(address, Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Quiet about a client that went away mid-answer (a pull refusing a head, a
        cut): that is what these tests do; anything else is printed."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="a stand-in for the Hugging Face hub's HTTP API")
    p.add_argument("--root", required=True, type=Path)
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--page", type=int, default=1000)
    p.add_argument("--token")
    p.add_argument("--cdn-base")
    a = p.parse_args(argv)
    server = Server((a.host, a.port), Hub(a.root, a.page, a.token, a.cdn_base))
    print(f"ready {server.server_address[1]}", flush=True)
    server.serve_forever()


# --- for tests ----------------------------------------------------------------------------

def start_hub(root: Path | str, *, token: str | None = None, page: int | None = None,
              cdn_base: str | None = None, host: str = "127.0.0.1"
              ) -> tuple[subprocess.Popen[bytes], str]:
    """The stand-in as a process of its own over ``root``, and its base URL, once it
    listens. The caller stops it (:func:`stop_hub`)."""
    argv = [sys.executable, "-m", "tests.support.hubstand", "--root", str(root),
            "--port", "0", "--host", host]
    if token:
        argv += ["--token", token]
    if page:
        argv += ["--page", str(page)]
    if cdn_base:
        argv += ["--cdn-base", cdn_base]
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    proc = subprocess.Popen(argv, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE,
                            stdin=subprocess.DEVNULL)
    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    line = b""
    if sel.select(timeout=30):
        line = proc.stdout.readline()
    sel.close()
    if not line.startswith(b"ready "):
        stop_hub(proc)
        raise RuntimeError(f"the hub stand-in did not start: {line!r}")
    return proc, f"http://{host}:{int(line.split()[1])}"


def stop_hub(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    if proc.stdout:
        proc.stdout.close()


@contextlib.contextmanager
def hub_running(root: Path | str, **options: Any) -> Iterator[str]:
    """:func:`start_hub` for a ``with`` block: its base URL, the stand-in stopped after."""
    proc, base = start_hub(root, **options)
    try:
        yield base
    finally:
        stop_hub(proc)


def start_in_container(ct: Any, script: str, root: str, port: int, unit: str,
                       token: str | None = None, timeout: float = 30.0) -> str:
    """The stand-in as the transient unit ``unit`` of a systemd container ``ct`` (a
    :class:`support.systemd_harness.Container`, which shares the host's network), run by
    the container's python3 from ``script`` over ``root`` inside it; its base URL once it
    answers (the test sets faults and reads its log from outside)."""
    ct.systemctl("reset-failed", unit, check=False)
    ct.run(["systemd-run", f"--unit={unit}", "--property=Type=exec", "--",
            "/usr/bin/python3", script, "--root", root, "--port", str(port),
            *(["--token", token] if token else [])])
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    while True:
        try:
            requests_log(base)
            return base
        except OSError:   # urllib's URLError is one
            if time.monotonic() > deadline:
                raise AssertionError(f"the hub stand-in {unit} did not answer in "
                                     f"{timeout:.0f} s") from None
            time.sleep(0.2)


def set_faults(base: str, **faults: Any) -> None:
    """Set the stand-in's faults (none: reset them)."""
    req = urllib.request.Request(f"{base}/_faults", data=json.dumps(faults).encode(),
                                 method="POST")
    with urllib.request.urlopen(req, timeout=10) as r:
        r.read()


def requests_log(base: str) -> list[dict[str, Any]]:
    """Every request the stand-in has seen: ``{"method", "path", "auth", "range"}`` each."""
    with urllib.request.urlopen(f"{base}/_log", timeout=10) as r:
        log: list[dict[str, Any]] = json.loads(r.read())
    return log


if __name__ == "__main__":
    main()
