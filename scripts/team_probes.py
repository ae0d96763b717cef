#!/usr/bin/env python3
"""A team's clients and an attacker at a keyed gateway, for scripts/walk_team.py, which
runs this inside the Debian 13 container with Debian's python3 and python3-httpx (a
dependency of lokid's package). The keys come in a root-only JSON file, never in argv;
each subcommand prints one JSON line.

    load CONF     8 threads for CONF's seconds: batch (4 threads of long streams to ``a``
                  after the quiet phase), scoped (``a``), claude (/v1/messages to ``a`` with
                  x-api-key), capped (``b``, until its day's budget says 429), leaver
                  (``a``; revoked with ``lokictl keys revoke`` in the middle of a stream at
                  CONF's revoke_at, then asking again until 401). One record per request:
                  status, time to first token, the answer's own prompt/generated tokens
                  (``timings``: prompt_n + cache_n and predicted_n, else ``usage``), whole
    guess CONF    1,000 wrong keys; then the time of a wrong key sharing a real key's
                  first 40 characters vs a random one, interleaved, and a right key's
    routes CONF   the scoped key at ``b`` by every route; the query string's api_key
"""

from __future__ import annotations

import json
import random
import secrets
import statistics
import subprocess
import sys
import threading
import time
from typing import Any

import httpx

PROMPT = [{"role": "user", "content": "Write about the sea and the ships on it"}]


def _ids(answer: dict[str, Any]) -> tuple[int | None, int | None]:
    t = answer.get("timings")
    if isinstance(t, dict) and ("prompt_n" in t or "predicted_n" in t):
        return int(t.get("prompt_n", 0)) + int(t.get("cache_n", 0)), int(t.get("predicted_n", 0))
    u = answer.get("usage")
    if isinstance(u, dict):
        if "input_tokens" in u or "output_tokens" in u:   # Anthropic's: cache reads apart
            return (int(u.get("input_tokens") or 0) + int(u.get("cache_read_input_tokens") or 0)
                    + int(u.get("cache_creation_input_tokens") or 0)), u.get("output_tokens")
        return u.get("prompt_tokens"), u.get("completion_tokens")
    return None, None


def openai(c: httpx.Client, base: str, key: str, model: str, tokens: int, stream: bool,
           long: bool = False, on_first: Any = None) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "max_tokens": tokens, "stream": stream,
                            "messages": PROMPT, "temperature": 0.7}
    if long:
        body["ignore_eos"] = True
    return _send(c, f"{base}/v1/chat/completions", {"Authorization": f"Bearer {key}"}, body,
                 stream, on_first)


def anthropic(c: httpx.Client, base: str, key: str, model: str, tokens: int,
              stream: bool) -> dict[str, Any]:
    body = {"model": model, "max_tokens": tokens, "stream": stream, "messages": PROMPT}
    return _send(c, f"{base}/v1/messages", {"x-api-key": key,
                                            "anthropic-version": "2023-06-01"}, body, stream)


