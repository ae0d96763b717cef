#!/usr/bin/env python3
"""An operator's walk of placement by memory (issue 29) under real systemd, printed.

Not a test (the tests assert each rule): the steps an operator takes, with what
``lokictl top`` and the journal say at each one, so that a person can read them. In a
booted Debian 12 container, lokid installed with the socket-activated gateway, four
on-demand presets of different sizes and no group (benchmarks/placement_systemd.py's
models; ``m`` has ``gpus = "auto"``, which on this CPU engine chooses nothing and says
so), ``[placement] host_memory`` below their sum:

1. a request to each preset, ``lokictl top --once`` after each;
2. 8 client threads over the four presets for ``--seconds``; ``lokictl top`` read
   while they run (the devices, and why requests wait);
3. ``systemctl restart`` of one engine ten times in a row, then a request;
4. a start stopped while it loads, five times;
5. a broken preset beside the good ones: the others answer, it says why;
6. a preset whose engine cannot allocate its KV cache (``LimitAS=`` in a drop-in, as an
   operator would bound it): the daemon raises its record, cancels systemd's restart,
   and the gateway places the next start by the raised figure; at the second failure
   with all the room, the preset never fits and the gateway answers with the figures.

    .venv/bin/python scripts/walk_placement.py [--seconds 90]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

from placement_systemd import SHAPES, Walk, started  # noqa: E402
from support.enginekit import free_port  # noqa: E402

MiB = 2**20


def chat(walk: Walk, model: str, tokens: int = 8, timeout: float = 180) -> tuple[int, str]:
    """One request through the gateway, from inside the container (its loopback)."""
    body = json.dumps({"model": model, "max_tokens": tokens, "temperature": 0,
                       "messages": [{"role": "user", "content": "Hello"}]})
    r = walk.ct.run(["curl", "-s", "-o", "/dev/stdout", "-w", "\n%{http_code}", "-m",
                     str(int(timeout)), "-H", "Content-Type: application/json", "-d", body,
                     f"http://127.0.0.1:{walk.port}/v1/chat/completions"], check=False,
                    timeout=timeout + 10)
    text, _, code = r.stdout.rpartition("\n")
    return (int(code) if code.isdigit() else 0), text


def step(walk: Walk, title: str) -> None:
    walk.say(f"\n=== {title} ===")


def top(walk: Walk) -> None:
    walk.say(walk.lokictl("top", "--once").rstrip())


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=90)
    ap.add_argument("--steps", default="123456", help="which steps to walk, e.g. 16")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        ct = started(tmp)
        try:
            walk = Walk(ct)
            for name, (_, ctx) in SHAPES.items():
                extra = 'gpus = "auto"\n' if name == "m" else ""
                ct.write_file(f"/etc/loki/presets/{name}.toml",
                              f'model = "{name}.gguf"\nctx = {ctx}\nport = {free_port()}\n'
                              f"{extra}[serve]\non_demand = true\n")
            walk.configure(int(530 * MiB))
            ct.systemctl("daemon-reload")
            ct.systemctl("restart", "lokid.service", timeout=120)
            ct.systemctl("start", "loki-gateway.socket", "sockets.target")
            ct.wait_for("loki-gateway.socket", "active", timeout=60)
            walk.say(walk.lokictl("plan", "m").rstrip())

            if "1" in args.steps:
                step(walk, "1. a request to each preset, lokictl top after each")
                for name in SHAPES:
                    t0 = time.monotonic()
                    code, text = chat(walk, name)
                    walk.say(f"\n$ request {name}: {code} in {time.monotonic() - t0:.1f} s"
                             + ("" if code == 200 else f": {text[:300]}"))
                    top(walk)

            if "2" in args.steps:
                step(walk, f"2. 8 client threads over the four presets for {args.seconds:.0f} s")
                counts: dict[str, int] = {}
                lock = threading.Lock()
                stop = threading.Event()

                def client(seed: int) -> None:
                    import random

                    rng = random.Random(seed)
                    while not stop.is_set():
                        name = rng.choices(list(SHAPES), [4, 3, 2, 1])[0]
                        code, _ = chat(walk, name, rng.randint(4, 24))
                        with lock:
                            counts[str(code)] = counts.get(str(code), 0) + 1
                threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
                for t in threads:
                    t.start()
                t0 = time.monotonic()
                while time.monotonic() - t0 < args.seconds:
                    time.sleep(min(30.0, args.seconds / 3))
                    walk.say(f"\n$ lokictl top --once   ({time.monotonic() - t0:.0f} s in)")
                    top(walk)
                stop.set()
                for t in threads:
                    t.join()
                walk.say(f"\nanswers by status: {counts}")

            if "3" in args.steps:
                step(walk, "3. systemctl restart loki-engine@s ten times, then a request")
                for _ in range(10):
                    ct.run(["systemctl", "restart", "loki-engine@s.service"], check=False,
                           timeout=120)
                code, _ = chat(walk, "s")
                walk.say(f"request s: {code}; " + ct.run(
                    ["systemctl", "show", "-p", "ActiveState", "-p", "NRestarts", "-p", "Result",
                     "loki-engine@s.service"], check=False).stdout.replace("\n", " "))

            if "4" in args.steps:
                step(walk, "4. xl started and stopped while it loads, five times")
                for _ in range(5):
                    ct.run(["systemctl", "start", "--no-block", "loki-engine@xl.service"])
                    time.sleep(0.3)
                    ct.run(["systemctl", "stop", "loki-engine@xl.service"], check=False,
                           timeout=120)
                walk.say(ct.run(["systemctl", "show", "-p", "ActiveState", "-p", "Result",
                                 "loki-engine@xl.service"], check=False).stdout.replace("\n", " "))
                code, _ = chat(walk, "xl")
                walk.say(f"request xl afterwards: {code}")

            if "5" in args.steps:
                step(walk, "5. a broken preset beside the good ones")
                good = ct.run(["cat", "/etc/loki/presets/l.toml"]).stdout
                ct.write_file("/etc/loki/presets/l.toml", good + "ctx = [\n")
                walk.lokictl("reload")
                for name in ("l", "s"):
                    code, text = chat(walk, name)
                    walk.say(f"request {name}: {code}" + ("" if code == 200 else f": {text[:300]}"))
                walk.say(walk.lokictl("presets").rstrip())
                ct.write_file("/etc/loki/presets/l.toml", good)
                walk.lokictl("reload")

            if "6" in args.steps:
                step(walk, "6. an engine that cannot allocate its KV cache (LimitAS=600M)")
                ct.write_file("/etc/loki/presets/big.toml",
                              f'model = "s.gguf"\nctx = 1000000\nport = {free_port()}\n'
                              'extra_args = ["-np", "1"]\n[serve]\non_demand = true\n')
                ct.run(["mkdir", "-p", "/etc/systemd/system/loki-engine@big.service.d"])
                ct.write_file("/etc/systemd/system/loki-engine@big.service.d/limit.conf",
                              "[Service]\nLimitAS=600M\n")
                ct.systemctl("daemon-reload")
                walk.configure(3 * 2**30)   # room for its estimate (1.5 GiB), not its failure
                walk.lokictl("reload")
                walk.say(walk.lokictl("show", "big").rstrip()[:1500])
                cursor = ct.cursor()
                for attempt in range(3):
                    code, text = chat(walk, "big")
                    walk.say(f"request big #{attempt + 1}: {code}: {text[:400]}")
                    time.sleep(8)
                walk.say(ct.journal("lokid.service", since_cursor=cursor).strip()[-3000:])
                walk.say(ct.run(["systemctl", "show", "-p", "ActiveState", "-p", "NRestarts",
                                 "-p", "Result", "loki-engine@big.service"],
                                check=False).stdout.replace("\n", " "))
                plan = ct.run(["env", "PYTHONPATH=/opt/lokid", "python3", "-m", "lokid", "plan",
                               "big"], check=False, timeout=120)
                walk.say(f"$ lokid plan big: exit {plan.returncode}\n{plan.stderr.strip()[-600:]}")
                top(walk)
        finally:
            ct.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
