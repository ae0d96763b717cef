#!/usr/bin/env python3
"""A team's clients at work on one OpenAI endpoint: the load of issue 28's walks.

Copied into the system under test and run there with its own python3 (the standard
library only: no package of the host needed). ``--threads`` client threads, each on
one keep-alive connection, send chat completions one after the other until
``--seconds`` have passed; each request picks its preset at random by weight
(``--models alpha:3,beta:3,hot:1,remote:1``) and is a stream one time in two. With
``--long MODEL:TOKENS@T``, one more request, a stream of TOKENS, starts T seconds in
(the stream a gateway restart meets) and writes ``--long-started`` once its first
events have arrived.

Each request is recorded: its preset, whether it streamed, when it was sent, its
status, how long it took, and for a stream whether it ended as a stream should (a
``finish_reason`` and ``data: [DONE]``); a stream that stopped before is *cut*, and an
``error`` event in it is kept with its words. A request on a reused connection that
got no byte back (the server closed the idle connection as the request left) is sent
again once on a new connection, as HTTP clients do, and counted as *retried*; every
other fault is a failure. The records go to ``--out`` as JSON.
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import threading
import time
from typing import Any

NO_BYTE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError)


def parse_models(text: str) -> tuple[list[str], list[float]]:
    names, weights = [], []
    for part in text.split(","):
        name, _, weight = part.partition(":")
        names.append(name)
        weights.append(float(weight or 1))
    return names, weights


class Client:
    def __init__(self, port: int, timeout: float) -> None:
        self.port = port
        self.timeout = timeout
        self.conn: http.client.HTTPConnection | None = None
        self.used = False   # the connection has carried a request already

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
        self.conn, self.used = None, False

    def send(self, body: dict[str, Any]) -> http.client.HTTPResponse:
        for attempt in (1, 2):
            if self.conn is None:
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port,
                                                       timeout=self.timeout)
            reused = self.used
            try:
                self.conn.request("POST", "/v1/chat/completions", json.dumps(body),
                                  {"Content-Type": "application/json"})
                self.used = True
                return self.conn.getresponse()
            except NO_BYTE:
                self.close()
                if not reused or attempt == 2:
                    raise
                body["_retried"] = True
        raise AssertionError("unreachable")

    def one(self, model: str, stream: bool, tokens: int, text: str,
            started: threading.Event | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"model": model, "stream": stream, "max_tokens": tokens,
                                "temperature": 0,
                                "messages": [{"role": "user", "content": text}]}
        if started is not None:
            body["ignore_eos"] = True
        rec: dict[str, Any] = {"model": model, "stream": stream, "sent": time.time()}
        t0 = time.monotonic()
        try:
            r = self.send(body)
            rec["retried"] = bool(body.pop("_retried", False))
            rec["status"] = r.status
            if r.status != 200:
                rec["error"] = r.read()[:400].decode("utf-8", "replace")
            elif stream:
                events, finish, done = 0, None, False
                for line in r:
                    if line.startswith(b"data: [DONE]"):
                        done = True
                    elif line.startswith(b"data: "):
                        event = json.loads(line[6:])
                        events += 1
                        if "error" in event:
                            rec["error"] = json.dumps(event["error"])[:400]
                        choices = event.get("choices") or []
                        if choices and choices[0].get("finish_reason"):
                            finish = choices[0]["finish_reason"]
                        if started is not None and events == 5:
                            started.set()
                rec.update(events=events, finish=finish, cut=not (done and finish))
            else:
                answer = json.loads(r.read())
                rec["finish"] = answer["choices"][0]["finish_reason"]
                rec["tokens"] = answer.get("usage", {}).get("completion_tokens")
            if r.getheader("Connection", "").lower() == "close" or r.will_close:
                self.close()
        except Exception as e:   # a failure of the endpoint, recorded with its words
            rec["status"] = rec.get("status", 0)
            rec["error"] = f"{type(e).__name__}: {e}"[:400]
            if rec.get("stream") and rec["status"] == 200:
                rec["cut"] = True
            self.close()
        rec["took"] = time.monotonic() - t0
        return rec


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--seconds", type=float, default=180)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--models", default="alpha:3,beta:3,hot:1,remote:1")
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--seed", type=int, default=28)
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--long", default="", help="MODEL:TOKENS@SECONDS")
    ap.add_argument("--long-started", default="/tmp/long-started")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    names, weights = parse_models(args.models)
    records: list[dict[str, Any]] = []
    lock = threading.Lock()
    start = time.monotonic()
    end = start + args.seconds

    def worker(i: int) -> None:
        rnd = random.Random(args.seed * 1000 + i)
        client = Client(args.port, args.timeout)
        n = 0
        while time.monotonic() < end:
            model = rnd.choices(names, weights)[0]
            rec = client.one(model, rnd.random() < 0.5, args.tokens, f"Hello {i}.{n}")
            rec["thread"] = i
            with lock:
                records.append(rec)
            n += 1
        client.close()

    long_rec: dict[str, Any] = {}

    def long_stream() -> None:
        spec, _, at = args.long.partition("@")
        model, _, tokens = spec.partition(":")
        time.sleep(max(0.0, start + float(at) - time.monotonic()))
        started = threading.Event()
        watcher = threading.Thread(target=lambda: started.wait(args.timeout) and
                                   open(args.long_started, "w").write("streaming"))
        watcher.start()
        client = Client(args.port, args.timeout)
        long_rec.update(client.one(model, True, int(tokens), "Once upon a time", started))
        started.set()
        client.close()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(args.threads)]
    if args.long:
        threads.append(threading.Thread(target=long_stream))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with open(args.out, "w") as f:
        json.dump({"records": records, "long": long_rec,
                   "seconds": time.monotonic() - start}, f)


if __name__ == "__main__":
    main()