def _send(c: httpx.Client, url: str, headers: dict[str, str], body: dict[str, Any],
          stream: bool, on_first: Any = None) -> dict[str, Any]:
    rec: dict[str, Any] = {"t0": time.time(), "stream": stream, "code": 0, "ttft": None,
                           "prompt": None, "gen": None, "whole": False, "err": "",
                           "m0": time.monotonic()}
    t0 = rec["m0"]
    try:
        with c.stream("POST", url, headers=headers, json=body, timeout=600) as r:
            rec["code"] = r.status_code
            if r.status_code != 200 or not stream:
                text = r.read().decode(errors="replace")
                rec["dur"] = time.monotonic() - t0
                try:
                    answer = json.loads(text)
                except ValueError:
                    answer = {}
                if r.status_code == 200:
                    rec["prompt"], rec["gen"] = _ids(answer)
                    rec["whole"] = True
                else:
                    e = answer.get("error") or {}
                    rec["err"] = f"{e.get('type', '')}/{e.get('code', '')}" \
                        if isinstance(e, dict) else text[:80]
                return rec
            for line in r.iter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    rec["whole"] = True
                    continue
                try:
                    ev = json.loads(data)
                except ValueError:
                    continue
                kind = ev.get("type")
                if rec["ttft"] is None and _has_text(ev):
                    rec["ttft"] = time.monotonic() - t0
                    if on_first:
                        on_first()
                if kind == "message_start":
                    rec["start"] = True
                    rec["prompt"] = _ids({"usage": ev.get("message", {}).get("usage") or {}})[0]
                elif kind == "message_delta":
                    u = ev.get("usage") or {}
                    rec["gen"] = u.get("output_tokens", rec["gen"])
                    if "input_tokens" in u:
                        rec["prompt"] = _ids({"usage": u})[0]
                elif kind == "message_stop":
                    rec["whole"] = True
                elif kind is None:
                    p, g = _ids(ev)
                    if g is not None:
                        rec["prompt"], rec["gen"] = p, g
    except httpx.HTTPError as e:
        rec["err"] = type(e).__name__
    rec["dur"] = time.monotonic() - t0
    return rec


def _has_text(ev: dict[str, Any]) -> bool:
    if ev.get("type") == "content_block_delta":
        return bool((ev.get("delta") or {}).get("text"))
    for ch in ev.get("choices") or []:
        if (ch.get("delta") or {}).get("content"):
            return True
    return False


