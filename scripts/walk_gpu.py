#!/usr/bin/env python3
"""An operator's walk of a GPU host (issue 44) from the Debian package, printed.

Not a test (tests/packaging/test_deb_gpu.py asserts each rule): what an operator sees,
step by step, on a Debian 13 container booted with real systemd, lokid's .deb installed
by apt beside Debian's python3-pynvml and the stand-in NVIDIA driver package
(tests/support/debgpu.py: its NVML library and setuid nvidia-modprobe, with device nodes
made at boot by loki-gpu-nodes.service). Two GPUs: GPU0 small (350 MiB, 100 of them the
driver's reserve: room for one of the 140 MiB presets ``a`` and ``b``), GPU1 large with
another user's 5,000 MiB; ``[placement] host_memory = 140M``, below what ``c`` needs on
the host alone (~164 MiB) but above its share beside a GPU (~32 MiB). All three are
on-demand presets behind the gateway.

1. the install: its time, loki-gpu-nodes' line, ``lokictl devices``;
2. a, b, c, a through the gateway: the gateway's placement starts, evicts by GPU0's
   memory, and says why;
3. a team's load: 8 client threads over a, b and c for ``--seconds``, with journald's
   default rate limits (the harness's own turns them off) and the gateway's count of
   answers per preset (Stats' gateway_requests) against the clients';
4. the unhappy steps: loki-gpu-nodes restarted ten times, an engine restarted ten times
   then asked, a start stopped while it loads five times then asked, a broken preset
   beside the good ones;
5. a reboot: the nodes made again, the devices read again, a request served;
6. a host whose driver's nodes are gone: what lokictl, lokid plan and a request say.

    .venv/bin/python scripts/walk_gpu.py [--seconds 120]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from support.debgpu import ENGINE, MODEL_DIR, SUITE, boot, driver_deb, nodes  # noqa: E402
from support.debpkg import cached_build  # noqa: E402
from support.driverstandin import Gpu  # noqa: E402
from support.enginekit import free_port  # noqa: E402
from support.models import write_llama  # noqa: E402
from support.systemd_harness import Container  # noqa: E402

GPUS = [Gpu(0, total=350, reserved=100, name="NVIDIA L4"),
        Gpu(1, total=24000, reserved=300, used=5000, processes=((999999, 5000),),
            name="NVIDIA L4")]
PRESETS = {"a": ("a.gguf", "[0]"), "b": ("b.gguf", "[0]"), "c": ("c.gguf", "[1]")}


def say(text: str) -> None:
    print(text, flush=True)


def run(ct: Container, *argv: str, timeout: float = 180) -> str:
    r = ct.run(list(argv), check=False, timeout=timeout)
    return (r.stdout + r.stderr).rstrip()


def chat(ct: Container, port: int, model: str, tokens: int = 8) -> tuple[int, float, str]:
    body = json.dumps({"model": model, "max_tokens": tokens, "temperature": 0,
                       "messages": [{"role": "user", "content": "Hello"}]})
    t0 = time.monotonic()
    r = ct.run(["curl", "-s", "-o", "/dev/stdout", "-w", "\n%{http_code}", "-m", "180",
                "-H", "Content-Type: application/json", "-d", body,
                f"http://127.0.0.1:{port}/v1/chat/completions"], check=False, timeout=190)
    text, _, code = r.stdout.rpartition("\n")
    return (int(code) if code.isdigit() else 0), time.monotonic() - t0, text


def answered(ct: Container) -> dict[str, int]:
    """The gateway's answers per status code over a, b and c since the daemon started
    (each preset's Stats, gateway_requests)."""
    total: dict[str, int] = {}
    for name in PRESETS:
        stats = json.loads(run(ct, "lokictl", "stats", name, "--json") or "{}")
        for code, n in (stats.get("gateway_requests") or {}).items():
            total[code] = total.get(code, 0) + int(n)
    return total


def placement_lines(ct: Container, cursor: str) -> str:
    out = run(ct, "journalctl", "--no-pager", "-q", "-o", "cat", "--after-cursor", cursor,
              "-u", "loki-gateway.service", "-u", "lokid.service")
    keep = [line for line in out.splitlines()
            if any(w in line for w in ("evict", "placing", "GPU", "waits", "refus"))]
    return "\n".join(keep[-20:]) or "(no placement line)"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=120)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        b = cached_build(SUITE, work / "deb")
        if b.rc != 0:
            say(b.log[-4000:])
            return 1
        models = {}
        for name, (file, _) in PRESETS.items():   # ~100 MB of weights each
            models[file] = write_llama(work / file, n_layers=6, n_embd=512, n_head=8,
                                       n_head_kv=8, n_ff=2048, seed=ord(name))
        t0 = time.monotonic()
        ct = boot(b, driver_deb(work / "driver"), GPUS, models)
        try:
            say(f"=== 1. install (driver, python3-pynvml, lokid by apt): "
                f"{time.monotonic() - t0:.0f} s with the boot ===")
            say(run(ct, "journalctl", "-u", "loki-gpu-nodes.service", "-o", "cat",
                    "--no-pager", "-q"))
            say(f"nodes: {nodes(ct)}")
            port = free_port()
            ct.write_file("/etc/loki/lokid.toml",
                          f'engine = "{ENGINE}/llama-server"\nmodel_dirs = ["{MODEL_DIR}"]\n'
                          f'[gateway]\nlisten = ["127.0.0.1:{port}"]\n'
                          '[placement]\nhost_memory = "140M"\n')
            for name, (file, gpus) in PRESETS.items():
                ct.write_file(f"/etc/loki/presets/{name}.toml",
                              f'model = "{file}"\nctx = 2048\ngpus = {gpus}\n'
                              f"port = {free_port()}\n[serve]\non_demand = true\n")
            ct.systemctl("daemon-reload")
            ct.systemctl("restart", "lokid.service", timeout=120)
            ct.systemctl("start", "loki-gateway.socket", "sockets.target")
            time.sleep(2)
            say("$ lokictl devices\n" + run(ct, "lokictl", "devices"))
            say("$ lokictl presets\n" + run(ct, "lokictl", "presets"))

            say("\n=== 2. a, b, c, a through the gateway ===")
            for name in ("a", "b", "c", "a"):
                cursor = run(ct, "journalctl", "-n", "0", "--show-cursor", "-q").split()[-1]
                code, took, text = chat(ct, port, name)
                say(f"\n$ request {name}: {code} in {took:.1f} s"
                    + ("" if code == 200 else f": {text[:300]}"))
                say(placement_lines(ct, cursor))
                say(run(ct, "lokictl", "top", "--once"))

            say(f"\n=== 3. 8 client threads over a, b, c for {args.seconds:.0f} s, "
                "journald's default rate limits ===")
            run(ct, "rm", "-f", "/etc/systemd/journald.conf.d/lokid-harness.conf")
            run(ct, "systemctl", "restart", "systemd-journald.service")
            time.sleep(3)
            before = answered(ct)
            counts: dict[str, int] = {}
            waits: list[float] = []
            lock = threading.Lock()
            stop = threading.Event()

            def client(seed: int) -> None:
                rng = random.Random(seed)
                while not stop.is_set():
                    name = rng.choices(list(PRESETS), [3, 2, 4])[0]
                    code, took, _ = chat(ct, port, name, rng.randint(4, 24))
                    with lock:
                        counts[str(code)] = counts.get(str(code), 0) + 1
                        waits.append(took)
            threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
            for t in threads:
                t.start()
            begun = time.monotonic()
            while time.monotonic() - begun < args.seconds:
                time.sleep(min(40.0, args.seconds / 3))
                say(f"\n$ lokictl top --once   ({time.monotonic() - begun:.0f} s in)")
                say(run(ct, "lokictl", "top", "--once"))
            stop.set()
            for t in threads:
                t.join()
            waits.sort()
            say(f"\nanswers by status: {counts}; request time p50 "
                f"{waits[len(waits) // 2]:.2f} s, p95 {waits[int(len(waits) * 0.95)]:.2f} s, "
                f"max {waits[-1]:.2f} s")
            evictions = run(ct, "sh", "-c", "journalctl -u loki-gateway.service -o cat "
                            "--no-pager -q | grep -c -i evict || true")
            say(f"gateway lines naming an eviction: {evictions}")
            time.sleep(3)   # the gateway reports its counts to the daemon once a second
            after = answered(ct)
            counted = {k: after.get(k, 0) - before.get(k, 0) for k in after}
            say(f"the gateway's count (Stats gateway_requests, over a, b, c): {counted}; "
                f"the clients': {counts}")
            dropped = run(ct, "sh", "-c", "journalctl -b -o cat --no-pager -q "
                          "-u systemd-journald | grep -c 'Suppressed' || true")
            say(f"journald lines saying it suppressed messages: {dropped}")

            say("\n=== 4. the unhappy steps ===")
            for _ in range(10):
                run(ct, "systemctl", "restart", "loki-gpu-nodes.service")
            say("loki-gpu-nodes restarted 10 times: " + run(
                ct, "systemctl", "show", "-p", "ActiveState", "-p", "Result", "-p",
                "NRestarts", "loki-gpu-nodes.service").replace("\n", " ")
                + f"; nodes {nodes(ct)}")
            for _ in range(10):
                run(ct, "systemctl", "restart", "loki-engine@c.service")
            code, took, _ = chat(ct, port, "c")
            say(f"loki-engine@c restarted 10 times, then a request: {code} in {took:.1f} s; "
                + run(ct, "systemctl", "show", "-p", "ActiveState", "-p", "NRestarts",
                      "loki-engine@c.service").replace("\n", " "))
            for _ in range(5):
                run(ct, "systemctl", "start", "--no-block", "loki-engine@b.service")
                time.sleep(0.3)
                run(ct, "systemctl", "stop", "loki-engine@b.service")
            say("b started and stopped while loading, 5 times: " + run(
                ct, "systemctl", "show", "-p", "ActiveState", "-p", "Result",
                "loki-engine@b.service").replace("\n", " "))
            code, took, _ = chat(ct, port, "b")
            say(f"then a request to b: {code} in {took:.1f} s")
            good = run(ct, "cat", "/etc/loki/presets/a.toml") + "\n"
            ct.write_file("/etc/loki/presets/a.toml", good + "ctx = [\n")
            say("$ lokictl reload (a.toml broken)\n" + run(ct, "lokictl", "reload"))
            for name in ("a", "b", "c"):
                code, took, text = chat(ct, port, name)
                say(f"request {name}: {code} in {took:.1f} s"
                    + ("" if code == 200 else f": {text[:300]}"))
            say("$ lokictl presets\n" + run(ct, "lokictl", "presets"))
            ct.write_file("/etc/loki/presets/a.toml", good)
            run(ct, "lokictl", "reload")

            say("\n=== 5. a reboot ===")
            ct.reboot()
            say(f"nodes after the boot: {nodes(ct)}")
            say(run(ct, "systemctl", "show", "-p", "ActiveEnterTimestampMonotonic",
                    "loki-gpu-nodes.service", "lokid.service"))
            ct.systemctl("start", "loki-gateway.socket")
            time.sleep(2)
            say("$ lokictl devices\n" + run(ct, "lokictl", "devices"))
            code, took, text = chat(ct, port, "c")
            say(f"request c: {code} in {took:.1f} s" + ("" if code == 200 else f": {text[:300]}"))

            say("\n=== 6. the driver's nodes gone (a host whose driver is not loaded) ===")
            run(ct, "sh", "-c", "systemctl stop 'loki-engine@*'; rm -f /dev/nvidia*")
            ct.systemctl("restart", "lokid.service", timeout=120)
            time.sleep(2)
            say("$ lokictl devices\n" + run(ct, "lokictl", "devices"))
            say("$ lokid plan c\n" + run(ct, "lokid", "plan", "c"))
            code, took, text = chat(ct, port, "c")
            say(f"request c: {code} in {took:.1f} s" + ("" if code == 200 else f": {text[:300]}"))
        finally:
            ct.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
