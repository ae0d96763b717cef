#!/usr/bin/env python3
"""Clients of a preset's replicas, for scripts/walk_replicas.py, which runs this inside the
Debian 13 container with Debian's python3 and python3-httpx (a dependency of lokid's
package). Each subcommand reads a JSON file of settings and writes one JSON document to
the file named after it (the walk starts it as a transient unit and reads the file).

    load CONF OUT    8 threads of multi-turn conversations for CONF's seconds: a shared
                     system prompt, 3 to 6 turns each, streamed and plain by turns; from
                     CONF's ``light`` second on, only thread 0 goes on (the load falls,
                     so the replicas the rise started can go idle). Thread 7 talks to
                     the second preset now and then. One record per request: thread,
                     seconds from the start, preset, streamed, status, error, whether the
                     answer came whole.
    kill CONF OUT    6 long streams at once (distinct conversations, so they spread over
                     the replicas); the walk kills one replica meanwhile. For each: its
                     status, whole or not, the last event it read; for each cut one, its
                     next turn (plain) and the status it got.
    names CONF OUT   replica-shaped model names at the gateway: each one's status and
                     error.
"""

from __future__ import annotations

import json
import os
import random
import sys
import threading
import time
from typing import Any

import httpx

# the test model's tokens are bytes: this prompt is ~170 tokens, a 6-turn conversation
# ~700, within a slot's 1,024 after the walk's edit (ctx 2048, -np 2)
SYSTEM = ("You are a careful assistant for a ship's crew. Answer in plain words, name the "
          "parts of the ship you mean, and keep the log of the watch in order.")
ASKS = ("What does the bosun check at dawn?", "Describe the engine room at night.",
        "How is a sail mended at sea?", "Write the log of a calm watch.",
        "What happens when fog comes in?", "List the duties of the cook.")


def chat(c: httpx.Client, base: str, model: str, messages: list[dict[str, str]],
         tokens: int, stream: bool) -> dict[str, Any]:
    """One chat completion: its record, and the answer's text under ``text``."""
    body: dict[str, Any] = {"model": model, "messages": messages, "max_tokens": tokens,
                            "stream": stream, "temperature": 0.7, "ignore_eos": True}
    rec: dict[str, Any] = {"model": model, "stream": stream, "code": 0, "err": "",
                           "whole": False, "text": "", "last": ""}
    t0 = time.monotonic()
    try:
        with c.stream("POST", f"{base}/v1/chat/completions", json=body, timeout=600) as r:
            rec["code"] = r.status_code
            if r.status_code != 200 or not stream:
                raw = r.read().decode(errors="replace")
                try:
                    answer = json.loads(raw)
                except ValueError:
                    answer = {}
                if r.status_code == 200:
                    rec["whole"] = True
                    rec["text"] = answer["choices"][0]["message"]["content"] or ""
                else:
                    e = answer.get("error") if isinstance(answer, dict) else None
                    rec["err"] = (f"{e.get('type', '')}/{e.get('code', '')}: "
                                  f"{str(e.get('message', ''))[:100]}"
                                  if isinstance(e, dict) else raw[:120])
                return rec
            parts = []
            for line in r.iter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                rec["last"] = data[:300]
                if data == "[DONE]":
                    rec["whole"] = True
                    continue
                try:
                    ev = json.loads(data)
                except ValueError:
                    continue
                if "error" in ev:
                    rec["err"] = f"error event: {json.dumps(ev['error'])[:160]}"
                for ch in ev.get("choices") or []:
                    parts.append((ch.get("delta") or {}).get("content") or "")
            rec["text"] = "".join(parts)
    except httpx.HTTPError as e:
        rec["err"] = type(e).__name__
    finally:
        rec["dur"] = round(time.monotonic() - t0, 3)
    return rec


def load(conf: dict[str, Any]) -> dict[str, Any]:
    base = f"http://127.0.0.1:{conf['port']}"
    start = time.monotonic()
    end, light = start + conf["seconds"], start + conf.get("light", conf["seconds"])
    records: list[dict[str, Any]] = []
    lock = threading.Lock()

    def worker(i: int) -> None:
        rng = random.Random(i)
        with httpx.Client() as c:
            while time.monotonic() < end:
                if i and time.monotonic() >= light:
                    return
                model = conf["second"] if i == 7 and rng.random() < 0.3 else conf["preset"]
                messages = [{"role": "system", "content": SYSTEM + f" Crew member {i}."}]
                for turn in range(rng.randint(3, 6)):
                    if time.monotonic() >= end or (i and time.monotonic() >= light):
                        return
                    messages.append({"role": "user", "content": rng.choice(ASKS)})
                    stream = (turn + i) % 2 == 0
                    m0 = time.monotonic() - start
                    rec = chat(c, base, model, messages, rng.randint(16, 64), stream)
                    messages.append({"role": "assistant", "content": rec.pop("text")})
                    rec.update(thread=i, t=round(m0, 2), turn=turn)
                    rec.pop("last")
                    with lock:
                        records.append(rec)
                    time.sleep(rng.uniform(0.05, 0.4) if i else rng.uniform(1.0, 3.0))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {"records": records}


def kill(conf: dict[str, Any]) -> dict[str, Any]:
    base = f"http://127.0.0.1:{conf['port']}"
    out: list[dict[str, Any]] = []
    lock = threading.Lock()

    def one(i: int) -> None:
        messages = [{"role": "system", "content": f"Stream {i}: " + SYSTEM},
                    {"role": "user", "content": ASKS[i % len(ASKS)]}]
        with httpx.Client() as c:
            rec = chat(c, base, conf["preset"], messages, conf.get("tokens", 200), True)
            rec["i"] = i
            if not rec["whole"]:
                messages.append({"role": "assistant", "content": rec["text"]})
                messages.append({"role": "user", "content": "Go on."})
                nxt = chat(c, base, conf["preset"], messages, 16, False)
                rec["next"] = {k: nxt[k] for k in ("code", "err", "whole", "dur")}
            rec["chars"] = len(rec.pop("text"))
            with lock:
                out.append(rec)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
        time.sleep(0.2)
    for t in threads:
        t.join()
    return {"streams": sorted(out, key=lambda r: r["i"])}


def names(conf: dict[str, Any]) -> dict[str, Any]:
    base = f"http://127.0.0.1:{conf['port']}"
    p = conf["preset"]
    out: dict[str, Any] = {}
    with httpx.Client(timeout=120) as c:
        for model in (f"{p}:2", f"{p}:1", f"{p}:0", f"../{p}:2", f"{p}:02", f"{p}:99",
                      f"{p}%3A2", f"{p}/../{p}:2", f"{p}:2\n"):
            r = chat(c, base, model, [{"role": "user", "content": "hi"}], 4, False)
            out[repr(model)] = f"{r['code']} {r['err'][:90]}"
        for path in (f"/v1/models/{p}:2", f"/props?model={p}:2", f"/slots?model={p}:2"):
            r2 = c.get(base + path)
            out[f"GET {path}"] = f"{r2.status_code} {r2.text[:90]}"
    return out


def main() -> int:
    cmd, path, dest = sys.argv[1], sys.argv[2], sys.argv[3]
    with open(path) as f:
        conf = json.load(f)
    fn = {"load": load, "kill": kill, "names": names}[cmd]
    result = fn(conf)
    with open(dest + ".part", "w") as f:
        json.dump(result, f)
    os.replace(dest + ".part", dest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