def load(conf: dict[str, Any]) -> dict[str, Any]:
    base, keys = f"http://127.0.0.1:{conf['port']}", conf["keys"]
    start = time.monotonic()
    end, quiet = start + conf["seconds"], start + conf["quiet"]
    revoke_at = start + conf["revoke_at"]
    records: list[dict[str, Any]] = []
    lock = threading.Lock()
    leaver: dict[str, Any] = {}

    def keep(name: str, rec: dict[str, Any]) -> None:
        rec["key"] = name
        rec["flood"] = rec["m0"] >= quiet
        with lock:
            records.append(rec)

    def batch(i: int) -> None:
        with httpx.Client() as c:
            while time.monotonic() < quiet:
                time.sleep(0.2)
            while time.monotonic() < end:
                keep("batch", openai(c, base, keys["batch"], "a", 160, True, long=True))

    def scoped() -> None:
        rng = random.Random(1)
        with httpx.Client() as c:
            while time.monotonic() < end:
                keep("scoped", openai(c, base, keys["scoped"], "a", 12, rng.random() < 0.8))
                time.sleep(rng.uniform(0.2, 1.0))

    def claude() -> None:
        rng = random.Random(2)
        with httpx.Client() as c:
            while time.monotonic() < end:
                keep("claude", anthropic(c, base, keys["claude"], "a", 12, rng.random() < 0.8))
                time.sleep(rng.uniform(0.2, 1.0))

    def capped() -> None:
        rng = random.Random(3)
        with httpx.Client() as c:
            while time.monotonic() < end:
                keep("capped", openai(c, base, keys["capped"], "b", 24, rng.random() < 0.5))
                time.sleep(rng.uniform(0.5, 1.5))

    def leave() -> None:
        rng = random.Random(4)
        with httpx.Client() as c:
            while time.monotonic() < revoke_at:
                keep("leaver", openai(c, base, keys["leaver"], "a", 12, True))
                time.sleep(rng.uniform(0.2, 1.0))

            def revoke() -> None:
                r = subprocess.run(["lokictl", "keys", "revoke", "leaver"],
                                   capture_output=True, text=True, timeout=60)
                leaver["revoked_at"] = time.monotonic()
                leaver["revoke_rc"] = r.returncode
            rec = openai(c, base, keys["leaver"], "a", 200, True, long=True,
                         on_first=lambda: threading.Thread(target=revoke).start())
            rec["revoked_stream"] = True
            keep("leaver", rec)
            leaver["stream"] = {k: rec[k] for k in ("code", "whole", "gen", "dur")}
            while "revoked_at" not in leaver:
                time.sleep(0.05)
            served_after, first_401 = 0, None
            while time.monotonic() < end:
                r = openai(c, base, keys["leaver"], "a", 4, False)
                keep("leaver", r)
                if r["code"] == 401 and first_401 is None:
                    first_401 = time.monotonic() - leaver["revoked_at"]
                elif r["code"] == 200:
                    served_after += 1
                time.sleep(0.05 if first_401 is None else 2.0)
            leaver["first_401_after_s"] = first_401
            leaver["served_after_revoke_returned"] = served_after

    threads = [threading.Thread(target=batch, args=(i,)) for i in range(4)]
    threads += [threading.Thread(target=f) for f in (scoped, claude, capped, leave)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {"records": records, "leaver": leaver}


def _timed(c: httpx.Client, url: str, key: str) -> tuple[int, float]:
    t0 = time.perf_counter()
    r = c.get(url, headers={"Authorization": f"Bearer {key}"})
    return r.status_code, time.perf_counter() - t0


def guess(conf: dict[str, Any]) -> dict[str, Any]:
    url = f"http://127.0.0.1:{conf['port']}/v1/models"
    real = conf["keys"]["scoped"]
    codes: dict[int, int] = {}
    with httpx.Client() as c:
        for _ in range(1000):
            code, _ = _timed(c, url, "sk-loki-" + secrets.token_urlsafe(32))
            codes[code] = codes.get(code, 0) + 1
        near: list[float] = []
        far: list[float] = []
        right: list[float] = []
        for _ in range(conf.get("pairs", 2000)):
            order = [("near", real[:40] + secrets.token_urlsafe(32)[:len(real) - 40]),
                     ("far", "sk-loki-" + secrets.token_urlsafe(32)[:len(real) - 8])]
            random.shuffle(order)
            for kind, key in order:
                code, took = _timed(c, url, key)
                (near if kind == "near" else far).append(took)
            right.append(_timed(c, url, real)[1])

    def ms(xs: list[float], q: float) -> float:
        return round(sorted(xs)[int(q * (len(xs) - 1))] * 1000, 3)
    halves = [statistics.median(far[0::2]) - statistics.median(far[1::2]),
              statistics.median(near[0::2]) - statistics.median(near[1::2])]
    return {"wrong_codes": codes,
            "near_p50_ms": ms(near, 0.5), "near_p95_ms": ms(near, 0.95),
            "far_p50_ms": ms(far, 0.5), "far_p95_ms": ms(far, 0.95),
            "right_p50_ms": ms(right, 0.5), "right_p95_ms": ms(right, 0.95),
            "near_minus_far_p50_us": round((statistics.median(near)
                                            - statistics.median(far)) * 1e6, 1),
            "noise_same_kind_halves_us": [round(h * 1e6, 1) for h in halves],
            "pairs": len(near)}


def routes(conf: dict[str, Any]) -> dict[str, Any]:
    base, keys = f"http://127.0.0.1:{conf['port']}", conf["keys"]
    k = keys["scoped"]
    bearer = {"Authorization": f"Bearer {k}"}
    chat = {"max_tokens": 4, "messages": PROMPT}
    out: dict[str, Any] = {}
    with httpx.Client(timeout=120) as c:
        def show(r: httpx.Response) -> str:
            return f"{r.status_code} {r.text[:110]}"
        out["chat model b"] = show(c.post(f"{base}/v1/chat/completions", headers=bearer,
                                          json={"model": "b", **chat}))
        out["chat alias gpt-4o-mini"] = show(c.post(f"{base}/v1/chat/completions",
                                                    headers=bearer,
                                                    json={"model": "gpt-4o-mini", **chat}))
        out["completions model b"] = show(c.post(f"{base}/v1/completions", headers=bearer,
                                                 json={"model": "b", "prompt": "x",
                                                       "max_tokens": 4}))
        out["GET /props?model=b"] = show(c.get(f"{base}/props?model=b", headers=bearer))
        out["GET /v1/models/b"] = show(c.get(f"{base}/v1/models/b", headers=bearer))
        out["GET /v1/models/gpt-4o-mini"] = show(c.get(f"{base}/v1/models/gpt-4o-mini",
                                                       headers=bearer))
        out["messages model b (x-api-key)"] = show(c.post(
            f"{base}/v1/messages", headers={"x-api-key": k, "anthropic-version": "2023-06-01"},
            json={"model": "b", **chat}))
        out["embeddings model b"] = show(c.post(f"{base}/v1/embeddings", headers=bearer,
                                                json={"model": "b", "input": "x"}))
        out["GET /v1/models ids"] = [m["id"] for m in c.get(f"{base}/v1/models",
                                                            headers=bearer).json()["data"]]
        out["chat model a (its own)"] = c.post(f"{base}/v1/chat/completions", headers=bearer,
                                               json={"model": "a", **chat}).status_code
        out["query ?api_key= (no header)"] = show(c.post(
            f"{base}/v1/chat/completions?api_key={k}", json={"model": "a", **chat}))
        out["GET /v1/models?api_key="] = c.get(f"{base}/v1/models?api_key={k}").status_code
        for name in ("leaver", "expired"):
            out[f"{name} key"] = show(c.post(f"{base}/v1/chat/completions",
                                             headers={"Authorization": f"Bearer {keys[name]}"},
                                             json={"model": "a", **chat}))
        if "external" in conf:   # claude: a key that may use x
            o = keys["claude"]
            for head in ({"Authorization": f"Bearer {o}"}, {"x-api-key": o},
                         {"Authorization": o}):
                r = c.post(f"{base}/v1/chat/completions", headers=head,
                           json={"model": "x", **chat})
                out[f"external x with {next(iter(head))}"] = r.status_code
    return out


def serve_check(conf: dict[str, Any]) -> dict[str, Any]:
    """A request with the scoped key now (after keys.toml was damaged)."""
    base = f"http://127.0.0.1:{conf['port']}"
    with httpx.Client(timeout=120) as c:
        r = c.post(f"{base}/v1/chat/completions",
                   headers={"Authorization": f"Bearer {conf['keys']['scoped']}"},
                   json={"model": "a", "max_tokens": 4, "messages": PROMPT})
        w = c.get(f"{base}/v1/models", headers={"Authorization": "Bearer sk-loki-wrong"})
    return {"scoped": r.status_code, "wrong": w.status_code}


def capture(port: int, log: str) -> None:
    """An external API on loopback that writes down every header it receives (one JSON
    line a request) and answers a chat completion: what the gateway sends upstream."""
    from http.server import BaseHTTPRequestHandler, HTTPServer

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            with open(log, "a") as f:
                f.write(json.dumps(dict(self.headers.items())) + "\n")
            body = json.dumps({"id": "x", "object": "chat.completion", "model": "x",
                               "choices": [{"index": 0, "finish_reason": "stop",
                                            "message": {"role": "assistant",
                                                        "content": "ok"}}],
                               "usage": {"prompt_tokens": 3, "completion_tokens": 1,
                                         "total_tokens": 4}}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    HTTPServer(("127.0.0.1", port), Handler).serve_forever()


def main() -> int:
    cmd, path = sys.argv[1], sys.argv[2]
    if cmd == "capture":
        capture(int(path), sys.argv[3])
        return 0
    with open(path) as f:
        conf = json.load(f)
    fn = {"load": load, "guess": guess, "routes": routes, "serve": serve_check}[cmd]
    print(json.dumps(fn(conf)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
