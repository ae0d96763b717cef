#!/usr/bin/env python3
"""An operator's walk of the fleet (issue 30, "done when") under real systemd, printed.

Not a test (tests/fleet asserts each rule): what a team sees through one URL while an
operator works on the hosts behind it. Three booted Debian 12 containers on a private
bridge (support.fleetkit), lokid installed from its real .deb (``dpkg -i``), each
gateway peered with the two others; all presets on demand, the tiny generated model:

    a: alpha, shared      b: beta, shared      c: gamma, shared

``--threads`` clients (8) ask host a only, for ``--seconds`` (180), the four models in
turn, every other request streamed. Meanwhile, at fixed points of the run:

1. ``lokictl unload shared`` on a (its requests go to b and c meanwhile);
2. host b rebooted (``systemctl reboot``): beta has no other host, so it is 503
   naming b until b is back; shared goes to a and c;
3. c's gateway restarted five times, a's daemon three times;
4. beta's engine on b stopped while it loads, three times;
5. a broken preset written on c beside its good ones, and asked for through a.

At the end: per phase and model, the requests, those answered, and every failure by
kind; the failures the design expects (beta while b is down) apart from the others.

    .venv/bin/python scripts/walk_fleet.py [--seconds 180] [--threads 8]
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
from support.debpkg import build_in_container  # noqa: E402
from support.fleetkit import FleetHost, fleet, headers  # noqa: E402
from support.modelset import Models  # noqa: E402
from support.systemd_harness import PACKAGES  # noqa: E402

ON_DEMAND = 'model = "llama.gguf"\n[serve]\non_demand = true\n'
SERVES = {"a": ("alpha", "shared"), "b": ("beta", "shared"), "c": ("gamma", "shared")}
MODELS = ("alpha", "beta", "gamma", "shared")


class Load:
    """``threads`` clients asking ``url`` in turn for each model until stopped; each
    answer as (start, model, streamed, outcome, seconds), outcome "ok" or what failed."""

    def __init__(self, url: str, threads: int):
        self.url, self.threads = url, threads
        self.stop = threading.Event()
        self.results: list[tuple[float, str, bool, str, float]] = []
        self.lock = threading.Lock()
        self.turn = itertools.count()

    def start(self) -> None:
        self.workers = [threading.Thread(target=self.run, daemon=True)
                        for _ in range(self.threads)]
        for w in self.workers:
            w.start()

    def join(self) -> None:
        self.stop.set()
        for w in self.workers:
            w.join(300)

    def run(self) -> None:
        with httpx.Client(headers=headers(), timeout=httpx.Timeout(300, connect=10)) as c:
            while not self.stop.is_set():
                n = next(self.turn)
                model, streamed = MODELS[n % len(MODELS)], n % 2 == 1
                t0 = time.monotonic()
                outcome = self.one(c, model, streamed)
                with self.lock:
                    self.results.append((t0, model, streamed, outcome,
                                         time.monotonic() - t0))
                if outcome != "ok":
                    time.sleep(0.5)   # as a client backs off after an error

    def one(self, c: httpx.Client, model: str, streamed: bool) -> str:
        body = {"model": model, "max_tokens": 16, "temperature": 0, "stream": streamed,
                "messages": [{"role": "user", "content": "Hello"}]}
        try:
            with c.stream("POST", self.url + "/v1/chat/completions", json=body) as r:
                if r.status_code != 200:
                    r.read()
                    try:
                        error = r.json()["error"]
                        return f"{r.status_code} {error.get('code')}: {error['message'][:90]}"
                    except (ValueError, KeyError, TypeError):
                        return f"{r.status_code}: {r.text[:90]}"
                if not streamed:
                    r.read()
                    return "ok" if r.json().get("choices") else "no choices"
                last = ""
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        last = line[6:]
                        if '"error"' in last:
                            return "error event: " + last[:90]
                return "ok" if last == "[DONE]" else "stream cut"
        except httpx.HTTPError as e:
            return f"{type(e).__name__}"


def persist_address(h: FleetHost) -> None:
    """The host's address configured by systemd-networkd, so a reboot keeps it (the
    fleet kit adds it by hand, which a reboot forgets)."""
    h.ct.write_file("/etc/systemd/network/10-host0.network",
                    f"[Match]\nName=host0\n[Network]\nAddress={h.address}/24\n"
                    "LinkLocalAddressing=no\n")
    h.ct.systemctl("enable", "systemd-networkd.service", check=False)


def say(text: str) -> None:
    print(text, flush=True)


def lokictl(h: FleetHost, *args: str) -> str:
    r = h.ct.run(["lokictl", *args], check=False, timeout=300)
    return (r.stdout + r.stderr).strip()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=180)
    ap.add_argument("--threads", type=int, default=8)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="walk-fleet-"))
    models = Models(work / "models")
    (work / "models").mkdir()
    say("building the .deb (bookworm)…")
    build = build_in_container("bookworm", work / "deb")
    if build.rc != 0:
        say(build.log[-4000:])
        return 1
    with fleet(("a", "b", "c"), [models.llama], (*PACKAGES, "openssh-server"),
               deb=build.deb) as hosts:
        a, b, c = hosts["a"], hosts["b"], hosts["c"]
        for name, h in hosts.items():
            persist_address(h)
            h.gateway([p for p in hosts.values() if p is not h],
                      {preset: ON_DEMAND for preset in SERVES[name]})
        deadline = time.monotonic() + 120
        while True:
            r = httpx.get(a.url + "/v1/models", headers=headers(), timeout=30)
            listed = {m["id"] for m in r.json().get("data", [])} if r.status_code == 200 \
                else set()
            if set(MODELS) <= listed:
                break
            if time.monotonic() > deadline:
                say(f"a does not list every model: {r.text[:500]}")
                return 1
            time.sleep(1)
        say(f"=== a lists {sorted(listed)}; {args.threads} clients on {a.url} for "
            f"{args.seconds:.0f} s ===")
        load = Load(a.url, args.threads)
        began = time.monotonic()
        marks: list[tuple[float, str]] = [(0.0, "steady")]
        load.start()

        def at(fraction: float, what: str) -> None:
            wait = began + args.seconds * fraction - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            marks.append((time.monotonic() - began, what))
            say(f"\n--- {time.monotonic() - began:6.1f} s: {what}")

        at(1 / 7, "lokictl unload shared on a")
        t = time.monotonic()
        say(lokictl(a, "unload", "shared", "--timeout", "300"))
        say(f"(the unload took {time.monotonic() - t:.1f} s)")

        at(2 / 7, "host b rebooted")
        t = time.monotonic()
        b.ct.reboot(timeout=120)
        if b.address not in b.ct.run(["ip", "-4", "addr", "show", "host0"]).stdout:
            say("(networkd did not configure host0: the address added by hand)")
            b.ct.run(["ip", "addr", "add", f"{b.address}/24", "dev", "host0"], check=False)
            b.ct.run(["ip", "link", "set", "host0", "up"], check=False)
        say(f"b booted again in {time.monotonic() - t:.1f} s; its gateway socket: "
            + b.ct.run(["systemctl", "is-active", "loki-gateway.socket"],
                       check=False).stdout.strip())
        marks.append((time.monotonic() - began, "b back"))

        at(3 / 7, "c's gateway restarted 5 times, a's daemon 3 times")
        for i in range(5):
            c.ct.systemctl("restart", "loki-gateway.service", timeout=120)
            if i < 3:
                a.ct.systemctl("restart", "lokid.service", timeout=120)
            time.sleep(2)

        at(4 / 7, "beta's engine on b stopped while it loads, 3 times")
        for _ in range(3):   # the clients' next request for beta starts it again
            b.ct.systemctl("start", "--no-block", "loki-engine@beta.service")
            time.sleep(0.3)
            done = b.ct.systemctl("stop", "loki-engine@beta.service", timeout=120,
                                  check=False)
            say(f"systemctl stop while loading: exit {done.returncode} {done.stderr.strip()}")
            time.sleep(2)

        at(5 / 7, "a broken preset on c beside its good ones")
        c.system.write_preset_text("broken", 'model = "absent.gguf"\n', reload=False)
        say(lokictl(c, "reload"))
        time.sleep(3)
        r = httpx.post(a.url + "/v1/chat/completions", headers=headers(), timeout=60,
                       json={"model": "broken", "messages": [{"role": "user",
                                                              "content": "Hi"}]})
        say(f"broken through a: {r.status_code} {r.text[:300]}")

        at(1.0, "end")
        load.join()
        report(load.results, marks, began)
        say("\n=== lokictl presets on each host ===")
        for h in hosts.values():
            say(f"--- {h.name}\n{lokictl(h, 'presets')}")
    return 0


def report(results: list[tuple[float, str, bool, str, float]],
           marks: list[tuple[float, str]], began: float) -> None:
    """Per phase and model: requests, answered, and the failures by kind."""
    say("\n=== what the clients saw, phase by phase ===")
    edges = [m[0] for m in marks] + [float("inf")]
    total = collections.Counter[str]()
    unexpected: list[str] = []
    for i, (start, what) in enumerate(marks):
        # by when each request ended: a failure belongs to what happened then
        inside = [r for r in results if start <= r[0] + r[4] - began < edges[i + 1]]
        if not inside:
            continue
        say(f"\n{what} ({start:.0f} s on): {len(inside)} requests")
        for model in MODELS:
            mine = [r for r in inside if r[1] == model]
            ok = [r for r in mine if r[3] == "ok"]
            fails = collections.Counter(r[3] for r in mine if r[3] != "ok")
            p50 = statistics.median(r[4] for r in ok) * 1000 if ok else 0
            say(f"  {model:7} {len(ok):5}/{len(mine):<5} answered, p50 {p50:7.0f} ms"
                + "".join(f"\n           {n} × {kind}" for kind, n in fails.most_common()))
            for kind, n in fails.items():
                total[why(model, what, kind)] += n
                if why(model, what, kind) == "unexpected":
                    unexpected.append(f"{what}: {model}: {n} × {kind}")
        total["requests"] += len(inside)
    say(f"\nin all: {total['requests']} requests; failed: {total['down']} as designed (503 "
        f"naming b, beta's only host, while it was down), {total['reboot']} in flight on b "
        f"when it rebooted, {total['stop']} in flight on beta's engine when systemctl "
        f"stopped it (a stop cuts; lokictl unload drains), {total['unexpected']} otherwise")
    for line in unexpected:
        say(f"  {line}")
    say(json.dumps(dict(total)))


def why(model: str, phase: str, kind: str) -> str:
    """Which of the walk's steps explains a failure: down, reboot, stop; or unexpected."""
    if model == "beta" and "b is down" in kind:
        return "down"
    cut = "failed mid-answer" in kind or "did not answer" in kind or kind == "stream cut"
    if model == "beta" and cut and phase == "host b rebooted":
        return "reboot"
    if model == "beta" and cut and phase.startswith("beta's engine on b stopped"):
        return "stop"
    return "unexpected"


if __name__ == "__main__":
    sys.exit(main())
